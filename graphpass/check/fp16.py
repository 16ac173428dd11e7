"""fp16 that is really fp16: run a model holding float16 tensors with every fp16 value rounded.

onnxruntime's CPU provider has few float16 kernels: it wraps the others in Casts to float32 and
then removes the Cast pairs between neighbouring fp16 nodes, so a chain of fp16 ops computes in
float32 and only its end is rounded. Overflow (> 65504), underflow and absorption (1 + 1e-4 == 1)
inside the chain never show. :func:`emulate` rewrites such a model into a float32 model in which
every tensor that was float16 is computed in float32 by its producer and then rounded to fp16
and back by an explicit ``Cast(to=FLOAT16) -> Cast(to=FLOAT)`` pair (onnxruntime keeps explicit
Casts when graph optimizations are off), so each fp16 value is exactly what an fp16 device
computing that op once in wider precision and storing it in fp16 would hold (Ascend's Cube and
Vector units accumulate in fp32 and store fp16):

    y16 = Op(a16, b16)   =>   y_raw = Op(a32, b32); y = Cast(Cast(y_raw, FLOAT16), FLOAT)

Rules: float16 initializers (sparse ones too), Constant/ConstantOfShape values and ``to``/``dtype`` attributes
become float32 (exact: every fp16 value is a float32 value); graph inputs and outputs typed
float16 become float32 (:class:`Emulated` feeds and returns them as float16, so the caller sees
the original interface); subgraphs (If/Loop/Scan bodies) are rewritten the same way; model-local
functions are inlined first so their intermediates are rounded too. A tensor whose type shape
inference cannot tell is computed in float32 without rounding (logged at WARNING).
"""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from graphpass.ir.graph import graph_protos

__all__ = ["has_fp16", "emulate", "Emulated"]

log = logging.getLogger(__name__)

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT
_TYPE_ATTRS = ("to", "dtype")


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0


def has_fp16(model: onnx.ModelProto) -> bool:
    """Whether the model declares, stores or casts to float16 anywhere (functions included)."""
    def graph_has(g: onnx.GraphProto) -> bool:
        for sub in graph_protos(g):
            if any(_elem(v) == F16 for v in list(sub.input) + list(sub.output) + list(sub.value_info)):
                return True
            if any(t.data_type == F16 for t in sub.initializer):
                return True
            if any(t.values.data_type == F16 for t in sub.sparse_initializer):
                return True
            if any(_node_has(n) for n in sub.node):
                return True
        return False

    def _node_has(n: onnx.NodeProto) -> bool:
        for a in n.attribute:
            if a.name in _TYPE_ATTRS and a.type == onnx.AttributeProto.INT and a.i == F16:
                return True
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == F16:
                return True
        return False

    if graph_has(model.graph):
        return True
    return any(any(_node_has(n) for n in f.node) for f in model.functions)


class _Names:
    def __init__(self, model: onnx.ModelProto):
        self.used = {o for g in graph_protos(model.graph) for n in g.node for o in list(n.output) + list(n.input)}
        self.used |= {v.name for g in graph_protos(model.graph) for v in list(g.input) + list(g.output)}
        self.used |= {t.name for g in graph_protos(model.graph) for t in g.initializer}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}{k}"
        self.used.add(name)
        return name


def _to_f32_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    out = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
    return out


def _rewrite(graph: onnx.GraphProto, types: Mapping[str, int], names: _Names, stats: dict) -> None:
    inner = {v.name: _elem(v) for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    inner.update({t.name: t.data_type for t in graph.initializer})
    scope = {**types, **{k: v for k, v in inner.items() if v}}
    for k, t in enumerate(graph.initializer):
        if t.data_type == F16:
            graph.initializer[k].CopyFrom(_to_f32_tensor(t))
    for sp in graph.sparse_initializer:
        if sp.values.data_type == F16:
            sp.values.CopyFrom(_to_f32_tensor(sp.values))
    for vi in list(graph.input) + list(graph.output):
        if _elem(vi) == F16:
            vi.type.tensor_type.elem_type = F32
    del graph.value_info[:]  # types changed: let onnxruntime infer them again
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for a in node.attribute:
            if a.name in _TYPE_ATTRS and a.type == onnx.AttributeProto.INT and a.i == F16:
                a.i = F32
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == F16:
                a.t.CopyFrom(_to_f32_tensor(a.t))
            elif a.type == onnx.AttributeProto.GRAPH:
                _rewrite(a.g, scope, names, stats)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rewrite(g, scope, names, stats)
        nodes.append(node)
        for k, out in enumerate(node.output):
            if not out:
                continue
            t = scope.get(out, 0)
            if t == 0:
                stats["untyped"] += 1
                continue
            if t != F16:
                continue
            raw, half = names(out + "__fp32"), names(out + "__fp16")
            node.output[k] = raw
            nodes.append(onnx.helper.make_node("Cast", [raw], [half], to=F16, name=names(out + "__round16")))
            nodes.append(onnx.helper.make_node("Cast", [half], [out], to=F32, name=names(out + "__back32")))
            stats["rounded"] += 1
    del graph.node[:]
    graph.node.extend(nodes)


def emulate(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """A float32 copy of ``model`` whose every fp16 tensor is rounded to fp16 where it is made.

    Returns the model and stats (``rounded`` tensors, ``untyped`` outputs left unrounded).
    A model without float16 comes back unchanged (not copied).
    """
    stats = {"rounded": 0, "untyped": 0}
    if not has_fp16(model):
        return model, stats
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if m.functions:
        try:
            from onnx import inliner

            m = inliner.inline_local_functions(m)
        except Exception as e:  # pragma: no cover - onnx without the inliner, or a body it refuses
            log.warning("fp16 emulation: local functions not inlined (%s): their intermediates are not rounded", e)
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception as e:
        log.warning("fp16 emulation: shape inference failed (%s): only declared types are known", e)
        inferred = m
    types: dict[str, int] = {}
    for g in graph_protos(inferred.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if _elem(vi):
                types[vi.name] = _elem(vi)
        for t in g.initializer:
            types[t.name] = t.data_type
    _rewrite(m.graph, types, _Names(m), stats)
    if stats["untyped"]:
        log.warning("fp16 emulation: %d tensor(s) of unknown type computed without fp16 rounding", stats["untyped"])
    return m, stats


class Emulated:
    """A model ready to run with fp16 emulation: ``run(feeds)`` takes and returns the original dtypes."""

    def __init__(self, model: onnx.ModelProto, session_factory):
        self.model, self.stats = emulate(model)
        self.active = self.model is not model
        self.fp16_inputs = {v.name for v in model.graph.input if _elem(v) == F16}
        self.fp16_outputs = {v.name for v in model.graph.output if _elem(v) == F16}
        self.session = session_factory(self.model)

    def feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.active:
            return dict(feeds)
        # rounded through float16 first: an fp16 input holds fp16 values whatever the caller passed
        return {k: (np.asarray(v).astype(np.float16).astype(np.float32) if k in self.fp16_inputs else v)
                for k, v in feeds.items()}

    def outputs(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.active:
            return dict(values)
        return {k: (np.asarray(v).astype(np.float16) if k in self.fp16_outputs else v) for k, v in values.items()}
