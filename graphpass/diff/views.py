"""Read-only views of an ONNX graph for diffing: nodes, tensors, weights, inputs and outputs.

The diff works on ``GraphProto`` directly, not on the onnx-graphsurgeon IR: importing a
100k-node graph into gs takes seconds per graph, reading the proto a fraction of one.
"""

from __future__ import annotations

import dataclasses
import hashlib

import onnx
from onnx import AttributeProto, helper

__all__ = ["NodeView", "GraphView", "op_label", "weight_digest"]

#: Weights larger than this are fingerprinted by size, dtype and 64 KiB samples, not hashed whole.
_FULL_HASH_BYTES = 1 << 22


def op_label(op_type: str, domain: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def _attr_value(a: AttributeProto):
    if a.type == AttributeProto.GRAPH:
        return ("graph", a.g.name)
    if a.type == AttributeProto.GRAPHS:
        return ("graphs", len(a.graphs))
    if a.type == AttributeProto.TENSOR:
        return ("tensor", weight_digest(a.t))
    if a.type == AttributeProto.TENSORS:
        return ("tensors", tuple(weight_digest(t) for t in a.tensors))
    if a.ref_attr_name:
        return ("ref", a.ref_attr_name)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return tuple(x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v)
    if isinstance(v, (onnx.TypeProto, onnx.SparseTensorProto)):
        return ("proto", v.SerializeToString())
    return v


def weight_digest(t: onnx.TensorProto) -> tuple:
    """(dtype, dims, content hash) of a tensor; renamed weights with the same bytes compare equal."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        ext = {e.key: e.value for e in t.external_data}
        return (t.data_type, tuple(t.dims), "external", ext.get("location"), ext.get("offset"), ext.get("length"))
    if t.raw_data:
        raw = t.raw_data
        if len(raw) > _FULL_HASH_BYTES:
            step = len(raw) // 16
            raw = b"".join(raw[i * step:i * step + 4096] for i in range(16)) + len(t.raw_data).to_bytes(8, "little")
        return (t.data_type, tuple(t.dims), hashlib.blake2b(raw, digest_size=16).hexdigest())
    return (t.data_type, tuple(t.dims), hashlib.blake2b(t.SerializeToString(), digest_size=16).hexdigest())


def _nbytes(t: onnx.TensorProto) -> int:
    if t.raw_data:
        return len(t.raw_data)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        ext = {e.key: e.value for e in t.external_data}
        return int(ext.get("length", 0) or 0)
    return t.ByteSize()


def _type_of(vi: onnx.ValueInfoProto) -> tuple[str, tuple | None]:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None:
        return (vi.type.WhichOneof("value") or "unknown", None)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "unknown"
    if not tt.HasField("shape"):
        return (dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    return (dtype, dims)


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

    @property
    def key(self) -> tuple:
        return (self.op, tuple(sorted((k, v) for k, v in self.attrs.items())))

    @property
    def label(self) -> str:
        return self.name or (self.outputs[0] if self.outputs else f"#{self.index}")


class GraphView:
    """One graph (top level or a body) of a model, indexed for the diff."""

    def __init__(self, graph: onnx.GraphProto):
        self.proto = graph
        self.nodes: list[NodeView] = []
        for i, n in enumerate(graph.node):
            attrs, subs = {}, {}
            for a in n.attribute:
                name = a.name if isinstance(a.name, str) else bytes(a.name).decode("utf-8", "replace")
                try:
                    attrs[name] = _attr_value(a)
                except Exception:  # noqa: BLE001 - a malformed attribute still compares by its bytes
                    attrs[name] = ("proto", a.SerializeToString())
                if a.type == AttributeProto.GRAPH:
                    subs[a.name] = a.g
                elif a.type == AttributeProto.GRAPHS:
                    for k, g in enumerate(a.graphs):
                        subs[f"{a.name}[{k}]"] = g
            self.nodes.append(NodeView(i, n.name, op_label(n.op_type, n.domain), list(n.input), list(n.output),
                                       attrs, {p.key: p.value for p in n.metadata_props}, subs))
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
        self.digest = {name: weight_digest(t) for name, t in self.initializers.items()}
        self.nbytes = {name: _nbytes(t) for name, t in self.initializers.items()}
        self.inputs = [(vi.name, _type_of(vi)) for vi in graph.input if vi.name not in self.initializers]
        self.outputs = [(vi.name, _type_of(vi)) for vi in graph.output]
        self.input_names = {name for name, _ in self.inputs}

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
