"""Static-shape specialization.

    input x: [N, 3, H, W]  with  --input-shape x:1,3,640,640   =>  input x: [1, 3, 640, 640]
    then shape inference, so fold_constants turns Shape -> Gather -> ... -> Reshape into constants

A fixed dimension in the model that disagrees with the given shape, a rank mismatch, or a name
that is not a graph input is a usage error, never a silent override.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.ir.inference import check_input_shape
from graphpass.ir.shapes import refresh_shapes

__all__ = ["SpecializeShapes", "apply_input_shapes"]


def apply_input_shapes(graph: gs.Graph, input_shapes: dict[str, list[int]]) -> int:
    """Set the given graph input shapes; returns how many inputs changed.

    Raises:
        UsageError: unknown input name, rank mismatch, or conflict with a fixed dimension.
    """
    inputs = {t.name: t for t in graph.inputs}
    changed = 0
    for name, shape in input_shapes.items():
        t = inputs.get(name)
        old = t.shape if t is not None else None
        model_dims = None if old is None else [d if isinstance(d, int) else None for d in old]
        shape = check_input_shape(name, shape, list(inputs), model_dims)
        if old is None or list(old) != shape:
            t.shape = shape
            changed += 1
    return changed


@register
class SpecializeShapes(Pass):
    """Fixes dynamic graph-input dims from ``ctx.input_shapes`` and re-infers every shape.

    Cases:
      1. a symbolic or unknown dim gets the given value;
      2. an already equal shape is left alone (the pass reports no change).
    """

    name = "specialize_shapes"
    summary = "Fix dynamic input dims (--input-shape) and re-run shape inference."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    run_once = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        if not ctx.input_shapes:
            return PassResult(False, {"inputs_fixed": 0})
        changed = apply_input_shapes(graph, ctx.input_shapes)
        updated = refresh_shapes(graph) if changed else 0
        return PassResult(changed > 0, {"inputs_fixed": changed, "shapes_updated": updated})
