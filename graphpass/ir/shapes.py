"""Shape and dtype information for passes: re-running onnx shape inference on the IR.

Shapes come from onnx's shape inference (with data propagation). Symbolic dims keep their names
(gs stores them as strings); unknown dims are None. ``refresh_shapes`` exports the graph once,
infers, and writes the inferred shapes back onto the gs tensors: linear in the graph size.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir import inference, serialize
from graphpass.ir.graph import iter_graphs, subgraph_pairs

__all__ = ["refresh_shapes", "static_shape", "numel", "tensor_elem_type", "ONNX_TO_NP", "substitute_dims",
           "count_unresolved", "unresolved_dims", "bound_symbols", "record_given", "given_shapes",
           "shape_epoch", "dim_hint"]

ONNX_TO_NP = {
    onnx.TensorProto.FLOAT: np.dtype("float32"),
    onnx.TensorProto.DOUBLE: np.dtype("float64"),
    onnx.TensorProto.FLOAT16: np.dtype("float16"),
    onnx.TensorProto.INT8: np.dtype("int8"),
    onnx.TensorProto.INT16: np.dtype("int16"),
    onnx.TensorProto.INT32: np.dtype("int32"),
    onnx.TensorProto.INT64: np.dtype("int64"),
    onnx.TensorProto.UINT8: np.dtype("uint8"),
    onnx.TensorProto.UINT16: np.dtype("uint16"),
    onnx.TensorProto.UINT32: np.dtype("uint32"),
    onnx.TensorProto.UINT64: np.dtype("uint64"),
    onnx.TensorProto.BOOL: np.dtype("bool"),
}


def tensor_elem_type(tensor: gs.Tensor) -> int | None:
    """The ONNX element type (TensorProto.*) of a gs tensor, or None when unknown."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return None


def static_shape(tensor: gs.Tensor) -> list[int] | None:
    """The shape as a list of non-negative ints, or None if any dim is unknown or symbolic."""
    if isinstance(tensor, gs.Constant):
        return list(tensor.shape)
    shape = tensor.shape
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, (int, np.integer)) and d >= 0:
            out.append(int(d))
        else:
            return None
    return out


def numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dims(vi: onnx.ValueInfoProto):
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def _apply(graph_proto: onnx.GraphProto, graph: gs.Graph, forget: bool = False) -> int:
    infos = {}
    for vi in list(graph_proto.value_info) + list(graph_proto.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            infos[vi.name] = vi
    updated = 0
    for node in graph.nodes:
        for t in node.outputs:
            if not isinstance(t, gs.Variable):
                continue
            vi = infos.get(t.name)
            if vi is None:
                # inference knows nothing of it: a shape kept from before is stale (forget=True)
                if forget and t.shape is not None and (node.domain or "") in ("", "ai.onnx") and t.name:
                    t.shape = None
                    updated += 1
                continue
            dims = _dims(vi)
            dtype = ONNX_TO_NP.get(vi.type.tensor_type.elem_type)
            if dims is not None and not forget and t.shape is not None and len(t.shape) == len(dims):
                dims = [_merge_dim(old, new) for old, new in zip(t.shape, dims)]
            if dims is not None and dims != t.shape:
                t.shape = dims
                updated += 1
            if dtype is not None and t.dtype is None:
                t.dtype = dtype
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        for gp, g in subgraph_pairs(proto_node, node):
            updated += _apply(gp, g, forget)
    return updated


def _merge_dim(old, new):
    """Inferred ``new`` over ``old``, except where inference found nothing (None or onnx's
    ``unk__N``) and ``old`` is a number: as the loader merges declared value_info."""
    if (new is None or (isinstance(new, str) and new.startswith("unk__"))) and isinstance(old, (int, np.integer)) \
            and not isinstance(old, bool) and old >= 0:
        return old
    return new


def refresh_shapes(graph: gs.Graph, forget_stale: bool = False) -> int:
    """Re-run shape inference on ``graph`` and update its tensors; returns how many changed.

    What inference finds replaces the shape a tensor had (inferred over declared: the exporter's
    value_info never wins over what inference knows); a dim inference cannot tell keeps a number
    it had (as the loader merges declared value_info). ``forget_stale`` (the input shapes just
    changed, so what a tensor had may be stale): inference alone decides, and a default-domain
    node output it says nothing about loses its old shape. Every run bumps the
    graph's shape epoch (:func:`shape_epoch`), which the pass manager reads to skip a refresh
    the pass itself just did.
    """
    graph.__dict__[_EPOCH_KEY] = graph.__dict__.get(_EPOCH_KEY, 0) + 1
    model = serialize.snapshot(graph)[0]  # weightless: inference needs dims and dtypes, not bytes
    inferred = inference.infer_shapes(model)
    if inferred is model:
        return 0
    return _apply(inferred.graph, graph, forget_stale)


_EPOCH_KEY = "_gp_shape_epoch"


def shape_epoch(graph: gs.Graph) -> int:
    """How many times :func:`refresh_shapes` ran on ``graph`` (a cheap "were shapes re-inferred
    since" check)."""
    return graph.__dict__.get(_EPOCH_KEY, 0)


def bound_symbols(graph: gs.Graph) -> set[str]:
    """Symbolic dim names carried by the main graph's inputs (the ones a user can fix)."""
    return {d for t in graph.inputs if t.shape is not None for d in t.shape if isinstance(d, str) and d}


def _unresolved_dim(d, bound: set[str]) -> bool:
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return d < 0
    return not (isinstance(d, str) and d in bound)


def count_unresolved(graph: gs.Graph) -> int:
    """Node outputs (in every graph) whose shape is unknown or has a dim that is neither a
    number nor a symbol of a main-graph input: an unknown dim, onnx's ``unk__N``, or a name
    only the exporter's value_info gave (stale once inference knows better). Linear, no export."""
    bound = bound_symbols(graph)
    n = 0
    for g in iter_graphs(graph):
        for node in g.nodes:
            for t in node.outputs:
                if not t.name or not isinstance(t, gs.Variable):
                    continue
                shape = t.shape
                if shape is None:
                    n += 1
                    continue
                for d in shape:  # (a plain loop: most dims are ints, tested first)
                    if type(d) is int:
                        if d < 0:
                            n += 1
                            break
                    elif _unresolved_dim(d, bound):
                        n += 1
                        break
    return n


def unresolved_dims(graph: gs.Graph) -> dict[str, str]:
    """Each unresolved symbolic dim name of the main graph's node outputs (see
    :func:`count_unresolved`) -> the first tensor that carries it."""
    bound = bound_symbols(graph)
    out: dict[str, str] = {}
    for node in graph.nodes:
        for t in node.outputs:
            for d in t.shape or ():
                if isinstance(d, str) and d not in bound:
                    out.setdefault(d, t.name)
    return out


def substitute_dims(graph: gs.Graph, fixed: dict[str, int]) -> int:
    """Replace each symbolic dim named in ``fixed`` by its value in every tensor shape of every
    graph (inputs, outputs, node outputs). Returns how many tensors changed."""
    if not fixed:
        return 0
    changed = 0
    seen: set[int] = set()
    for g in iter_graphs(graph):
        tensors = list(g.inputs) + list(g.outputs) + [t for n in g.nodes for t in n.outputs]
        for t in tensors:
            if id(t) in seen or isinstance(t, gs.Constant) or t.shape is None:
                continue
            seen.add(id(t))
            if any(isinstance(d, str) and d in fixed for d in t.shape):
                t.shape = [fixed[d] if isinstance(d, str) and d in fixed else d for d in t.shape]
                changed += 1
    return changed


_GIVEN_KEY = "_gp_shapes_given"


def record_given(graph: gs.Graph, shapes: dict[str, list[int]], fixed: dict[str, int]) -> None:
    """Remember on ``graph`` what the user fixed (input shapes, -1 where a dim stays dynamic;
    symbolic dim name -> value), for the messages and estimates that follow."""
    given = graph.__dict__.setdefault(_GIVEN_KEY, {"inputs": {}, "dims": {}})
    given["inputs"].update({k: list(v) for k, v in shapes.items()})
    given["dims"].update(fixed)


def forget_given(graph: gs.Graph) -> None:
    """Forget what :func:`record_given` remembered on ``graph`` (a copy specialized for an analysis
    records the values it assumed; the messages must speak only of what the user fixed)."""
    graph.__dict__.pop(_GIVEN_KEY, None)


def given_shapes(graph: gs.Graph) -> dict[str, dict]:
    """``{"inputs": {name: shape}, "dims": {symbol: value}}``: what --input-shape / --dim fixed
    on this graph (empty dicts when nothing was given)."""
    given = graph.__dict__.get(_GIVEN_KEY)
    return {"inputs": dict(given["inputs"]), "dims": dict(given["dims"])} if given else {"inputs": {}, "dims": {}}


def dim_hint(graph: gs.Graph, dim) -> str:
    """What to tell the user about a symbolic or unknown ``dim`` of ``graph``: how to fix it when
    they fixed nothing yet; when --input-shape/--dim were given, what is still unresolved (never
    "pass --input-shape" to someone who did)."""
    given = given_shapes(graph)
    bound = bound_symbols(graph)
    if isinstance(dim, str) and dim in bound:
        return f"fix it with --dim {dim}=VALUE or --input-shape"
    if not (given["inputs"] or given["dims"]):
        return "fix the inputs with --input-shape or --dim"
    fixed = ", ".join(given["inputs"]) or "the inputs"
    if given["dims"]:
        fixed += " (" + ", ".join(f"{k}={v}" for k, v in given["dims"].items()) + ")"
    return (f"unresolved although --input-shape/--dim fixed {fixed}: the dim is computed inside the model "
            "and shape inference cannot size it")
