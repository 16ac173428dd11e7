"""Ascend annotations on the IR, and how they survive a save/load round trip.

onnx-graphsurgeon has no place for metadata on nodes or tensors and drops ``metadata_props``
on export, so graphpass keeps its own dict on each gs object (``obj.__dict__["_gp_meta"]``) and
moves it in and out of the ONNX protos itself:

* a node's annotations live in ``NodeProto.metadata_props``;
* a tensor's annotations live in the ``metadata_props`` of its ``ValueInfoProto`` (graph input,
  output or ``value_info``), or of its ``TensorProto`` when the tensor is an initializer.

Every key/value pair found on load is kept, graphpass's own and anybody else's.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import onnx
import onnx_graphsurgeon as gs

from graphpass.ir import journal as _journal
from graphpass.ir.graph import has_subgraph, subgraph_pairs

__all__ = [
    "FORMAT",
    "ENGINE",
    "PASS",
    "FUSED_FROM",
    "SINK",
    "REASON",
    "meta",
    "stored_meta",
    "get",
    "set",
    "set_format",
    "get_format",
    "set_engine",
    "get_engine",
    "mark_created",
    "fused_from",
    "write_to_proto",
    "read_from_proto",
]

FORMAT = "graphpass.format"
ENGINE = "graphpass.engine"
PASS = "graphpass.pass"
FUSED_FROM = "graphpass.fused_from"
SINK = "graphpass.sink"
#: why a node a pass created is there (e.g. why a TransData could not be avoided)
REASON = "graphpass.reason"

_KEY = "_gp_meta"


def meta(obj: Any) -> dict[str, str]:
    """The annotation dict of a gs Node or Tensor (created empty on first use)."""
    if _journal._ACTIVE:  # the caller may edit the dict: an undo log saves it first
        _journal.touch(obj)
    d = obj.__dict__.get(_KEY)
    if d is None:
        d = {}
        obj.__dict__[_KEY] = d
    return d


def stored_meta(obj: Any) -> dict[str, str] | None:
    """The annotation dict of ``obj`` if it has one (None, and nothing created, otherwise)."""
    return obj.__dict__.get(_KEY)


def get(obj: Any, key: str, default: str | None = None) -> str | None:
    d = obj.__dict__.get(_KEY)
    return default if d is None else d.get(key, default)


def set(obj: Any, key: str, value: str | None) -> None:  # noqa: A001 - mirrors dict.set semantics
    """Annotate ``obj``; ``None`` removes the annotation (it is not stored as the string "None")."""
    if value is None:
        d = obj.__dict__.get(_KEY)
        if d is not None and key in d:
            del meta(obj)[key]  # meta(): the undo log saves the dict first
        return
    meta(obj)[key] = str(value)


def set_format(tensor: gs.Tensor, fmt: str | None) -> None:
    set(tensor, FORMAT, fmt)


def get_format(tensor: gs.Tensor) -> str | None:
    return get(tensor, FORMAT)


def set_engine(node: gs.Node, engine: str) -> None:
    set(node, ENGINE, engine)


def get_engine(node: gs.Node) -> str | None:
    return get(node, ENGINE)


def mark_created(node: gs.Node, pass_name: str, replaced: Iterable[gs.Node] = ()) -> None:
    """Record that ``pass_name`` created ``node`` in place of ``replaced`` (provenance)."""
    d = meta(node)  # (once: the rewrite engine marks every node it places)
    d[PASS] = str(pass_name)
    names: list[str] = []
    for old in replaced:
        raw = get(old, FUSED_FROM)
        names.extend(json.loads(raw) or [old.name] if raw else [old.name])
    if names:
        d[FUSED_FROM] = json.dumps([n for n in names if n])


def fused_from(node: gs.Node) -> list[str]:
    raw = get(node, FUSED_FROM)
    return json.loads(raw) if raw else []


def _graph_tensors(graph: gs.Graph) -> dict[str, gs.Tensor]:
    tensors: dict[str, gs.Tensor] = {}
    for t in graph.inputs:
        tensors[t.name] = t
    for node in graph.nodes:
        for t in node.inputs:
            if t.name:
                tensors.setdefault(t.name, t)
        for t in node.outputs:
            if t.name:
                tensors[t.name] = t
    for t in graph.outputs:
        tensors.setdefault(t.name, t)
    return tensors


def write_to_proto(graph: gs.Graph, graph_proto: onnx.GraphProto, maps: "dict | None" = None) -> None:
    """Write the annotations of ``graph`` (exported as ``graph_proto``) into the proto, recursively.

    The exporter writes ``graph.nodes`` in order, so nodes pair up by position. ``maps``: the
    export's maps of each graph's named tensors (graphpass.ir.fast_export.export_onnx's), read
    in place of :func:`_graph_tensors` where they are the same map (no clashing names, no
    graph input or output without a name).
    """
    protos = graph_proto.node
    if len(protos) != len(graph.nodes):  # pragma: no cover - exporter contract
        raise AssertionError("exported graph has a different node count than the IR")
    for i, node in enumerate(graph.nodes):
        d = node.__dict__.get(_KEY)
        body = bool(node.attrs) and has_subgraph(node)
        if not d and not body:
            continue  # its proto node is not looked up
        proto_node = protos[i]
        if d:
            del proto_node.metadata_props[:]
            for k, v in d.items():
                proto_node.metadata_props.add(key=k, value=v)
        if body:
            for sub_proto, sub in subgraph_pairs(proto_node, node):
                write_to_proto(sub, sub_proto, maps)

    known = maps.get(id(graph)) if maps else None
    if known is not None and known[0] is graph and all(t.name for t in graph.inputs) \
            and all(t.name for t in graph.outputs):
        tensors = known[1]
    else:
        tensors = _graph_tensors(graph)
    # an emptied dict (every key dropped, e.g. by strip_debug_info) still clears its holder: an
    # initializer's header is exported with the metadata it was loaded with
    annotated = {name: t.__dict__[_KEY] for name, t in tensors.items() if t.__dict__.get(_KEY) is not None}
    if not annotated:
        return
    holders: dict[str, Any] = {}
    for init in graph_proto.initializer:
        holders[init.name] = init
    for vi in list(graph_proto.value_info) + list(graph_proto.input) + list(graph_proto.output):
        holders[vi.name] = vi
    for name, d in annotated.items():
        holder = holders.get(name)
        if holder is None and not d:
            continue
        if holder is None:
            tensor = tensors.get(name)
            holder = graph_proto.value_info.add()
            holder.name = name
            if tensor is not None and tensor.dtype is not None:
                elem = onnx.helper.np_dtype_to_tensor_dtype(_np_dtype(tensor.dtype))
                holder.type.tensor_type.elem_type = elem
        del holder.metadata_props[:]
        for k, v in d.items():
            holder.metadata_props.add(key=k, value=v)


def _np_dtype(dtype: Any):
    import numpy as np

    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype("float32")


def read_from_proto(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    """Copy ``metadata_props`` of nodes and tensors in ``graph_proto`` onto the imported ``graph``."""
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        props_of_node = proto_node.metadata_props
        if props_of_node:
            d = meta(node)
            for p in props_of_node:
                d[p.key] = p.value
        if node.attrs and has_subgraph(node):  # (a node without attributes holds no body)
            for sub_proto, sub in subgraph_pairs(proto_node, node):
                read_from_proto(sub_proto, sub)

    props: dict[str, Any] = {}
    for holders in (graph_proto.initializer, graph_proto.value_info, graph_proto.input, graph_proto.output):
        for holder in holders:
            md = holder.metadata_props
            if md:
                props[holder.name] = md
    if not props:
        return
    for name, t in _graph_tensors(graph).items():
        if name in props:
            d = meta(t)
            for p in props[name]:
                d[p.key] = p.value
