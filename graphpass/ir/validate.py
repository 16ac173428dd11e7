"""Validation: the structural and content checks every model passes before graphpass reads it,
and the full ONNX checker on what graphpass writes.

:func:`validate` is linear in the model size and gives one :class:`BadModelError` line per
problem (a node input nothing produces, duplicate producers, bad attribute types, tensor data
that does not match its shape, ...). :func:`check_written` runs ``onnx.checker`` on a written
model and tells an input at fault (exit 2) from a graphpass bug (exit 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from graphpass.errors import BadModelError, ResourceLimitError
from graphpass.ir import limits

if TYPE_CHECKING:
    from graphpass.ir.serialize import ModelSource

__all__ = ["InvalidOutputError", "check_written", "parse", "validate"]


def parse(data: bytes, where: str) -> onnx.ModelProto:
    """``data`` parsed as a ModelProto; one BadModelError line when it is not one."""
    if not data:
        raise BadModelError(f"{where}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeError from upb
        raise BadModelError(f"{where}: not an ONNX model (protobuf parse failed: {e})") from e
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise BadModelError(f"{where}: not an ONNX model (no ir_version or no graph)")
    return model


def validate(model: onnx.ModelProto, where: str = "model") -> None:
    """Structural checks that make the rest of graphpass safe; linear in the model size.

    Beyond the graph structure: every default-domain node needs a default-domain opset import;
    main-graph inputs need a type; a Constant needs exactly one value; an attribute of a known
    default-domain op must have the type the op declares; initializer names are unique per
    graph; concrete dims lie in 0..2^31; an initializer's data matches its shape.
    """
    _validate(model, where, _header(model))


def _header(model: onnx.ModelProto) -> int | None:
    """validate's checks of the IR version and opsets; returns the default-domain opset."""
    if model.ir_version > onnx.IR_VERSION:
        raise BadModelError(
            f"model IR version {model.ir_version} is newer than this onnx ({onnx.__version__}) supports "
            f"(max {onnx.IR_VERSION})"
        )
    opsets = {o.domain or "": o.version for o in model.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    newest = onnx.defs.onnx_opset_version()
    if default is not None:
        if default < 1:
            raise BadModelError(f"model declares default-domain opset {default}, which does not exist")
        if default > newest:
            raise BadModelError(f"model uses opset {default}, newer than this onnx supports ({newest})")
    return default


class GraphList(list):
    """The graphs validation's one walk met (``list(graph_protos(model.graph))``), with what it
    saw of their nodes on the way: ``node_domains``, the domains of the nodes outside the
    default one, and ``attr_types``, the type of every attribute (the loader skips walks these
    say have nothing to find: graphpass.ir.serialize.from_proto), and ``outputs``, the output
    names of the first graph's nodes, in node order (shape inference's check of them), and
    ``external``: whether some tensor the walk met may be stored as external data (an
    initializer or an attribute's tensor with a ``data_location``, or an attribute holding a
    tensor the walk does not look at: a list of tensors, a tensor beside another type), and
    ``metadata``: whether some node, initializer, input, output or value info of a graph it met
    has ``metadata_props`` (or a graph has a sparse initializer: not looked at), where
    annotations.read_from_proto looks for them."""

    __slots__ = ("node_domains", "attr_types", "outputs", "external", "metadata")

    def __init__(self):
        super().__init__()
        self.node_domains: set = set()
        self.attr_types: set = set()
        self.outputs: list | None = None
        self.external = False
        self.metadata = False


def _validate(model: onnx.ModelProto, where: str, default: int | None) -> list | None:
    """:func:`validate` after the header; returns ``list(graph_protos(model.graph))`` (a
    :class:`GraphList`) when the one walk found everything valid (it met every graph, in that
    order), else None."""
    graphs = GraphList()
    if _looks_valid(model, default, graphs):
        return graphs  # every check of _check_all would pass
    _check_all(model, where, default)
    return None


def validated_graphs(model: onnx.ModelProto, where: str = "model") -> list | None:
    """:func:`validate`, returning the model's graphs (``list(graph_protos(model.graph))``)
    when its one walk found them, None when the checks ran as written (they met no problem)."""
    default = _header(model)
    return _validate(model, where, default)


def _check_all(model: onnx.ModelProto, where: str, default: int | None) -> None:
    """The checks of :func:`validate` after the header, in their order: the first problem
    raises, with its message."""
    _check_graph(model.graph, outer=frozenset(), path=model.graph.name or "main")
    for vi in model.graph.input:
        if not vi.HasField("type") or vi.type.WhichOneof("value") is None:
            raise BadModelError(f"{where}: graph input '{vi.name}' has no type")
    _check_content(model, default)


_GRAPH, _GRAPHS, _TENSOR = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSOR
_OP_TYPES_OK: set = set()  # op_type strings found to be identifiers
#: (op_type, opset) -> {attribute name: declared type} of a default-domain op, None for an unknown op
_ATTR_TYPES: dict[tuple[str, int], "dict[str, int] | None"] = {}


def _attr_types(op: str, opset: int) -> "dict[str, int] | None":
    key = (op, opset)
    if key not in _ATTR_TYPES:
        try:
            sch = onnx.defs.get_schema(op, opset, "")
        except Exception:  # noqa: BLE001 - unknown op: its checks are the runtime's
            _ATTR_TYPES[key] = None
        else:
            _ATTR_TYPES[key] = {name: int(a.type) for name, a in sch.attributes.items()}
    return _ATTR_TYPES[key]


#: element type -> whole bytes per element (types with a fractional or no fixed size left out)
_WHOLE_SIZES: dict[int, int] = {}


def _tensor_ok(t: onnx.TensorProto) -> None:
    """:func:`_check_tensor`, the common case (raw data of a type of whole bytes per element)
    decided here; anything else goes to it. Raises (BadModelError) where it would."""
    size = _WHOLE_SIZES.get(t.data_type)
    if size is None:
        s = limits.elem_size(t.data_type)
        if s is None or s != int(s) or s < 1 or not t.HasField("raw_data"):
            _check_tensor(t, "")
            return
        size = _WHOLE_SIZES[t.data_type] = int(s)
    n = size
    for d in t.dims:
        if not 0 <= d <= limits.MAX_DIM:
            raise BadModelError("dims")
        n *= d
    if t.HasField("data_location") or not t.HasField("raw_data") or len(t.raw_data) != n:
        _check_tensor(t, "")


def _looks_valid(model: onnx.ModelProto, default_opset: int | None, graphs: list | None = None) -> bool:
    """Whether every check of :func:`validate` after the header passes, found in one walk of
    each graph that reads each node once (the checks' own walks read every node three to five
    times: most of the load of a 10k-node model's validation). It decides nothing itself: True
    only where each of those checks holds, False on anything it does not follow (then the
    checks run as written and raise the first problem, in their order, with their message).
    ``graphs``: each graph met is appended to it, in :func:`~graphpass.ir.graph.graph_protos`'
    order (each before the bodies in its nodes, depth first)."""
    try:
        local_functions = {(f.domain, f.name) for f in model.functions}
        if not _graph_looks_valid(model.graph, frozenset(), default_opset, local_functions,
                                  graphs if graphs is not None else []):
            return False
        for vi in model.graph.input:
            if not vi.HasField("type") or vi.type.WhichOneof("value") is None:
                return False
    except Exception:  # noqa: BLE001 - whatever it is, the checks as written say it
        return False
    return True


def _graph_looks_valid(g: onnx.GraphProto, outer: frozenset, default_opset: int | None,
                       local_functions: set, graphs: list) -> bool:
    """:func:`_check_graph`'s and :func:`_check_content`'s checks of ``g`` and its bodies
    (see :func:`_looks_valid`); True when all hold. Name lists are checked as text by joining
    them (``str.join`` refuses the bytes protobuf returns for invalid UTF-8)."""
    graphs.append(g)
    seen = graphs if type(graphs) is GraphList else GraphList()
    domains_seen, attr_types_seen = seen.node_domains, seen.attr_types
    names: list = []
    defined: set = set(outer)
    metadata = seen.metadata or len(g.sparse_initializer) > 0
    for holder in (g.input, g.output, g.initializer, g.value_info):
        for t in holder:
            names.append(t.name)
            if not metadata and len(t.metadata_props):
                metadata = True
    for i in g.input:
        defined.add(i.name)
    inits = [t.name for t in g.initializer]
    if len(set(inits)) != len(inits):
        return False
    defined.update(inits)
    defined.update(i.values.name for i in g.sparse_initializer)
    for t in g.initializer:
        _tensor_ok(t)
        if t.HasField("data_location"):
            seen.external = True
    max_dim = limits.MAX_DIM
    for holder in (g.input, g.output, g.value_info):
        for vi in holder:
            ty = vi.type
            if ty.HasField("tensor_type"):
                tt = ty.tensor_type
                if tt.HasField("shape"):
                    for d in tt.shape.dim:
                        if d.HasField("dim_value") and not 0 <= d.dim_value <= max_dim:
                            return False
    node_names: list = []
    inputs: list = []
    outputs: list = []
    bodies: list = []
    ops_ok = _OP_TYPES_OK
    for node in g.node:
        op = node.op_type
        if op not in ops_ok:
            if not isinstance(op, str) or not op.isidentifier():
                return False
            ops_ok.add(op)
        domain = node.domain
        node_names.append(node.name)
        if not metadata and len(node.metadata_props):
            metadata = True
        inputs.extend(node.input)
        outputs.extend(node.output)
        attrs = node.attribute
        default = domain == "" or domain == "ai.onnx"
        if default:
            if default_opset is None and (domain, op) not in local_functions:
                return False
            if op == "Constant" and sum(a.name in _VALUE_ATTRS for a in attrs) != 1:
                return False
        elif not isinstance(domain, str):
            return False
        else:
            domains_seen.add(domain)
        if not len(attrs):
            continue
        declared = _attr_types(op, default_opset or 1) if default else None
        for a in attrs:
            names.append(a.name)
            t = a.type
            attr_types_seen.add(t)
            if t == _TENSOR:
                _tensor_ok(a.t)
                if a.t.HasField("data_location") or len(a.tensors):
                    seen.external = True
            elif len(a.tensors) or a.HasField("t"):
                seen.external = True
            elif t == _GRAPH:
                bodies.append(a.g)
            elif t == _GRAPHS:
                bodies.extend(a.graphs)
            if declared is not None and not a.ref_attr_name:
                d = declared.get(a.name)
                if d is not None and t != 0 and d != t:
                    return False
    seen.metadata = metadata
    "".join(names)  # TypeError on a name that is not text
    "".join(node_names)
    "".join(inputs)
    "".join(outputs)
    produced = [o for o in outputs if o]
    if len(set(produced)) != len(produced):
        return False
    if seen is graphs and len(graphs) == 1:  # the main graph (the first one met)
        seen.outputs = outputs
    defined.update(produced)
    missing = set(inputs).difference(defined)
    missing.discard("")  # an omitted optional input
    if missing:
        return False
    for out in g.output:
        if out.name not in defined:
            return False
    if bodies:
        scope = frozenset(defined)
        for body in bodies:
            if not _graph_looks_valid(body, scope, default_opset, local_functions, graphs):
                return False
    return True


_VALUE_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                          "value_strings", "sparse_value"})


def _check_content(model: onnx.ModelProto, default_opset: int | None) -> None:
    """Opset imports, attribute types, Constant values, tensor data vs shape; linear."""
    schemas: dict[str, object] = {}

    def schema(op: str):
        if op not in schemas:
            try:
                schemas[op] = onnx.defs.get_schema(op, default_opset or 1, "")
            except Exception:  # noqa: BLE001 - unknown op: its checks are the runtime's
                schemas[op] = None
        return schemas[op]

    local_functions = {(f.domain, f.name) for f in model.functions}
    for path, g in _graphs_with_paths(model.graph, model.graph.name or "main"):
        seen: set[str] = set()
        for t in g.initializer:
            if t.name in seen:
                raise BadModelError(
                    f"{path}: two initializers are named '{t.name}' (runtimes disagree on which one wins)"
                )
            seen.add(t.name)
            _check_tensor(t, f"{path}: initializer '{t.name}'")
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is not None and tt.HasField("shape"):
                for d in tt.shape.dim:
                    if d.HasField("dim_value") and not 0 <= d.dim_value <= limits.MAX_DIM:
                        raise ResourceLimitError(
                            f"{path}: tensor '{vi.name}' has dimension {d.dim_value}, outside 0..2^31"
                        )
        for node in g.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            name = node.name or node.op_type
            if default_opset is None and (node.domain, node.op_type) not in local_functions:
                raise BadModelError(
                    f"{path}: node '{name}' ({node.op_type}) uses the default ONNX domain, "
                    "which the model does not import (no opset_import for '')"
                )
            if node.op_type == "Constant":
                values = [a for a in node.attribute if a.name in _VALUE_ATTRS]
                if len(values) != 1:
                    raise BadModelError(
                        f"{path}: Constant node '{name}' has {len(values)} values (it needs exactly one)"
                    )
            sch = schema(node.op_type)
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    _check_tensor(a.t, f"{path}: node '{name}' attribute '{a.name}'")
                if sch is None or a.ref_attr_name:
                    continue
                decl = sch.attributes.get(a.name)
                if decl is not None and a.type != 0 and int(decl.type) != int(a.type):
                    raise BadModelError(
                        f"{path}: node '{name}' ({node.op_type}) has attribute '{a.name}' of type "
                        f"{onnx.AttributeProto.AttributeType.Name(a.type)}; the operator takes "
                        f"{onnx.AttributeProto.AttributeType.Name(int(decl.type))}"
                    )


def _graphs_with_paths(graph: onnx.GraphProto, path: str):
    yield path, graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs_with_paths(a.g, f"{path}/{node.name or node.op_type}.{a.name}")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for k, sub in enumerate(a.graphs):
                    yield from _graphs_with_paths(sub, f"{path}/{node.name or node.op_type}.{a.name}[{k}]")


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _check_tensor(t: onnx.TensorProto, what: str) -> None:
    """Dims in 0..2^31; data (inline) of exactly the size the shape needs."""
    for d in t.dims:
        if not 0 <= d <= limits.MAX_DIM:
            raise ResourceLimitError(f"{what} has dimension {d}, outside 0..2^31")
    if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL:
        return  # checked against its file by external.load_external_data
    n = _numel(t)
    if t.HasField("raw_data"):
        expected = _expected_bytes(t)
        if expected is not None and expected != len(t.raw_data):
            raise BadModelError(
                f"{what} of shape {list(t.dims)} needs {expected} bytes, its raw_data holds {len(t.raw_data)}"
            )
        return
    have = [f for f in _TYPED_FIELDS if len(getattr(t, f))]
    if not have:
        if n:
            raise BadModelError(f"{what} of shape {list(t.dims)} holds no data")
        return
    count = len(getattr(t, have[0]))
    if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        count //= 2
    elif limits.elem_size(t.data_type) in (0.5, 0.25) and have[0] == "int32_data":
        count *= int(1 / limits.elem_size(t.data_type))  # packed: ceil(n / per_byte) int32 entries
        if count - n >= int(1 / limits.elem_size(t.data_type)):
            count = -1
        else:
            count = n
    if count != n:
        raise BadModelError(f"{what} of shape {list(t.dims)} holds {len(getattr(t, have[0]))} values in {have[0]}, not {n}")


def _check_names(graph: onnx.GraphProto, path: str) -> None:
    """Every name in ``graph`` is text (protobuf hands back bytes for invalid UTF-8)."""
    def bad(what: str, value) -> BadModelError:
        return BadModelError(f"{path}: {what} {bytes(value)[:40]!r} is not valid UTF-8")

    for holder, what in ((graph.input, "graph input"), (graph.output, "graph output"),
                         (graph.initializer, "initializer"), (graph.value_info, "value_info")):
        for t in holder:
            if not isinstance(t.name, str):
                raise bad(what + " name", t.name)
    for node in graph.node:
        if not isinstance(node.name, str):
            raise bad("node name", node.name)
        for t in list(node.input) + list(node.output):
            if not isinstance(t, str):
                raise bad(f"tensor name of node '{node.name}'", t)
        for a in node.attribute:
            if not isinstance(a.name, str):
                raise bad(f"attribute name of node '{node.name}'", a.name)


def _check_graph(graph: onnx.GraphProto, outer: frozenset, path: str) -> None:
    _check_names(graph, path)
    defined: set[str] = set(outer)
    defined.update(i.name for i in graph.input)
    defined.update(i.name for i in graph.initializer)
    defined.update(i.values.name for i in graph.sparse_initializer)
    produced: dict[str, str] = {}
    for node in graph.node:
        op = node.op_type
        if not isinstance(op, str) or not op.isidentifier():
            raise BadModelError(f"{path}: node '{node.name if isinstance(node.name, str) else '?'}' has an invalid op_type {op!r}")
        if not isinstance(node.domain, str):
            raise BadModelError(f"{path}: node '{node.name}' ({op}) has an invalid domain")
        for o in node.output:
            if not o:
                continue
            if o in produced:
                raise BadModelError(
                    f"{path}: tensor '{o}' is produced twice (by '{produced[o]}' and '{node.name or node.op_type}')"
                )
            produced[o] = node.name or node.op_type
    defined.update(produced)
    for node in graph.node:
        for i in node.input:
            if i and i not in defined:
                raise BadModelError(
                    f"{path}: node '{node.name or '?'}' ({node.op_type}) reads '{i}', "
                    "which no node, graph input or initializer produces"
                )
    for out in graph.output:
        if out.name not in defined:
            raise BadModelError(f"{path}: graph output '{out.name}' is produced by nothing")
    scope = frozenset(defined)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _check_graph(attr.g, scope, f"{path}/{node.name or node.op_type}.{attr.name}")
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for k, g in enumerate(attr.graphs):
                    _check_graph(g, scope, f"{path}/{node.name or node.op_type}.{attr.name}[{k}]")


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def _has_typed_data(t: onnx.TensorProto) -> bool:
    return bool(
        len(t.float_data) or len(t.int32_data) or len(t.int64_data) or len(t.double_data)
        or len(t.uint64_data) or len(t.string_data)
    )


def _itemsize(t: onnx.TensorProto) -> int:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:  # noqa: BLE001 - unusual types: a rough size is enough for the 2 GB choice
        return 4


def _expected_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes of ``t``'s data as ``raw_data`` (sub-byte types packed); None for strings/unknown."""
    size = limits.elem_size(t.data_type)
    if size is None:
        return None
    n = _numel(t)
    if size < 1:
        per_byte = int(round(1 / size))
        return -(-n // per_byte)
    return n * int(size)


def _validate_at(model: onnx.ModelProto, where: str) -> None:
    """:func:`validate`, its message prefixed with where the model came from."""
    try:
        validate(model)
    except BadModelError as e:
        raise BadModelError(f"{where}: {e}") from None


class InvalidOutputError(RuntimeError):
    """graphpass wrote a model the ONNX checker refuses from an input it accepts: a graphpass bug
    (exit 3), never the user's."""


def _checker_problem(model: str | onnx.ModelProto) -> str | None:
    """The full ONNX checker's first complaint about ``model`` (a path or a proto), or None."""
    try:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:  # noqa: BLE001
            if "Cannot parse data from external tensors" not in str(e):
                raise
            # onnx's shape inference cannot read a shape operand kept in external data: that is
            # the checker's limit, not the model's; the structural checks still run
            onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError and C++ errors alike
        text = str(e).strip().splitlines()
        return (text[0] if text else type(e).__name__)[:400]
    return None


def check_written(path: str | Path, source: "ModelSource", input_shapes: "dict[str, list] | None" = None) -> None:
    """Refuse to hand on an invalid model: run the full ONNX checker on the model graphpass wrote
    at ``path``; if it fails and the input ``source`` fails it too, the input is at fault
    (:class:`BadModelError`, exit 2, naming the checker's complaint); if the input fails it only
    with its inputs fixed to ``input_shapes`` (the shapes the run fixed), those shapes are at
    fault (:class:`BadModelError`, exit 2: a sequence longer than a position table, say); if the
    input passes, graphpass broke it (:class:`InvalidOutputError`, exit 3). Only on failure is the
    input checked."""
    problem = _checker_problem(str(path))
    if problem is None:
        return
    original = str(source) if isinstance(source, (str, Path)) else (
        source if isinstance(source, onnx.ModelProto) else parse(bytes(source), "<bytes>"))
    where = str(source) if isinstance(source, (str, Path)) else "<model>"
    input_problem = _checker_problem(original)
    if input_problem is not None:
        raise BadModelError(f"{where}: not a valid ONNX model, and graphpass does not repair this: {input_problem}")
    if input_shapes:
        fixed = _with_input_shapes(original, input_shapes)
        fixed_problem = _checker_problem(fixed) if fixed is not None else None
        if fixed_problem is not None:
            given = ", ".join(f"{k}: {list(v)}" for k, v in input_shapes.items())
            raise BadModelError(f"{where} does not hold together with its inputs fixed to {given}: {fixed_problem}",
                                option="input_shapes")
    raise InvalidOutputError(f"graphpass wrote a model the ONNX checker refuses (a graphpass bug): {problem}")


def _with_input_shapes(source: "str | onnx.ModelProto", input_shapes: "dict[str, list]") -> "onnx.ModelProto | None":
    """The input model (no weights loaded) with its graph inputs' dims fixed where ``input_shapes``
    gives a positive number, its value_info dropped (shape inference derives it anew)."""
    try:
        m = onnx.load(str(source), load_external_data=False) if not isinstance(source, onnx.ModelProto) else source
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
    except Exception:  # noqa: BLE001 - the fixed-shape check is a diagnosis only
        return None
    for vi in copy.graph.input:
        shape = input_shapes.get(vi.name)
        if shape is None or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            continue
        for d, v in zip(dims, shape):
            if isinstance(v, int) and v > 0:
                d.ClearField("dim_param")
                d.dim_value = v
    del copy.graph.value_info[:]
    # weights in external data (relative to the model's folder, which a proto does not know)
    # become inputs of their type and shape: shape inference needs only those of them
    keep = []
    for init in copy.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            copy.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(keep)
    return copy



_parse = parse  # the old private name
