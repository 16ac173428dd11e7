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
import onnx_graphsurgeon as gs

from graphpass.ir.annotations import stored_meta
from graphpass.ir.external import DEFAULT_LAYOUT
from graphpass.ir.serialize import DECLARED_VALUE_INFO, EXTERNAL_LAYOUT
from graphpass.ir.graph import iter_graphs
from graphpass.ir.shapes import numel, static_shape

__all__ = ["bytes_bound", "tensor_bytes", "constant_overhead"]

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


def tensor_bytes(t: gs.Tensor) -> int:
    """Bytes of a constant's data from its shape and dtype (no weight read; strings read)."""
    shape = static_shape(t)
    values = t.__dict__.get("_values")
    if isinstance(values, np.ndarray) and values.dtype.kind in "OSU":
        return sum(_s(v if isinstance(v, (str, bytes)) else str(v)) for v in values.reshape(-1))
    proto = getattr(values, "tensor", None)  # not read yet: a string tensor's bytes are in its proto
    if proto is not None and proto.string_data:
        return sum(_s(v) for v in proto.string_data)
    if shape is None:
        return 0
    try:
        size = np.dtype(t.dtype).itemsize if t.dtype is not None else 8
    except TypeError:
        size = 8
    return numel(shape) * max(size, 1)


def constant_overhead(name: str, rank: int, external: bool = True) -> int:
    """The most bytes an initializer of ``name`` and ``rank`` takes besides its data
    (``external``: written to external data)."""
    return _WRAP + _s(name) + _INT * (rank + 1) + _WRAP + (_EXTERNAL if external else 0)


def _meta(obj: Any) -> int:
    d = stored_meta(obj)
    return sum(2 * _WRAP + _s(k) + _s(v) for k, v in d.items()) if d else 0


def _constant(t: gs.Constant, threshold: int) -> int:
    data = tensor_bytes(t)
    return constant_overhead(t.name, len(t.shape) if t.shape is not None else 8, data >= threshold) + data + _meta(t)


def _value_info(t: gs.Tensor) -> int:
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
        return _WRAP + int(value.nbytes) + _INT * (value.ndim + 1) + (_s(str(value)) if value.dtype.kind in "OSU" else 0)
    if isinstance(value, (list, tuple)):
        return sum(_attr(v, threshold) for v in value)
    return _s(repr(value))  # an attribute reference of a function body, a type


def _node(n: gs.Node, threshold: int) -> int:
    total = _WRAP + _s(n.op) + _s(n.name) + _s(n.domain) + _meta(n)
    total += sum(_s(t.name) for t in n.inputs) + sum(_s(t.name) for t in n.outputs)
    for name, value in n.attrs.items():
        total += 2 * _WRAP + _s(name) + _INT + _attr(value, threshold)
    return total


def _graph(g: gs.Graph, constants: set[int], tensors: set[int], threshold: int, declared) -> int:
    total = _WRAP + _s(g.name)
    for n in g.nodes:
        total += _node(n, threshold)
        for t in list(n.inputs) + list(n.outputs):
            if id(t) in tensors:
                continue
            tensors.add(id(t))
            if isinstance(t, gs.Constant):
                if id(t) not in constants:
                    constants.add(id(t))
                    total += _constant(t, threshold)
            elif declared is None or t.name in declared or stored_meta(t):  # what save writes as value_info
                total += _value_info(t)
    for t in list(g.inputs) + list(g.outputs):
        total += _value_info(t)
        if isinstance(t, gs.Constant) and id(t) not in constants:
            constants.add(id(t))
            total += _constant(t, threshold)
    return total


def bytes_bound(graph: gs.Graph, model: Any = None) -> int:
    """The most bytes ``graph`` (and its Model's facts, when given) can take saved, with
    external data: every graph, subgraph and local function included."""
    constants: set[int] = set()
    tensors: set[int] = set()
    layout = model.meta.get(EXTERNAL_LAYOUT) if model is not None else None
    threshold = layout.threshold if layout is not None else DEFAULT_LAYOUT.threshold
    declared = model.meta.get(DECLARED_VALUE_INFO) if model is not None else None
    total = 0
    for g in iter_graphs(graph):
        total += _graph(g, constants, tensors, threshold, declared)
    for fn in graph.functions or ():
        for g in iter_graphs(fn):
            total += _graph(g, constants, tensors, threshold, declared)
        total += _s(fn.domain) + _s(getattr(fn, "name", "")) + sum(_s(a) for a in getattr(fn, "attrs", {}) or {})
    if model is not None:
        total += 64 + _s(model.doc_string) + _s(model.domain) + _s(graph.producer_name) + _s(graph.producer_version)
        total += sum(2 * _WRAP + _s(k) + _INT for k in model.opset_imports)
        total += sum(2 * _WRAP + _s(k) + _s(v) for k, v in model.metadata_props.items())
    return total
