"""A Split of a constant-index Gather along the same axis becomes one Gather per part.

    Gather(x, idx, axis=a) -> Split(axis=a, sizes s1..sk)  =>  Gather(x, idx[0:s1]), ..., Gather(x, idx[..:])

With ``fuse_channel_shuffle`` before it, ShuffleNetV2's stride-1 block boundary
``Concat -> shuffle -> Split(2)`` becomes ``Concat -> two Gathers``: seed 002's
IndexSelectHalfImplementation (``cat`` followed by two ``index_select``s; the two halves
interleave both concatenated inputs, so the concatenation itself stays). Exact.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.shapes import static_shape

__all__ = ["FuseGatherSplit"]


def _split_sizes(split: gs.Node, total: int) -> list[int] | None:
    if len(split.inputs) > 1 and split.inputs[1].name:
        t = split.inputs[1]
        return [int(v) for v in np.asarray(t.values).ravel()] if isinstance(t, gs.Constant) else None
    if "split" in split.attrs:
        return [int(v) for v in split.attrs["split"]]
    k = int(split.attrs.get("num_outputs", len(split.outputs)))
    if k <= 0:
        return None
    per = -(-total // k)  # opset 18: the last part may be smaller
    return [min(per, total - i * per) for i in range(k)]


class _GatherSplit(RewriteRule):
    pattern = ("Gather", "Split")

    def check(self, m: Match, ctx) -> MatchResult:
        gather, split = m.nodes
        idx = gather.inputs[1]
        if not isinstance(idx, gs.Constant) or np.asarray(idx.values).ndim != 1:
            return MatchResult.fail("the Gather's indices are not a constant 1-D tensor")
        out = static_shape(gather.outputs[0])
        axis = int(gather.attrs.get("axis", 0))
        if out is None:
            return MatchResult.fail("the Gather's output shape is unknown")
        axis = axis + len(out) if axis < 0 else axis
        s_axis = int(split.attrs.get("axis", 0))
        if (s_axis + len(out) if s_axis < 0 else s_axis) != axis:
            return MatchResult.fail(f"Split along axis {s_axis}, Gather along axis {axis}")
        sizes = _split_sizes(split, out[axis])
        if sizes is None or sum(sizes) != out[axis] or len(sizes) != len(split.outputs):
            return MatchResult.fail("the Split sizes are not constant or do not cover the axis")
        m.sizes = sizes
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        gather, split = m.nodes
        idx = np.asarray(gather.inputs[1].values)
        outs = list(split.outputs)
        split.outputs.clear()
        start = 0
        for k, (size, out) in enumerate(zip(m.sizes, outs)):
            part = gs.Constant(m.names(f"{gather.inputs[1].name}_part{k}"), idx[start:start + size].copy())
            node = gs.Node("Gather", name=m.names(f"{gather.name or 'gather'}_part{k}"), inputs=[gather.inputs[0], part],
                           outputs=[out], attrs={"axis": int(gather.attrs.get("axis", 0))})
            m.graph.nodes.append(node)
            A.mark_created(node, FuseGatherSplit.name, replaced=[gather, split])
            start += size
        return [gather, split]


@register
class FuseGatherSplit(RulePass):
    """Replaces Gather + Split along one axis by one Gather per Split output.

    Cases:
      1. Split sizes as an input (opset 13+), an attribute (before 13) or equal parts (num_outputs);
      2. negative axes.
    """

    name = "fuse_gather_split"
    summary = "Gather followed by Split along the same axis -> one Gather per part (no Split)."
    kind = PassKind.FUSION
    promise = EXACT
    rules = (_GatherSplit(),)
