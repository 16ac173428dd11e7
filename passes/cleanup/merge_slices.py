"""Consecutive Slices merged into one.

    Slice(Slice(x, s1, e1, a1, t1), s2, e2, a2, t2)  =>  Slice(x, s, e, a, t)

Axes cut by only one of the two keep that Slice's own start, end and step (slicing different axes
commutes, whatever the shape: symbolic dims included). An axis cut by both takes the indices
r1[r2], where r1 is what the first Slice takes along the axis and r2 what the second takes
of len(r1): again an arithmetic progression, written back as one start, end and step
(``_slices.as_bounds``; a backward slice through index 0 ends at INT64_MIN). That needs the
axis length static. Both forms: Slice-1's attributes (a merged Slice-1 has unit steps, as both
of its parts) and Slice-10's inputs (the merged parameters are int64). Exact: the same elements,
in the same order. A chain of k Slices becomes one in one walk (the merged node is the
producer the next Slice sees).

Left alone, with the reason: runtime starts/ends/axes/steps; a negative axis on an input of
unknown rank; an axis cut by both whose length is not static; an end of INT64_MAX with a
negative step on an axis cut by both (onnxruntime reads it as "through the front", the spec
as "nothing": ``_shape_values.slice_indices``); a first Slice read by something else (it
would stay, and nothing would be saved).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.cleanup._slices import SliceParams, as_bounds, slice_params, taken
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass

__all__ = ["MergeSlices"]


def _rank(t: gs.Tensor) -> int | None:
    return len(t.shape) if t.shape is not None else None


def _dim(t: gs.Tensor, axis: int) -> int | None:
    if t.shape is None or axis >= len(t.shape):
        return None
    d = t.shape[axis]
    return int(d) if isinstance(d, (int, np.integer)) and d >= 0 else None


class _SliceSlice(Rule):
    """Cases 1 (disjoint axes) and 2 (an axis cut by both)."""

    pattern = ("Slice", "Slice")

    def check(self, m: Match, ctx) -> MatchResult:
        first, second = m.nodes
        x = first.inputs[0]
        p1 = slice_params(first, _rank(x))
        if isinstance(p1, str):
            return MatchResult.fail(f"the first Slice: {p1}")
        p2 = slice_params(second, _rank(x))
        if isinstance(p2, str):
            return MatchResult.fail(f"the second Slice: {p2}")
        merged = {a: (s, e, t) for a, s, e, t in zip(p1.axes, p1.starts, p1.ends, p1.steps)}
        for k, a in enumerate(p2.axes):
            if a not in merged:  # case 1
                merged[a] = (p2.starts[k], p2.ends[k], p2.steps[k])
                continue
            n = _dim(x, a)  # case 2
            if n is None:
                return MatchResult.fail(f"axis {a} is cut by both Slices and its length is not static")
            r1 = taken(p1, p1.axes.index(a), n)
            r2 = taken(p2, k, len(r1)) if r1 is not None else None
            if r1 is None or r2 is None:
                return MatchResult.fail(f"axis {a}: an end of INT64_MAX with a negative step "
                                        "(onnxruntime and the ONNX spec take different elements)")
            step = r1.step * r2.step
            both = range(r1[r2[0]], r1[r2[0]] + len(r2) * step, step) if len(r2) else range(0)
            bounds = as_bounds(both, n)
            if bounds is None:
                return MatchResult.fail(f"axis {a}: the composed indices are not one Slice")
            merged[a] = bounds
        if p1.attr_form and any(t != 1 for _, _, t in merged.values()):
            return MatchResult.fail("a Slice-1 cannot take a step")  # pragma: no cover - both have unit steps
        m.merged, m.attr_form = merged, p1.attr_form
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        first, second = m.nodes
        axes = sorted(m.merged)
        starts, ends, steps = ([m.merged[a][i] for a in axes] for i in range(3))
        m.count("merged")
        if m.attr_form:
            return m.copy(second, inputs=[first.inputs[0]], attrs={"starts": starts, "ends": ends, "axes": axes})
        base = second.name or "slice"
        consts = [gs.Constant(m.names(f"{base}_{what}"), np.array(v, dtype=np.int64))
                  for what, v in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
        return m.copy(second, inputs=[first.inputs[0], *consts])


@register
class MergeSlices(RulePass):
    """Merges a Slice of a Slice into one Slice.

    Cases:
      1. the two cut different axes: the parameters are put together (any shape);
      2. both cut one axis of static length: the composed indices as one start, end, step
         (non-unit and negative steps, clamped and out-of-range bounds, INT64_MIN ends);
      3. Slice-1 (attributes) and Slice-10+ (inputs), negative axes given the input's rank.
    """

    name = "merge_slices"
    summary = "Slice of a Slice -> one Slice (disjoint axes put together; a shared static axis composed)."
    kind = PassKind.CLEANUP
    promise = EXACT
    rules = (_SliceSlice(),)
