"""How many bytes a model takes on disk, bounded from above without exporting it.

:func:`bytes_bound` walks the IR once (every graph, body and local function) and adds, for each
protobuf field save would write, the most bytes that field can take: a tag, a length prefix of
its full varint width and the payload; an integer is counted as a 10-byte varint, a tensor's
data at its full size, plus an external-data record and 64 bytes of alignment when it is big
enough to be written external (the model's layout threshold, graphpass.ir.external); value_info
for the tensors save writes it for (the ones the input declared, annotated ones, the graph's
inputs and outputs). Whatever the exporter
writes is at most this, so ``source bytes - bytes_bound(graph)`` is room the file has before it grows.

fold_constants uses that room (``graphpass.ir.serialize.SOURCE_BYTES``, the input's bytes with
its external data, recorded at load) for folds that store more than they free: a folded
constant may grow its own part of the file as long as the whole model stays no bigger than it
was. Linear in the graph; no weight is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir.annotations import stored_meta
from graphpass.ir.device_ops import DOMAIN as DEVICE_DOMAIN
from graphpass.ir.external import DEFAULT_LAYOUT
from graphpass.ir.serialize import DECLARED_VALUE_INFO, EXTERNAL_LAYOUT
from graphpass.ir.graph import iter_graphs
from graphpass.ir.shapes import numel, static_shape

__all__ = ["bytes_bound", "tensor_bytes", "freed_bytes", "node_bytes_least", "constant_overhead"]

_INT = 11  # tag + a 10-byte varint
_FLOAT = 5  # tag + 4 bytes
_WRAP = 7  # tag (up to 2 bytes) + a length prefix of up to 5 bytes
#: external data of one tensor: location (up to 255 bytes), offset and length entries, 64-byte alignment
_EXTERNAL = 6 * _WRAP + 255 + 2 * _INT + 20 + 64


def _s(text: Any) -> int:
    if text is None:
        return 0
    n = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
    return _WRAP + n


def _packed(dtype: Any) -> bool:
    """4-bit types (int4, uint4, float4): two values a byte as saved, one a byte in numpy."""
    return getattr(dtype, "name", str(dtype)) in ("int4", "uint4", "float4_e2m1fn")


def _in_memory_proto(values: Any):
    """The TensorProto behind a constant not read yet, when its bytes are in memory (not on disk)."""
    proto = getattr(values, "tensor", None)
    if proto is None or (proto.HasField("data_location") and proto.data_location == onnx.TensorProto.EXTERNAL):
        return None
    return proto


def tensor_bytes(t: gs.Tensor) -> int:
    """The most bytes a constant's data takes saved, from its shape and dtype (no weight read;
    strings read). A tensor still in the TensorProto it was loaded as is saved as stored:
    typed fields (``int64_data`` and the like, what ``onnx.helper.make_tensor`` writes) take up
    to a 10-byte varint a value, so the proto's own size counts when it is the larger."""
    shape = static_shape(t)
    values = t.__dict__.get("_values")
    if isinstance(values, np.ndarray) and values.dtype.kind in "OSU":
        return sum(_s(v if isinstance(v, (str, bytes)) else str(v)) for v in values.reshape(-1))
    proto = getattr(values, "tensor", None)  # not read yet: a string tensor's bytes are in its proto
    if proto is not None and proto.string_data:
        return sum(_s(v) for v in proto.string_data)
    in_memory = _in_memory_proto(values)
    stored = in_memory.ByteSize() if in_memory is not None else 0
    if shape is None:
        return stored
    try:
        size = np.dtype(t.dtype).itemsize if t.dtype is not None else 8
    except TypeError:
        size = 8
    return max(numel(shape) * max(size, 1), stored)


def freed_bytes(t: gs.Constant) -> int:
    """The least bytes a constant takes saved (what removing it frees, at least): its proto's
    size while it is the one it was loaded as, raw bytes of an array (4-bit types two a byte),
    a string's bytes plus its tag and length byte. fold_constants charges a fold this, so a
    compactly stored constant (short strings, small varints) never pays for a bigger fold."""
    values = t.__dict__.get("_values")
    if isinstance(values, np.ndarray):
        if values.dtype.kind in "OSU":
            return sum(2 + len(v.encode("utf-8", "surrogatepass") if isinstance(v, str) else
                               v if isinstance(v, bytes) else str(v).encode()) for v in values.reshape(-1))
        return int(values.nbytes) // 2 if _packed(values.dtype) else int(values.nbytes)
    in_memory = _in_memory_proto(values)
    if in_memory is not None:
        return in_memory.ByteSize()
    proto = getattr(values, "tensor", None)  # on disk: the bytes its external record says
    if proto is not None:
        length = next((e.value for e in proto.external_data if e.key == "length"), None)
        return int(length) if length and str(length).isdigit() else 0
    return 0


def _least(text: Any) -> int:
    """The least bytes a non-empty string field takes: a tag, a one-byte length, the text."""
    if not text:
        return 0
    return 2 + (len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text))


def node_bytes_least(n: gs.Node) -> int:
    """The least bytes ``n``'s NodeProto takes in the file (what removing it frees, at least):
    its op type, name, domain and tensor names (an empty optional input is still two bytes),
    each attribute's name and type, its annotations."""
    total = 2 + _least(n.op) + _least(n.name) + _least(n.domain)
    total += sum(max(2, _least(t.name)) for t in list(n.inputs) + list(n.outputs))
    total += sum(4 + _least(k) for k in n.attrs)
    d = stored_meta(n)
    if d:
        total += sum(2 + _least(k) + _least(v) for k, v in d.items())
    return total


def constant_overhead(name: str, rank: int, external: bool = True) -> int:
    """The most bytes an initializer of ``name`` and ``rank`` takes besides its data
    (``external``: written to external data)."""
    return _WRAP + _s(name) + _INT * (rank + 1) + _WRAP + (_EXTERNAL if external else 0)


def _nbytes_of(proto: onnx.TensorProto) -> int:
    length = next((e.value for e in proto.external_data if e.key == "length"), None)
    if length and str(length).isdigit():
        return int(length)
    try:
        size = onnx.helper.tensor_dtype_to_np_dtype(proto.data_type).itemsize
    except Exception:  # noqa: BLE001 - an exotic or unset type
        size = 8
    n = 1
    for d in proto.dims:
        n *= max(int(d), 0)
    return n * max(size, 1)


def _meta(obj: Any) -> int:
    d = stored_meta(obj)
    return sum(2 * _WRAP + _s(k) + _s(v) for k, v in d.items()) if d else 0


def _constant(t: gs.Constant, threshold: int) -> int:
    data = tensor_bytes(t)
    return constant_overhead(t.name, len(t.shape) if t.shape is not None else 8, data >= threshold) + data + _meta(t)


def _value_info(t: gs.Tensor) -> int:
    kept = t.__dict__.get("_gp_type")  # a sequence/optional/map type, written back as loaded
    if kept is not None:
        return 2 * _WRAP + _s(t.name) + kept.ByteSize() + _meta(t)
    dims = 0
    for d in t.shape or ():
        dims += _WRAP + (_s(d) if isinstance(d, str) else _INT)
    return 4 * _WRAP + _s(t.name) + _INT + dims + _meta(t)


def _attr(value: Any, threshold: int) -> int:
    if isinstance(value, (bool, int, np.integer)):
        return _INT
    if isinstance(value, (float, np.floating)):
        return _FLOAT
    if isinstance(value, (str, bytes)):
        return _s(value)
    if isinstance(value, gs.Constant):
        return _constant(value, threshold)
    if isinstance(value, gs.Graph):  # its nodes are counted where iter_graphs visits them
        return _WRAP + _s(value.name) + sum(_value_info(t) for t in list(value.inputs) + list(value.outputs))
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSU":  # every string (str(array) elides past 1000 elements)
            return _WRAP + _INT * (value.ndim + 1) + sum(_s(v if isinstance(v, (str, bytes)) else str(v))
                                                         for v in value.reshape(-1))
        # written as a list attribute (INTS: an 11-byte field a negative value; FLOATS: 5 bytes) or a tensor
        each = _INT if value.dtype.kind in "iub" else max(_FLOAT, value.dtype.itemsize)
        return _WRAP + _INT * (value.ndim + 1) + int(value.size) * each
    if isinstance(value, (list, tuple)):
        return sum(_attr(v, threshold) for v in value)
    return _s(repr(value))  # an attribute reference of a function body, a type


def _node(n: gs.Node, threshold: int) -> int:
    """A node's own fields; its tensor names are counted by :func:`_graph`."""
    total = 4 * _WRAP + len(n.op.encode("utf-8", "surrogatepass")) + _s(n.name) + _s(n.domain)
    total += _meta(n)
    if n.attrs:
        for name, value in n.attrs.items():
            total += 2 * _WRAP + _s(name) + _INT + _attr(value, threshold)
    raw = n.__dict__.get("_gp_raw_attrs")  # TYPE_PROTO attributes
    if raw:
        total += sum(_WRAP + a.ByteSize() for a in raw)
    return total


def _graph(g: gs.Graph, constants: set[int], threshold: int, declared) -> int:
    total = _WRAP + _s(g.name) + _s(getattr(g, "doc_string", None))
    tensors: set[int] = set()  # per graph: a body writes value_info for the outer tensors it reads
    names = 0
    for n in g.nodes:
        total += _node(n, threshold)
        for io in (n.inputs, n.outputs):
            for t in io:
                name = t.name
                names += _WRAP + (len(name) if name.isascii() else len(name.encode("utf-8", "surrogatepass")))
                k = id(t)
                if k in tensors:
                    continue
                tensors.add(k)
                if isinstance(t, gs.Constant):
                    if k not in constants:
                        constants.add(k)
                        total += _constant(t, threshold)
                elif declared is None or name in declared or stored_meta(t):  # save writes value_info
                    total += _value_info(t)
    total += names
    for t in list(g.inputs) + list(g.outputs):
        total += _value_info(t)
        if isinstance(t, gs.Constant) and id(t) not in constants:
            constants.add(id(t))
            total += _constant(t, threshold)
    return total


def _function(fn: gs.Function, threshold: int) -> int:
    """A FunctionProto's own fields (its nodes are counted as a graph): name, domain, attribute
    names and defaults, opset imports, doc_string."""
    total = _WRAP + _s(fn.domain) + _s(getattr(fn, "name", ""))
    for name, default in (getattr(fn, "attrs", None) or {}).items():
        total += 2 * _WRAP + _s(name) + _INT + (_attr(default, threshold) if default is not None else 0)
    imports = getattr(fn, "import_domains", None) or ()
    total += sum(2 * _WRAP + _s(d.domain) + _INT for d in imports) + 2 * _WRAP + _INT
    return total


#: the most bytes the inliner and graphpass add to a name of an inlined node: the call's name
#: plus "/<j>_<op>" (a node), a "__<n>" suffix (a tensor of the body)
_INLINE_SUFFIX = 24


def _inlined_calls(graph: gs.Graph, threshold: int) -> int:
    """The most bytes the portable form adds for the device ops it inlines (graphpass.ir.device_ops
    .to_portable): each call becomes its body's nodes, each named after the call, carrying the
    call's annotations, reading the call's tensors or the body's renamed ones, its attribute
    references resolved to the call's values. The device op and its function are counted too
    (they are what ``emit="device"`` writes)."""
    bodies = {fn.name: fn for fn in graph.functions or () if fn.domain == DEVICE_DOMAIN}
    if not bodies:
        return 0
    total = 0
    for g in iter_graphs(graph):
        for call in g.nodes:
            fn = bodies.get(call.op) if call.domain == DEVICE_DOMAIN else None
            if fn is None:
                continue
            io = max((len(t.name.encode("utf-8", "surrogatepass")) for t in list(call.inputs) + list(call.outputs)),
                     default=0)
            given = sum(2 * _WRAP + _s(k) + _INT + _attr(v, threshold) for k, v in call.attrs.items())
            for body in iter_graphs(fn):
                for n in body.nodes:
                    total += _WRAP + _s(n.op) + _s(n.domain) + _meta(call)
                    total += _WRAP + max(_s(call.name) + _s(n.op), _s(n.name)) + _INLINE_SUFFIX
                    for t in list(n.inputs) + list(n.outputs):
                        total += _WRAP + max(io, len(t.name.encode("utf-8", "surrogatepass")) + _INLINE_SUFFIX)
                    for name, value in n.attrs.items():
                        total += 2 * _WRAP + _s(name) + _INT + _attr(value, threshold) + given
    return total


def bytes_bound(graph: gs.Graph, model: Any = None) -> int:
    """The most bytes ``graph`` (and its Model's facts, when given) can take saved, with
    external data: every graph, subgraph and local function included."""
    constants: set[int] = set()
    layout = model.meta.get(EXTERNAL_LAYOUT) if model is not None else None
    threshold = layout.threshold if layout is not None else DEFAULT_LAYOUT.threshold
    declared = model.meta.get(DECLARED_VALUE_INFO) if model is not None else None
    total = 0
    for g in iter_graphs(graph):
        total += _graph(g, constants, threshold, declared)
    for fn in graph.functions or ():
        for g in iter_graphs(fn):
            total += _graph(g, constants, threshold, declared)
        total += _function(fn, threshold)
    total += _inlined_calls(graph, threshold)
    if model is not None:
        total += 64 + _s(model.doc_string) + _s(model.domain) + _s(graph.producer_name) + _s(graph.producer_version)
        total += sum(2 * _WRAP + _s(k) + _INT for k in model.opset_imports)
        total += sum(2 * _WRAP + _s(k) + _s(v) for k, v in model.metadata_props.items())
        for name, init in (model.input_defaults or {}).items():  # initializers that are inputs (IR >= 4)
            data = max(init.ByteSize(), _nbytes_of(init))
            total += constant_overhead(name, len(init.dims), data >= threshold) + data
    return total
