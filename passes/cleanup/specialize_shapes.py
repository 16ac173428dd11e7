"""Static-shape specialization.

    input x: [N, 3, H, W]  with  --input-shape x:1,3,640,640   =>  input x: [1, 3, 640, 640]
    input x: [N, 3, H, W]  with  --input-shape x:1,3,-1,-1     =>  input x: [1, 3, H, W]
    inputs x: [batch, S], m: [batch, S]  with  --dim batch=1   =>  x: [1, S], m: [1, S]
    then shape inference, so fold_constants turns Shape -> Gather -> ... -> Reshape into constants

A fixed dimension in the model that disagrees with the given shape, a rank mismatch, or a name
that is not a graph input is a usage error, never a silent override.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.ir.inference import KEEP_DYNAMIC, resolve_input_shapes
from graphpass.ir.shapes import given_shapes, record_given, refresh_shapes, substitute_dims

__all__ = ["SpecializeShapes", "apply_input_shapes"]


def _dims_of(t: gs.Tensor):
    if t.shape is None:
        return None
    return [int(d) if isinstance(d, (int, np.integer)) and d >= 0 else (d if isinstance(d, str) and d else None)
            for d in t.shape]


def apply_input_shapes(graph: gs.Graph, input_shapes: dict[str, list[int]],
                       dims: dict[str, int] | None = None) -> int:
    """Set the given graph input shapes (-1: keep that dim) and symbolic dims (``dims``: name ->
    value, wherever the name appears); returns how many inputs changed. Every tensor shape that
    names a fixed symbol takes its value (the exporter's value_info is stale once an input is
    fixed; shape inference replaces the rest).

    Raises:
        UsageError: unknown input or dim name, rank mismatch, conflict with a fixed dimension or
            between ``input_shapes`` and ``dims``.
    """
    return _specialize(graph, input_shapes, dims)[0]


def _specialize(graph: gs.Graph, input_shapes, dims) -> tuple[int, int]:
    """(inputs changed, other tensors whose shape named a fixed symbol)."""
    inputs = {t.name: t for t in graph.inputs}
    already = given_shapes(graph)["dims"]
    shapes, fixed = resolve_input_shapes({n: _dims_of(t) for n, t in inputs.items()}, input_shapes, dims, already)
    changed = 0
    for name, shape in shapes.items():
        t = inputs[name]
        old = list(t.shape) if t.shape is not None else [None] * len(shape)
        new = [old[k] if v == KEEP_DYNAMIC else v for k, v in enumerate(shape)]
        if t.shape is None or list(t.shape) != new:
            t.shape = new
            changed += 1
    substituted = substitute_dims(graph, fixed)
    if changed:  # a number declared on a standard op's graph output was traced: inference sizes it again
        for t in graph.outputs:
            producer = t.inputs[0] if isinstance(t, gs.Variable) and len(t.inputs) == 1 else None
            if producer is not None and (producer.domain or "") in ("", "ai.onnx") and t.shape is not None \
                    and any(isinstance(d, (int, np.integer)) for d in t.shape):
                t.shape = None
                substituted += 1
    record_given(graph, shapes, fixed)
    return changed, substituted


@register
class SpecializeShapes(Pass):
    """Fixes dynamic graph-input dims from ``ctx.input_shapes`` and ``ctx.dims`` and re-infers
    every shape.

    Cases:
      1. a symbolic or unknown dim gets the given value; -1 keeps the model's dim;
      2. a symbolic dim named in ``ctx.dims`` (or fixed on one input by ``input_shapes``) takes
         its value on every input and every tensor that names it;
      3. an already equal shape is left alone (the pass reports no change).
    """

    name = "specialize_shapes"
    summary = "Fix dynamic input dims (--input-shape, --dim) and re-run shape inference."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    run_once = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        if not ctx.input_shapes and not ctx.dims:
            return PassResult(False, {"inputs_fixed": 0})
        changed, substituted = _specialize(graph, ctx.input_shapes, ctx.dims)
        updated = substituted + (refresh_shapes(graph, forget_stale=True) if changed or substituted else 0)
        return PassResult(changed + substituted > 0, {"inputs_fixed": changed, "shapes_updated": updated})
