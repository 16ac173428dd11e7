"""Transpose cancellation and merging.

    Transpose(p1) -> Transpose(p2)            =>  Transpose([p1[j] for j in p2])
    Transpose(p) with p the identity          =>  removed
    Transpose(p1) -> Transpose(p2), composed identity  =>  both removed

A Transpose without ``perm`` reverses the axes; it is handled when the rank is known. The first
Transpose stays if something else reads its output. A graph output keeps its producer (the
composed Transpose), so graph output names never change.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RuleCounts, RulePass, Scope

__all__ = ["MergeTransposes"]


def _perm(node: gs.Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = node.inputs[0].shape if node.inputs else None
    if shape is None:
        return None
    return list(range(len(shape)))[::-1]


class _Compose(Rule):
    """Case 1: T1 -> T2 becomes one Transpose (T1 stays if read elsewhere); case 2 if the
    composition is the identity."""

    pattern = ("Transpose", "Transpose")
    exclusive = False

    def check(self, m: Match, ctx) -> MatchResult:
        first, node = m.nodes
        p1, p2 = _perm(first), _perm(node)
        if p1 is None or p2 is None or len(p1) != len(p2):
            return MatchResult.fail("a permutation is unknown (no perm and an unknown rank) or the ranks differ")
        m.perm = [p1[j] for j in p2]
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        first, node = m.nodes
        m.count("merged")
        if m.perm == list(range(len(m.perm))) and not m.writes_graph_output():
            m.count("identity_removed")
            return first.inputs[0]
        return m.copy(node, inputs=[first.inputs[0]], attrs={"perm": m.perm})


class _Identity(Rule):
    """Case 2: a Transpose whose permutation is the identity (not writing a graph output)."""

    pattern = ("Transpose",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or not anchor.inputs or scope.is_output(anchor.outputs[0]):
            return None
        p = _perm(anchor)
        return m if p is not None and p == list(range(len(p))) else None

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("identity_removed")
        return m.anchor.inputs[0]


@register
class MergeTransposes(RulePass):
    """Composes consecutive Transposes and drops identity ones.

    Cases:
      1. T1 -> T2: T2 reads T1's input with the composed permutation;
      2. a Transpose whose permutation is the identity disappears (unless it writes a graph output);
      3. T1 left without readers is removed.
    """

    name = "merge_transposes"
    summary = "Compose consecutive Transposes; remove identity Transposes."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    rules = (_Compose(), _Identity())

    def summarize(self, counts: RuleCounts) -> dict:
        return {"merged": counts.total("merged"), "identity_removed": counts.total("identity_removed"), "rules": counts}
