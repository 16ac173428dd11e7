"""Read-only views of an ONNX graph for diffing: nodes, tensors, weights, inputs and outputs.

The diff works on ``GraphProto`` directly, not on the onnx-graphsurgeon IR: importing a
100k-node graph into gs takes seconds per graph, reading the proto a fraction of one.

Weights are compared by content: :func:`weight_digest` hashes (blake2b, streamed) the canonical
little-endian bytes of a tensor's values, the same whether they are stored in ``raw_data``, in
``float_data``/``int32_data``/... or in an external data file (read in chunks through
:func:`graphpass.ir.model_io.iter_external_bytes`, after :func:`~graphpass.ir.model_io.read_as_stored`
checked the file). Attributes equal to the operator schema's default are dropped before nodes are
compared (``alpha=0.01`` written out is LeakyRelu's default, not a change).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from typing import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

__all__ = ["NodeView", "GraphView", "op_label", "weight_digest", "value_chunks", "largest_difference",
           "COMMUTATIVE", "function_graph"]

#: Bytes hashed per read (external data is streamed in chunks of this size).
_CHUNK = 1 << 22
#: Binary ops whose two operands may be swapped without changing a bit of the result. Not Max/Min
#: (NaN handling may depend on the order) nor Sum/Mean of three or more (rounding depends on it).
COMMUTATIVE = frozenset({"Add", "Mul", "And", "Or", "Xor", "Equal", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                         "Sum", "Mean"})
_STANDARD_KINDS = "biufc"  # numpy kinds whose little-endian array bytes are ONNX's raw_data bytes


def op_label(op_type: str, domain: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def _is_external(t: onnx.TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def _np_dtype(t: onnx.TensorProto):
    try:
        return helper.tensor_dtype_to_np_dtype(t.data_type)
    except Exception:  # noqa: BLE001 - UNDEFINED or a type this onnx does not know
        return None


def _with_raw(t: onnx.TensorProto) -> onnx.TensorProto:
    """``t`` with its external bytes read in (a copy), for the exotic dtypes numpy_helper decodes."""
    from graphpass.ir import model_io

    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = b"".join(model_io.iter_external_bytes(t, _CHUNK))
    return copy


def _canonical_blocks(t: onnx.TensorProto) -> Iterator[bytes]:
    """The tensor's values as canonical little-endian bytes, in blocks (storage form does not show)."""
    dtype = _np_dtype(t)
    if t.data_type == onnx.TensorProto.STRING:
        for s in t.string_data:
            yield len(s).to_bytes(8, "little") + s
        return
    if dtype is not None and dtype.kind in _STANDARD_KINDS and dtype.kind != "O":
        if _is_external(t):
            from graphpass.ir import model_io

            yield from model_io.iter_external_bytes(t, _CHUNK)
            return
        if t.HasField("raw_data"):
            raw = memoryview(t.raw_data)
            for i in range(0, len(raw), _CHUNK):
                yield raw[i:i + _CHUNK]
            return
        yield _to_array(t, dtype).tobytes()
        return
    if dtype is not None:  # bfloat16, float8, int4, float4...: numpy_helper decodes every storage form
        arr = numpy_helper.to_array(_with_raw(t) if _is_external(t) else t)
        yield np.ascontiguousarray(arr).tobytes()
        return
    # a type numpy cannot hold: its stored bytes, whatever field holds them (compared, never equal by default)
    if _is_external(t):
        from graphpass.ir import model_io

        yield from model_io.iter_external_bytes(t, _CHUNK)
        return
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    copy.ClearField("name")
    copy.ClearField("doc_string")
    yield copy.SerializeToString()


def _to_array(t: onnx.TensorProto, dtype) -> np.ndarray:
    arr = numpy_helper.to_array(t)
    return np.ascontiguousarray(arr, dtype=dtype.newbyteorder("<")).reshape(-1)


_RAW_KINDS = frozenset(k for k in range(1, 64) if k != onnx.TensorProto.STRING and
                       getattr(_np_dtype(onnx.TensorProto(data_type=k)), "kind", "O") in _STANDARD_KINDS)


def _digest_and_size(t: onnx.TensorProto) -> tuple[tuple, int]:
    """:func:`weight_digest` and the stored size in bytes (raw_data is read once: each read copies)."""
    dt = t.data_type
    if t.data_location != onnx.TensorProto.EXTERNAL:
        raw = t.raw_data
        if raw and dt in _RAW_KINDS and len(raw) <= _CHUNK:
            return (dt, tuple(t.dims), hashlib.blake2b(raw, digest_size=16).hexdigest()), len(raw)
    return weight_digest(t), _nbytes(t)


def weight_digest(t: onnx.TensorProto) -> tuple:
    """(dtype, dims, content hash) of a tensor: a full blake2b of its canonical bytes, streamed.
    Equal for the same values stored inline or externally, in raw_data or in the typed fields."""
    h = hashlib.blake2b(digest_size=16)
    for block in _canonical_blocks(t):
        h.update(block)
    return (t.data_type, tuple(t.dims), h.hexdigest())


def value_chunks(t: onnx.TensorProto, elems: int = 1 << 20) -> Iterator[np.ndarray] | None:
    """The values of a numeric tensor, flat, in chunks of ``elems`` (the last may be shorter);
    None for strings and types numpy cannot hold."""
    dtype = _np_dtype(t)
    if dtype is None or dtype.kind not in _STANDARD_KINDS:
        if dtype is None or t.data_type == onnx.TensorProto.STRING:
            return None
        arr = np.asarray(numpy_helper.to_array(_with_raw(t) if _is_external(t) else t)).reshape(-1)
        return (arr[i:i + elems] for i in range(0, max(arr.size, 1), elems))
    le = dtype.newbyteorder("<")
    if _is_external(t) or t.HasField("raw_data"):
        def gen():
            from graphpass.ir import model_io

            blocks = model_io.iter_external_bytes(t, elems * le.itemsize) if _is_external(t) else (
                memoryview(t.raw_data)[i:i + elems * le.itemsize] for i in range(0, len(t.raw_data), elems * le.itemsize))
            for b in blocks:
                yield np.frombuffer(b, dtype=le, count=len(b) // le.itemsize)
        return gen()
    arr = _to_array(t, dtype)
    return (arr[i:i + elems] for i in range(0, max(arr.size, 1), elems))


def largest_difference(ta: onnx.TensorProto, tb: onnx.TensorProto) -> dict | None:
    """For two tensors of one dtype and shape: how many elements differ (bitwise) and the largest
    absolute difference among them (NaN against a number, or infinities of other signs, counted
    apart as ``nonfinite``). None when the values cannot be read as numbers."""
    ca, cb = value_chunks(ta), value_chunks(tb)
    if ca is None or cb is None:
        return None
    differ = nonfinite = 0
    largest = 0.0
    for xa, xb in zip(ca, cb):
        if xa.shape != xb.shape:
            return None
        ba = xa.view(np.uint8).reshape(xa.size, -1) if xa.size else np.zeros((0, 1), np.uint8)
        bb = xb.view(np.uint8).reshape(xb.size, -1) if xb.size else np.zeros((0, 1), np.uint8)
        mask = (ba != bb).any(axis=1)
        k = int(mask.sum())
        if not k:
            continue
        differ += k
        va, vb = xa[mask], xb[mask]
        if va.dtype.kind == "c":
            d = np.abs(va.astype(np.complex128) - vb.astype(np.complex128))
        elif va.dtype.kind in "iub":
            d = np.abs(va.astype(np.float64) - vb.astype(np.float64))
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                d = np.abs(va.astype(np.float64) - vb.astype(np.float64))
        bad = ~np.isfinite(d)
        nonfinite += int(bad.sum())
        if (~bad).any():
            largest = max(largest, float(d[~bad].max()))
    return {"elements_differ": differ, "max_abs_diff": largest, "nonfinite": nonfinite}


_SCALAR = {AttributeProto.INT: lambda a: a.i, AttributeProto.FLOAT: lambda a: a.f,
           AttributeProto.INTS: lambda a: tuple(a.ints), AttributeProto.FLOATS: lambda a: tuple(a.floats)}


def _attr_value(a: AttributeProto):
    fast = _SCALAR.get(a.type)
    if fast is not None and not a.ref_attr_name:
        return fast(a)
    if a.ref_attr_name:
        return ("ref", a.ref_attr_name)
    if a.type == AttributeProto.GRAPH:
        return ("graph", _body_ops(a.g))
    if a.type == AttributeProto.GRAPHS:
        return ("graphs", tuple(_body_ops(g) for g in a.graphs))
    if a.type == AttributeProto.TENSOR:
        return ("tensor", weight_digest(a.t))
    if a.type == AttributeProto.TENSORS:
        return ("tensors", tuple(weight_digest(t) for t in a.tensors))
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return tuple(x.decode("utf-8", "replace") if isinstance(x, bytes) else
                     ("proto", x.SerializeToString()) if hasattr(x, "SerializeToString") else x for x in v)
    if isinstance(v, (onnx.TypeProto, onnx.SparseTensorProto)):
        return ("proto", v.SerializeToString())
    return v


def _body_ops(g: onnx.GraphProto) -> tuple:
    """A body's op multiset: enough to keep two If nodes with other bodies apart when matching
    (the bodies themselves are diffed node by node)."""
    c = collections.Counter(op_label(n.op_type, n.domain) for n in g.node)
    return tuple(sorted(c.items()))


@functools.lru_cache(maxsize=4096)
def _schema_defaults(op_type: str, domain: str, version: int) -> dict:
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:  # noqa: BLE001 - a custom or unknown op: no defaults known
        return {}
    out = {}
    for name, attr in schema.attributes.items():
        d = attr.default_value
        if d is not None and d.type != AttributeProto.UNDEFINED:
            try:
                out[name] = _attr_value(d)
            except Exception:  # noqa: BLE001
                pass
    return out


def _type_of(vi: onnx.ValueInfoProto) -> tuple[str, tuple | None]:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:  # sequence, map, optional, sparse: compared by the whole type
        kind = vi.type.WhichOneof("value") or "unknown"
        if kind == "unknown":
            return (kind, None)
        return (f"{kind}:{hashlib.blake2b(vi.type.SerializeToString(), digest_size=6).hexdigest()}", None)
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "unknown"
    except Exception:  # noqa: BLE001 - an element type this onnx does not know
        dtype = f"elem_type {tt.elem_type}"
    if not tt.HasField("shape"):
        return (dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    return (dtype, dims)


def _nbytes(t: onnx.TensorProto) -> int:
    if t.raw_data:
        return len(t.raw_data)
    if _is_external(t):
        ext = {e.key: e.value for e in t.external_data}
        return int(ext.get("length", 0) or 0)
    return t.ByteSize()


@dataclasses.dataclass
class NodeView:
    index: int
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    meta: dict
    subgraphs: dict  # attribute name -> GraphProto (If/Loop/Scan bodies)

    def __post_init__(self):
        n_out = len(self.outputs)
        while n_out and not self.outputs[n_out - 1]:
            n_out -= 1
        #: op, number of outputs (a Split into 2 is not a Split into 3) and attributes
        self.key: tuple = (self.op, n_out, tuple(sorted(self.attrs.items())) if self.attrs else ())
        self.commutative: bool = self.op in COMMUTATIVE and len(self.inputs) == 2

    def operands(self, names: list[str]) -> tuple:
        """``names`` (this node's inputs, or their matches) in an order that does not matter for
        commutative ops."""
        return tuple(sorted(names)) if self.commutative else tuple(names)

    @property
    def label(self) -> str:
        return self.name or (self.outputs[0] if self.outputs else f"#{self.index}")


class GraphView:
    """One graph (top level, a body or a function's) of a model, indexed for the diff.

    ``opsets``: domain -> version, to find each op's schema defaults."""

    def __init__(self, graph: onnx.GraphProto, opsets: dict[str, int] | None = None):
        self.proto = graph
        self.opsets = opsets or {}
        self.nodes: list[NodeView] = []
        self.uncompared: list[str] = []
        defaults_of: dict[tuple[str, str], dict] = {}
        for i, n in enumerate(graph.node):
            attrs, subs = {}, {}
            op_type, domain = n.op_type, n.domain
            attributes = n.attribute
            if attributes:
                defaults = defaults_of.get((op_type, domain))
                if defaults is None:
                    version = self.opsets.get(domain or "ai.onnx", self.opsets.get(domain))
                    defaults = defaults_of[(op_type, domain)] = (
                        _schema_defaults(op_type, domain, version) if version else {})
                for a in attributes:
                    name = a.name if isinstance(a.name, str) else bytes(a.name).decode("utf-8", "replace")
                    kind = a.type
                    try:
                        value = _attr_value(a)
                    except Exception:  # noqa: BLE001 - a malformed attribute still compares by its bytes
                        value = ("proto", a.SerializeToString())
                    if name in defaults and defaults[name] == value:
                        continue  # the default written out: the same as leaving it out
                    attrs[name] = value
                    if kind == AttributeProto.GRAPH:
                        subs[a.name] = a.g
                    elif kind == AttributeProto.GRAPHS:
                        for k, g in enumerate(a.graphs):
                            subs[f"{a.name}[{k}]"] = g
                    elif kind in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS):
                        self.uncompared.append(f"node '{n.name or op_type}' attribute '{name}': sparse tensors are not compared")
            meta = n.metadata_props
            self.nodes.append(NodeView(i, n.name, op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}",
                                       list(n.input), list(n.output), attrs,
                                       {p.key: p.value for p in meta} if meta else {}, subs))
        self.producer: dict[str, tuple[int, int]] = {}
        for n in self.nodes:
            for j, t in enumerate(n.outputs):
                if t:
                    self.producer[t] = (n.index, j)
        self.consumers: dict[str, list[int]] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t:
                    self.consumers.setdefault(t, []).append(n.index)
        self.initializers = {t.name: t for t in graph.initializer}
        self.digest, self.nbytes = {}, {}
        for name, t in self.initializers.items():
            self.digest[name], self.nbytes[name] = _digest_and_size(t)
        self.inputs = [(vi.name, _type_of(vi)) for vi in graph.input if vi.name not in self.initializers]
        self.outputs = [(vi.name, _type_of(vi)) for vi in graph.output]
        self.input_names = {name for name, _ in self.inputs}
        self.sparse = [t.values.name or t.indices.name for t in graph.sparse_initializer]

    def order(self) -> list[int]:
        """Node indices in topological order (the file's order when it is already one)."""
        if all(self.producer.get(t, (-1,))[0] < n.index for n in self.nodes for t in n.inputs if t):
            return list(range(len(self.nodes)))
        pending_inputs = [sum(1 for t in set(n.inputs) if t in self.producer) for n in self.nodes]
        ready = [i for i, k in enumerate(pending_inputs) if k == 0]
        out: list[int] = []
        waiting = list(pending_inputs)
        while ready:
            i = ready.pop()
            out.append(i)
            for t in set(self.nodes[i].outputs):
                for c in set(self.consumers.get(t, ())):
                    waiting[c] -= 1
                    if waiting[c] == 0:
                        ready.append(c)
        seen = set(out)
        out += [i for i in range(len(self.nodes)) if i not in seen]  # a cycle: keep file order for the rest
        return out


def function_graph(f: onnx.FunctionProto) -> onnx.GraphProto:
    """A model-local function's body as a graph (inputs and outputs untyped: functions declare none)."""
    return helper.make_graph(list(f.node), f.name, [helper.make_value_info(n, onnx.TypeProto()) for n in f.input],
                             [helper.make_value_info(n, onnx.TypeProto()) for n in f.output])
