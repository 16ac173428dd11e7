"""Concat chains merged and Split/Slice re-chunking removed.

    Concat(axis=a)(..., Concat(axis=a)(p, q), ...)          =>  Concat(axis=a)(..., p, q, ...)
    Concat(axis=a)(Split(axis=a)(x) outputs, all, in order) =>  x
    Slice(Slice(x, s1, e1, axes1), s2, e2, axes2), steps 1  =>  Slice(x, composed starts/ends)

All exact. The inner Concat must have no other reader; the Split's outputs must be read only by
that Concat; Slices compose on static shapes with unit steps (indices resolved and clamped as
ONNX defines them).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RuleCounts, RulePass, Scope
from graphpass.ir.shapes import static_shape

__all__ = ["MergeConcats"]


def _axis(node: gs.Node, rank: int | None) -> int | None:
    a = int(node.attrs.get("axis", 0))
    if a < 0:
        return None if rank is None else a + rank
    return a


def _rank(t: gs.Tensor) -> int | None:
    s = t.shape
    return len(s) if s is not None else None


def _slice_params(node: gs.Node, shape: list[int]):
    """(starts, ends) per axis of a unit-step Slice, resolved against ``shape``; None if unknown."""
    if len(node.inputs) < 3 or not all(isinstance(t, gs.Constant) for t in node.inputs[1:3]):
        return None
    starts = [int(v) for v in np.asarray(node.inputs[1].values).ravel()]
    ends = [int(v) for v in np.asarray(node.inputs[2].values).ravel()]
    rank = len(shape)
    if len(node.inputs) > 3 and node.inputs[3].name:
        if not isinstance(node.inputs[3], gs.Constant):
            return None
        axes = [int(a) % rank for a in np.asarray(node.inputs[3].values).ravel()]
    else:
        axes = list(range(len(starts)))
    if len(node.inputs) > 4 and node.inputs[4].name:
        if not isinstance(node.inputs[4], gs.Constant) or any(int(s) != 1 for s in np.asarray(node.inputs[4].values).ravel()):
            return None
    out = {}
    for a, s, e in zip(axes, starts, ends):
        d = shape[a]
        s = max(0, min(d, s + d if s < 0 else s))
        e = max(0, min(d, e + d if e < 0 else e))
        out[a] = (s, max(s, e))
    return out


class _SplitConcat(Rule):
    """Case 2: a Concat of every output of a same-axis Split, in order, is the Split's input."""

    pattern = ("Concat",)

    def match(self, node: gs.Node, scope: Scope) -> Match | None:
        if node.op != "Concat" or node.domain not in (None, "", "ai.onnx") or not node.inputs:
            return None
        axis = _axis(node, _rank(node.outputs[0]))
        first = scope.producer(node.inputs[0], "Split")
        if (first is None or axis is None or _axis(first, _rank(first.inputs[0])) != axis
                or len(node.inputs) != len(first.outputs) or not all(a is b for a, b in zip(node.inputs, first.outputs))
                or not all(scope.single_reader(t) for t in first.outputs) or scope.is_output(node.outputs[0])):
            return None
        return scope.match([first, node])

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("split_concat_removed")
        return m.nodes[0].inputs[0]


class _Splice(Rule):
    """Case 1: a Concat input produced by a same-axis Concat read only here is spliced in."""

    pattern = ("Concat",)

    def match(self, node: gs.Node, scope: Scope) -> Match | None:
        if node.op != "Concat" or node.domain not in (None, "", "ai.onnx"):
            return None
        axis = _axis(node, _rank(node.outputs[0]))
        if axis is None:
            return None
        inputs, spliced = [], []
        for t in node.inputs:
            p = scope.producer(t, "Concat")
            if p is not None and _axis(p, _rank(p.outputs[0])) == axis and scope.single_reader(t):
                inputs.extend(p.inputs)
                spliced.append(p)
            else:
                inputs.append(t)
        if not spliced:
            return None
        m = scope.match(spliced + [node])
        m.inputs = inputs
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("concats_merged", len(m.nodes) - 1)
        return m.copy(m.anchor, inputs=m.inputs)


class _Slices(Rule):
    """Case 3: Slice -> Slice with unit steps and static shapes becomes one Slice."""

    pattern = ("Slice", "Slice")

    def match(self, node: gs.Node, scope: Scope) -> Match | None:
        m = super().match(node, scope)
        if m is None:
            return None
        inner = m.nodes[0]
        x, mid = static_shape(inner.inputs[0]), static_shape(node.inputs[0])
        if x is None or mid is None:
            return None
        a, b = _slice_params(inner, x), _slice_params(node, mid)
        if a is None or b is None:
            return None
        comp = dict(a)
        for axis, (s, e) in b.items():
            base = a.get(axis, (0, x[axis]))[0]
            comp[axis] = (base + s, base + e)
        m.composed = comp
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        inner, node = m.nodes
        comp, names = m.composed, m.names
        axes = sorted(comp)
        m.count("slices_composed")
        return m.copy(node, inputs=[inner.inputs[0],
                                    gs.Constant(names("slice_starts"), np.array([comp[k][0] for k in axes], np.int64)),
                                    gs.Constant(names("slice_ends"), np.array([comp[k][1] for k in axes], np.int64)),
                                    gs.Constant(names("slice_axes"), np.array(axes, np.int64))])


@register
class MergeConcats(RulePass):
    """Flattens Concat chains, drops Split->Concat round trips, composes Slice chains.

    Cases:
      1. a Concat input produced by a same-axis Concat read only here is spliced in;
      2. a Concat of every output of a same-axis Split, in order, is the Split's input;
      3. Slice -> Slice with unit steps and static shapes becomes one Slice.
    """

    name = "merge_concats"
    summary = "Merge Concat chains, remove Split->Concat round trips, compose Slice chains."
    kind = PassKind.FUSION
    promise = EXACT
    ascend_name = None

    rules = (_SplitConcat(), _Splice(), _Slices())

    def summarize(self, counts: RuleCounts) -> dict:
        keys = ("concats_merged", "split_concat_removed", "slices_composed")
        return {**{k: counts.total(k) for k in keys}, "rules": counts}
