"""Shape inference on load: fixed input shapes, onnx shape inference on a weightless copy, and
merging what it found into the model's own value_info (inferred over declared)."""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import numpy as np
import onnx

from graphpass.errors import UsageError
from graphpass.ir import fast_import, limits, profiling
from graphpass.ir.graph import graph_protos
from graphpass.ir.validate import _itemsize, _numel

__all__ = ["KEEP_DYNAMIC", "apply_input_shapes", "check_input_shape", "infer_shapes", "input_dims",
           "resolve_input_shapes"]

log = logging.getLogger(__name__)


def check_input_shape(name: str, shape: Sequence[int], inputs: Sequence[str],
                      model_dims: "Sequence[int | None] | None") -> list[int]:
    """The one check of a given input shape (``input_shapes``, ``--input-shape``), for the loader,
    ``verify`` and the specialize_shapes pass: ``name`` must be one of ``inputs``; every dim in
    1..2^31, or -1 (keep this dim dynamic, as Paddle users write it); the rank and every fixed dim
    (``model_dims``: the input's dims, an int where the model fixes it, None where it is symbolic
    or unknown; None for an unknown rank) must agree.

    Returns the shape as ints. Raises UsageError naming ``input_shapes`` (the CLI names the flag).
    """
    def refuse(text: str) -> UsageError:
        return UsageError(f"input_shapes {text}", option="input_shapes")

    if name not in inputs:
        raise refuse(f"names '{name}', which is not a graph input (inputs: {', '.join(inputs) or 'none'})")
    dims = [int(v) for v in shape]
    if model_dims is not None and len(model_dims) != len(dims):
        raise refuse(f"{name}: rank {len(dims)} given, the model's input has rank {len(model_dims)}")
    for k, v in enumerate(dims):
        if v == KEEP_DYNAMIC:
            continue
        if v <= 0:
            raise refuse(f"{name}: dimension {k} must be positive (or -1 to keep it dynamic), got {v}")
        if v > limits.MAX_DIM:
            raise refuse(f"{name}: dimension {k} is {v}, above the limit of 2^31")
        fixed = model_dims[k] if model_dims is not None and k < len(model_dims) else None
        if fixed is not None and fixed > 0 and fixed != v:
            raise refuse(f"{name}: dimension {k} is fixed to {fixed} in the model, got {v}")
    return dims


#: An ``input_shapes`` entry of -1 keeps that dim as the model has it (dynamic).
KEEP_DYNAMIC = -1


def resolve_input_shapes(
    inputs: Mapping[str, "Sequence[int | str | None] | None"],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    already: Mapping[str, int] | None = None,
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """``input_shapes`` and ``dims`` (symbolic dim name -> value) as one shape per input.

    ``inputs``: each graph input's dims (an int where fixed, the symbol's name, None where
    unknown; None for an unknown rank). Returns ``(shapes, fixed)``: ``shapes`` maps every input
    that gets a value to its shape, -1 where a dim stays dynamic; ``fixed`` maps each symbolic
    dim name the run fixes to its value (a dim fixed by ``--input-shape`` on one input holds for
    every input and every tensor that names it, as ``--dim`` does). ``already``: symbols fixed
    before (when the model was loaded); giving one again with the same value is no change.

    Raises:
        UsageError: an input shape :func:`check_input_shape` refuses; a dim name no graph
            input carries; a value outside 1..2^31; the same dim given two values (by ``--dim``
            and ``--input-shape``, or by two inputs' shapes).
    """
    names = list(inputs)
    shapes: dict[str, list[int]] = {}
    for name, shape in (input_shapes or {}).items():
        model_dims = inputs.get(name)
        ints = None if model_dims is None else [d if isinstance(d, int) and not isinstance(d, bool) else None
                                               for d in model_dims]
        shapes[name] = check_input_shape(name, shape, names, ints)
    symbols: dict[str, list[tuple[str, int]]] = {}
    for name, model_dims in inputs.items():
        for k, d in enumerate(model_dims or []):
            if isinstance(d, str) and d:
                symbols.setdefault(d, []).append((name, k))
    fixed: dict[str, int] = {}
    origin: dict[str, str] = {}
    for sym, value in (dims or {}).items():
        if not isinstance(sym, str) or not sym:
            raise UsageError(f"dims: a dim name must be a non-empty string, got {sym!r}", option="dims")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise UsageError(f"dims: '{sym}' must be a positive integer, got {value!r}", option="dims")
        if not 0 < int(value) <= limits.MAX_DIM:
            raise UsageError(f"dims: '{sym}' must be in 1..2^31, got {int(value)}", option="dims")
        if already and sym in already and sym not in symbols:
            if int(value) != already[sym]:
                raise UsageError(f"dims: '{sym}' was fixed to {already[sym]} when the model was loaded, got "
                                 f"{value!r}", option="dims")
            continue
        if sym not in symbols:
            known = ", ".join(sorted(symbols)) or "none: every input dim is fixed or unnamed"
            raise UsageError(f"dims names '{sym}', which is no symbolic dim of a graph input (the inputs' dim names: "
                             f"{known})", option="dims")
        fixed[sym] = int(value)
        origin[sym] = f"the dim '{sym}' is given as {int(value)}"
    for name, shape in shapes.items():  # a symbol an input shape fixes: the same value everywhere
        for k, d in enumerate(inputs.get(name) or []):
            v = shape[k]
            if not isinstance(d, str) or not d or v == KEEP_DYNAMIC:
                continue
            if d in fixed and fixed[d] != v:
                raise UsageError(f"input_shapes {name}: dimension {k} ('{d}') is {v}, but {origin[d]}",
                                 option="input_shapes")
            fixed.setdefault(d, v)
            origin.setdefault(d, f"the shape of input '{name}' sets '{d}' to {v}")
    for sym, value in fixed.items():
        for name, k in symbols.get(sym, []):
            shape = shapes.setdefault(name, [KEEP_DYNAMIC] * len(inputs[name] or []))
            shape[k] = value
    return shapes, fixed


def input_dims(vi: onnx.ValueInfoProto) -> "list[int | str | None] | None":
    """A ValueInfoProto's dims as :func:`resolve_input_shapes` takes them."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def _apply_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None,
                        dims: Mapping[str, int] | None = None) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Fix the main graph's input dims (``input_shapes``, ``dims``: see
    :func:`resolve_input_shapes`) and make every other declared shape agree.

    Specializing makes the exporter's ``value_info`` stale: the value_info of default-domain node
    outputs (in every graph) is dropped, so shape inference is the only source of their shapes
    (a model with exporter value_info then folds exactly as the same model without it), and so
    are the numbers declared on graph outputs of default-domain nodes (inference sizes them
    again); a fixed symbol is replaced by its value in what stays (graph outputs, other
    domains' outputs).
    Returns the input shapes set (-1 where a dim stays dynamic) and the fixed symbols.
    """
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    shapes, fixed = resolve_input_shapes({n: input_dims(vi) for n, vi in inputs.items()}, input_shapes, dims)
    for name, shape in shapes.items():
        tt = inputs[name].type.tensor_type
        old = list(tt.shape.dim) if tt.HasField("shape") else []
        new = onnx.TensorShapeProto()
        for k, v in enumerate(shape):
            d = new.dim.add()
            if v != KEEP_DYNAMIC:
                d.dim_value = v
            elif k < len(old):
                d.CopyFrom(old[k])
        tt.shape.CopyFrom(new)
    if shapes:
        for g in graph_protos(model.graph):
            inferable = {o for n in g.node if n.domain in ("", "ai.onnx") for o in n.output}
            keep = [vi for vi in g.value_info if vi.name not in inferable]
            if len(keep) != len(g.value_info):
                del g.value_info[:]
                g.value_info.extend(keep)
            for vi in list(g.value_info) + list(g.output) + (list(g.input) if g is not model.graph else []):
                _substitute(vi, fixed)
            for vi in g.output:  # a number declared on a standard op's output was traced, not inferred
                if vi.name in inferable and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape") \
                        and any(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim):
                    vi.type.tensor_type.ClearField("shape")
    return shapes, fixed


def _substitute(vi: onnx.ValueInfoProto, fixed: Mapping[str, int]) -> None:
    if not fixed or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_param") and d.dim_param in fixed:
            d.dim_value = fixed[d.dim_param]


def infer_shapes(model: onnx.ModelProto, bodies: bool = True, outputs: "list[str] | None" = None) -> onnx.ModelProto:
    """onnx shape inference (with data propagation) on a copy whose big weights are left out.

    The copy lists each initializer over 1 KiB as a typed graph input instead (a header, no
    bytes), so inference sees its shape without serializing or copying the weights; this also
    keeps models over 2 GB inferable. Symbolic dims keep their names. The model's own
    value_info for outputs of default-domain nodes of the main graph is left out, so inference
    derives those shapes itself instead of trusting them. Inference runs without data
    propagation first; only if that leaves a shape unknown, and data propagation is safe (see
    :func:`_data_prop_safe`: it allocates per element of the 1-D tensors it follows), it runs
    again with it. Where onnx stops, graphpass's own rules (:func:`_own_rules`) add what they
    can tell and inference runs again from there (at most :data:`_OWN_RULE_ROUNDS` times, only
    while a rule adds something). Returns the inferred copy; on failure logs a warning and
    returns ``model`` unchanged. ``bodies=False``: the caller knows no node of ``model`` holds a
    graph (the inferred copy then holds none either: its graphs are not looked for).
    ``outputs``: the output names of the main graph's nodes, in order, when the caller has them
    (the loader, from validation's walk): the nodes are not read again for them.
    """
    return infer_shapes_listed(model, bodies, outputs)[0]


@profiling.timed("shape inference")
def infer_shapes_listed(model: onnx.ModelProto, bodies: bool = True, outputs: "list[str] | None" = None,
                        listed: bool = False) -> "tuple[onnx.ModelProto, list[tuple] | None]":
    """:func:`infer_shapes`, and with ``listed``: the main graph's inferred value infos as the
    import reads them, ``(name, dtype, shape)`` in order (fast_import.tensor_type: gs's dtype, the
    shape as a tuple or None), made by the walk that looks for unknown shapes, when that is all
    inference has to tell: the first inference left no shape unknown, no Slice's length was
    forgotten, every value info is a tensor type the import reads itself and no two share a
    name. Else None (the caller copies the inferred value_info into the model, as before). The
    loader imports from the list instead of copying ~10k value infos into the model and reading
    each one back (10k CNN: ~15 ms)."""
    # onnx serializes what it is given and parses its own copy: given the bytes, the light copy
    # is not held beside them at inference's peak (issue 22); it is parsed again if needed below
    blob = _light_copy(model, bodies).SerializeToString()
    try:
        first = onnx.shape_inference.infer_shapes(blob, check_type=False, strict_mode=False, data_prop=False)
    except Exception as e:  # inference is advisory: passes fall back to unknown shapes
        log.warning("shape inference failed, continuing without inferred shapes: %s", str(e).splitlines()[0])
        return model, None
    unknown, value_infos = _unknown_and_listed(first.graph, outputs, listed)
    if not unknown:
        if _distrust(first, bodies):
            value_infos = None  # a length forgotten after the list was made
        return first, value_infos
    light = onnx.load_from_string(blob)
    del blob
    data_prop = _data_prop_safe(model, first.graph)
    if not data_prop:
        log.info("shape inference without data propagation: the model has a big integer Constant or 1-D tensor")
        result = first
    else:
        try:
            result = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
        except Exception as e:  # noqa: BLE001 - keep what inference without data propagation found
            log.info("shape inference with data propagation failed (%s); using it without", str(e).splitlines()[0])
            result, data_prop = first, False
    for _ in range(_OWN_RULE_ROUNDS):
        extra = _own_rules(light, result.graph)
        if not extra:
            break
        light.graph.value_info.extend(extra)  # onnx starts from them and carries them downstream
        try:
            result = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=data_prop)
        except Exception as e:  # noqa: BLE001 - keep what inference found without the rules
            log.info("shape inference after graphpass's own rules failed (%s)", str(e).splitlines()[0])
            break
    return _distrust_backward_slices(result, bodies), None


def _distrust_backward_slices(model: onnx.ModelProto, bodies: bool = True) -> onnx.ModelProto:
    """Forget the inferred length of a backward Slice to an end (or from a start) past int64's
    half range, and every shape inferred downstream of it: onnx's inference (and the spec) makes
    ``x[-1:INT64_MAX:-1]`` empty where onnxruntime returns the whole axis reversed (measured, 1.32),
    so no pass may fold the length it inferred."""
    _distrust(model, bodies)
    return model


def _distrust(model: onnx.ModelProto, bodies: bool = True) -> int:
    """:func:`_distrust_backward_slices`; returns how many value infos it changed."""
    from graphpass.ir.graph import graph_protos

    changed = 0
    huge = 2 ** 62
    for g in graph_protos(model.graph) if bodies else (model.graph,):
        slices = [n for n in g.node if n.op_type == "Slice" and n.domain in ("", "ai.onnx") and len(n.input) >= 5]
        if not slices:
            continue  # the constants are read only for a graph with a Slice that has steps
        consts = _int_constants(g)
        bad: set[str] = set()
        for n in slices:
            steps, starts, ends = (consts.get(n.input[i]) for i in (4, 1, 2))
            if steps is None or starts is None or ends is None:
                continue
            if any(st < 0 and (abs(e) >= huge or abs(b) >= huge) for st, b, e in zip(steps, starts, ends)):
                bad.add(n.output[0])
        if not bad:
            continue
        for n in g.node:  # downstream, in graph order (topological)
            if any(i in bad for i in n.input):
                bad.update(o for o in n.output if o)
        for vi in g.value_info:
            if vi.name in bad and vi.type.tensor_type.HasField("shape"):
                changed += 1
                for d in vi.type.tensor_type.shape.dim:
                    if d.HasField("dim_value"):
                        d.Clear()  # unknown: neither a number nor a name
    return changed


#: Inference runs again at most this many times after graphpass's own rules added shapes.
_OWN_RULE_ROUNDS = 3


def _known_dim(d: onnx.TensorShapeProto.Dimension) -> bool:
    return d.HasField("dim_value") or (d.HasField("dim_param") and not d.dim_param.startswith("unk__"))


def _int_constants(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Small integer constants of ``graph`` (initializers, Constant nodes) by name, flattened."""
    out: dict[str, list[int]] = {}
    ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    for t in graph.initializer:
        if t.data_type in ints and _numel(t) <= 64:
            out[t.name] = [int(v) for v in onnx.numpy_helper.to_array(t).reshape(-1)]
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR and a.t.data_type in ints \
                        and _numel(a.t) <= 64:
                    out[n.output[0]] = [int(v) for v in onnx.numpy_helper.to_array(a.t).reshape(-1)]
                elif a.name == "value_ints":
                    out[n.output[0]] = [int(v) for v in a.ints]
                elif a.name == "value_int":
                    out[n.output[0]] = [int(a.i)]
    return out


def _own_rules(light: onnx.ModelProto, inferred: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Shapes of main-graph node outputs that onnx's inference left (partly) unknown and
    graphpass's own rules can tell. Each returned entry only adds dims; none contradicts
    inference.

    Rules:
      1. Slice (opset 10+) with constant ``axes`` and bounds onnx cannot read (computed from
         ``Shape``, as ``torch.chunk`` exports): every dim not on a sliced axis is the input's.
    """
    if not any(n.op_type == "Slice" for n in inferred.node):
        return []
    version = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version < 10:
        return []
    known = {vi.name: vi for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output)}
    consts = _int_constants(light.graph)
    extra = []
    for n in inferred.node:
        if n.op_type != "Slice" or n.domain not in ("", "ai.onnx") or len(n.input) < 4 or not n.input[3]:
            continue
        axes = consts.get(n.input[3])
        src, out = known.get(n.input[0]), known.get(n.output[0]) if n.output else None
        if axes is None or src is None or out is None or not src.type.HasField("tensor_type") \
                or not src.type.tensor_type.HasField("shape") or not out.type.HasField("tensor_type"):
            continue
        sdims = src.type.tensor_type.shape.dim
        rank = len(sdims)
        ot = out.type.tensor_type
        if ot.HasField("shape") and len(ot.shape.dim) != rank:
            continue
        if any(not -rank <= a < rank for a in axes):
            continue
        sliced = {a % rank for a in axes}
        new = onnx.ValueInfoProto()
        new.CopyFrom(out)
        if not ot.HasField("shape"):
            for _ in range(rank):
                new.type.tensor_type.shape.dim.add()
        added = False
        for k, (sd, nd) in enumerate(zip(sdims, new.type.tensor_type.shape.dim)):
            if k not in sliced and not _known_dim(nd) and _known_dim(sd):
                nd.CopyFrom(sd)
                added = True
        if added:
            extra.append(new)
    return extra


def _has_unknown_shapes(graph: onnx.GraphProto, outputs: "list[str] | None" = None) -> bool:
    """Some node output of the main graph has no shape, a dim with neither value nor name, or a
    dim named by a symbol no graph input carries (unbound: e.g. the ``N`` a declared output kept
    after ``--input-shape`` fixed the input's ``N`` to 1). ``outputs``: the names of the node
    outputs (``[o for n in graph.node for o in n.output]``) when the caller has them."""
    return _unknown_and_listed(graph, outputs)[0]


def _unknown_and_listed(graph: onnx.GraphProto, outputs: "list[str] | None" = None, listed: bool = False
                        ) -> "tuple[bool, list[tuple] | None]":
    """:func:`_has_unknown_shapes`, and with ``listed`` the value infos of ``graph`` as
    ``(name, dtype, shape)`` (:func:`graphpass.ir.fast_import.tensor_type`), or None when one is
    not a tensor type the import reads itself or two share a name (see :func:`infer_shapes_listed`)."""
    bound = {d.dim_param for vi in graph.input if vi.type.HasField("tensor_type")
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}
    known: dict[str, bool] = {}  # name -> its (last) value info leaves it unknown
    by_type: dict[bytes, bool] = {}  # most values share a few types: each distinct type checked once
    value_infos: "list[tuple] | None" = [] if listed else None
    read: dict[bytes, "tuple | None"] = {}  # a distinct type -> (dtype, shape) as the import reads it
    for vi in graph.value_info:
        ty = vi.type
        key = ty.SerializeToString()
        unknown = by_type.get(key)
        if unknown is None:
            unknown = by_type[key] = _unknown_shape(ty, bound)
        name = vi.name
        known[name] = unknown
        if value_infos is not None:
            typed = read.get(key, False)
            if typed is False:
                typed = read[key] = fast_import.tensor_type(ty)
            if typed is None:
                value_infos = None
            else:
                value_infos.append((name, *typed))
    if value_infos is not None and len(known) != len(value_infos):
        value_infos = None  # a name twice
    for vi in graph.output:
        ty = vi.type
        key = ty.SerializeToString()
        unknown = by_type.get(key)
        if unknown is None:
            unknown = by_type[key] = _unknown_shape(ty, bound)
        known[vi.name] = unknown
    if outputs is None:
        outputs = [o for n in graph.node for o in n.output]
    for o in outputs:
        if o and known.get(o, True):
            return True, None
    return False, value_infos


def _unknown_shape(ty: onnx.TypeProto, bound: set[str]) -> bool:
    """A tensor type without a shape, or with a dim that has neither value nor a bound name
    (onnx names the dims it could not infer unk__N); other types count as known."""
    if not ty.HasField("tensor_type"):
        return False
    tt = ty.tensor_type
    if not tt.HasField("shape"):
        return True
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            continue
        if which is None:
            return True
        p = d.dim_param
        if p.startswith("unk__") or p not in bound:
            return True
    return False


#: Data propagation is skipped when a Constant holds more integers than this (see infer_shapes).
_DATA_PROP_MAX_ELEMS = 4096


#: ... or when the 1-D node outputs hold more elements than this together (~40 MB of messages).
_DATA_PROP_MAX_TOTAL = 1 << 18


def _data_prop_safe(model: onnx.ModelProto, inferred: onnx.GraphProto) -> bool:
    """Data propagation allocates per element of every 1-D node output it computes (one protobuf
    message each, ~150 bytes measured: 50 Adds of 65,536 elements took 500 MB): safe only while
    the 1-D node outputs hold at most :data:`_DATA_PROP_MAX_TOTAL` elements together and no
    Constant holds more than :data:`_DATA_PROP_MAX_ELEMS` integers."""
    produced = {o for n in inferred.node for o in n.output}
    total = 0
    for vi in list(inferred.value_info) + list(inferred.output):
        if vi.name not in produced:
            continue
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape") and len(tt.shape.dim) == 1:
            d = tt.shape.dim[0]
            total += d.dim_value if d.HasField("dim_value") else 1
            if total > _DATA_PROP_MAX_TOTAL:
                return False
    nodes = [n for g in graph_protos(model.graph) for n in g.node]
    nodes += [n for f in model.functions for n in f.node]
    for n in nodes:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx"):
            continue
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type not in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                onnx.TensorProto.BFLOAT16, onnx.TensorProto.STRING,
            ) and _numel(a.t) > _DATA_PROP_MAX_ELEMS:
                return False
            if len(a.ints) > _DATA_PROP_MAX_ELEMS:
                return False
    return True


def _light_copy(model: onnx.ModelProto, bodies: bool = True) -> onnx.ModelProto:
    """``bodies=False``: the caller knows no node holds a graph (the nodes are not looked at)."""
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4), producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    with_bodies = [k for k, n in enumerate(src.node)
                   if len(n.attribute) and any(a.type == _GRAPH or a.type == _GRAPHS for a in n.attribute)
                   ] if bodies else []
    nodes = src.node
    start = 0
    for k in with_bodies:  # the nodes between bodies copied in one call each (most models: all of them)
        dst.node.extend(nodes[start:k])
        copy = dst.node.add()
        copy.CopyFrom(nodes[k])  # subgraph bodies: their declared value_info is dropped too
        for a in copy.attribute:
            for g in ([a.g] if a.type == _GRAPH else list(a.graphs)):
                _drop_inferable_value_info(g)
        start = k + 1
    dst.node.extend(nodes[start:] if start else nodes)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    if len(src.value_info):  # most files declare none: no walk of the nodes for their outputs
        inferable = {o for n in src.node if n.domain in ("", "ai.onnx") for o in n.output}
        dst.value_info.extend(vi for vi in src.value_info if vi.name not in inferable)
    dst.sparse_initializer.extend(src.sparse_initializer)
    inputs = {i.name for i in src.input}
    external = onnx.TensorProto.EXTERNAL
    small = []
    templates: dict[tuple, onnx.ValueInfoProto] = {}  # (elem, *dims) -> the value info without a name
    add = dst.input.add
    for t in src.initializer:
        elem = t.data_type
        size = _ITEMSIZES.get(elem)
        if size is None:
            size = _ITEMSIZES[elem] = _itemsize(t)
        dims = t.dims
        n = size
        for d in dims:
            n *= d
        if n > 1024 or t.data_location == external:
            name = t.name
            if name not in inputs:  # _add_tensor_value_info(dst.input, name, elem, dims), each type made once
                key = (elem, *dims)
                template = templates.get(key)
                if template is None:
                    template = templates[key] = onnx.ValueInfoProto()
                    _add_tensor_value_info_to(template, elem, dims)
                vi = add()
                vi.CopyFrom(template)
                vi.name = name
        else:
            small.append(t)
    dst.initializer.extend(small)
    return light


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
_ITEMSIZES: dict[int, int] = {}  # ONNX element type -> _itemsize of a tensor of it


def _add_tensor_value_info(field, name: str, elem_type: int, dims) -> None:
    """``field.append(onnx.helper.make_tensor_value_info(name, elem_type, list(dims)))`` for
    integer ``dims``, written in place (the same message)."""
    vi = field.add()
    vi.name = name
    _add_tensor_value_info_to(vi, elem_type, dims)


def _add_tensor_value_info_to(vi: onnx.ValueInfoProto, elem_type: int, dims) -> None:
    """The type of :func:`_add_tensor_value_info`, written into ``vi``."""
    tt = vi.type.tensor_type
    tt.elem_type = elem_type
    tt.shape.SetInParent()  # an empty shape is written (a scalar), as make_tensor_value_info does
    shape = tt.shape.dim
    for d in dims:
        shape.add().dim_value = d


def _drop_inferable_value_info(g: onnx.GraphProto) -> None:
    """Remove the value_info of outputs of default-domain nodes in ``g`` and its subgraphs."""
    inferable = {o for n in g.node if n.domain in ("", "ai.onnx") for o in n.output}
    keep = [vi for vi in g.value_info if vi.name not in inferable]
    if len(keep) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(keep)
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                _drop_inferable_value_info(sub)


def inputs_static(graph: onnx.GraphProto) -> bool:
    """Every dim of every main-graph input (initializers aside) is a number."""
    inits = {t.name for t in graph.initializer}
    for vi in graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
            return False
    return True


def _copy_value_info(src: onnx.GraphProto, dst: onnx.GraphProto, trust_numbers: bool | None = None,
                     bodies: bool = True) -> int:
    """Put the inferred value_info of ``src`` into ``dst`` (same structure); returns how many of
    dst's own entries contradicted inference (a concrete dim, the rank or the dtype differs) and
    were replaced. A dim inference left unknown keeps dst's name for it; dst's number only when
    ``trust_numbers`` (default: the model's inputs are all static, so the exporter traced the
    only shapes there are). In a model with a dynamic input a declared number inference cannot
    confirm is stale: an exporter that traced at batch 1 writes 1 where the batch is dynamic,
    and folding Shape to it breaks the model at batch 2. ``bodies=False``: the caller knows no
    node of ``dst`` holds a graph (the nodes are not walked for one)."""
    inferred = {vi.name: vi for vi in src.value_info}
    contradicted = 0
    first = None
    for vi in dst.value_info:
        new = inferred.pop(vi.name, None)
        if new is None or new == vi:
            continue
        if trust_numbers is None:  # asked of the inputs only when a declared entry is merged
            trust_numbers = inputs_static(dst)
        merged, conflict = _merge_value_info(vi, new, trust_numbers)
        if conflict:
            contradicted += 1
            first = first or (vi.name, _dims_text(vi, new), _dims_text(new, vi))
        vi.CopyFrom(merged)
    dst.value_info.extend(inferred.values())
    _copy_output_types(src, dst)
    if first:
        log.warning("value_info of %d tensor(s) contradicted shape inference (first: '%s' declared %s, inferred %s); "
                    "the inferred shapes are used", contradicted, *first)
    for n_src, n_dst in zip(src.node, dst.node) if bodies else ():
        for i, a_src in enumerate(n_src.attribute):  # dst's attributes read only beside a body
            if a_src.type == onnx.AttributeProto.GRAPH:
                if i < len(n_dst.attribute):
                    if trust_numbers is None:
                        trust_numbers = inputs_static(dst)
                    contradicted += _copy_value_info(a_src.g, n_dst.attribute[i].g, trust_numbers)
            elif a_src.type == onnx.AttributeProto.GRAPHS:
                if trust_numbers is None:
                    trust_numbers = inputs_static(dst)
                if i < len(n_dst.attribute):
                    for g_src, g_dst in zip(a_src.graphs, n_dst.attribute[i].graphs):
                        contradicted += _copy_value_info(g_src, g_dst, trust_numbers)
    return contradicted


def _copy_output_types(src: onnx.GraphProto, dst: onnx.GraphProto) -> None:
    """The inferred type of each of ``dst``'s outputs that has no shape (``src``: the inferred graph)."""
    outputs = {o.name: o for o in dst.output}
    for o in src.output:
        d = outputs.get(o.name)
        if d is not None and (not d.type.HasField("tensor_type") or not d.type.tensor_type.HasField("shape")):
            if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
                d.type.CopyFrom(o.type)


def _dims_text(vi: onnx.ValueInfoProto, other: onnx.ValueInfoProto | None = None) -> str:
    """``[batch,4]``; with the dtype in front (``float16 [batch,4]``) when ``other``'s differs."""
    tt = vi.type.tensor_type
    head = ""
    if other is not None and tt.elem_type != other.type.tensor_type.elem_type:
        head = (onnx.helper.tensor_dtype_to_string(tt.elem_type).removeprefix("TensorProto.").lower()
                if tt.elem_type else "no dtype") + " "
    if not tt.HasField("shape"):
        return head + "?"
    return head + "[" + ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                                 for d in tt.shape.dim) + "]"


def _merge_value_info(old: onnx.ValueInfoProto, new: onnx.ValueInfoProto,
                      trust_numbers: bool = True) -> tuple[onnx.ValueInfoProto, bool]:
    """Inferred ``new`` over declared ``old``: (merged, whether they contradicted)."""
    if not (old.type.HasField("tensor_type") and new.type.HasField("tensor_type")):
        return new, old.type.WhichOneof("value") != new.type.WhichOneof("value")
    ot, nt = old.type.tensor_type, new.type.tensor_type
    merged = onnx.ValueInfoProto()
    merged.CopyFrom(new)
    conflict = bool(ot.elem_type and nt.elem_type and ot.elem_type != nt.elem_type)
    if not nt.elem_type and ot.elem_type:
        merged.type.tensor_type.elem_type = ot.elem_type
    if not ot.HasField("shape"):
        return merged, conflict
    if not nt.HasField("shape"):
        if not conflict:
            merged.type.tensor_type.shape.CopyFrom(ot.shape)
        return merged, conflict
    if len(ot.shape.dim) != len(nt.shape.dim):
        return merged, True
    for od, md in zip(ot.shape.dim, merged.type.tensor_type.shape.dim):
        if md.HasField("dim_value"):
            if od.HasField("dim_value") and od.dim_value != md.dim_value:
                conflict = True
        elif (od.HasField("dim_value") and trust_numbers) or (od.HasField("dim_param") and not md.HasField("dim_param")):
            md.CopyFrom(od)  # a name is only a label; a number only where it can be trusted
    if not old.metadata_props or merged.metadata_props:
        return merged, conflict
    merged.metadata_props.extend(old.metadata_props)
    return merged, conflict



apply_input_shapes = _apply_input_shapes  # public name (verify checks --input-shape the same way)
