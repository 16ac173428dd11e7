"""Declarative rewrite rules: a pattern written in op names, a ``check`` that says why it
refuses, and a ``rewrite`` (the onnxscript rewriter's split; tinygrad's rule tables).

A pattern is a producer -> consumer chain of op types, matched backwards from its last op (the
anchor): ``("Conv", "BatchNormalization")`` matches a BatchNormalization whose input
``follow[i]`` comes from a Conv of the same graph that nobody else reads. Each node is visited
once per pass run, so a rule pass is linear in the graph size.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Sequence

import onnx_graphsurgeon as gs

from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.pass_base import MatchResult, Pass, PassResult
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes

__all__ = ["Match", "RewriteRule", "RulePass", "single_reader"]


@dataclasses.dataclass
class Match:
    """The matched nodes, producer first, anchor last; ``graph`` is the scope they live in and
    ``root`` the model's top graph (where model-level things such as local functions go)."""

    nodes: list[gs.Node]
    graph: gs.Graph
    names: NameGen
    root: gs.Graph | None = None

    @property
    def anchor(self) -> gs.Node:
        return self.nodes[-1]


def single_reader(t: gs.Tensor, graph: gs.Graph) -> bool:
    """``t`` is read by exactly one node and is not an output of ``graph``."""
    return len(t.outputs) == 1 and not any(o is t for o in graph.outputs)


def _std(node: gs.Node) -> bool:
    return node.domain in (None, "", "ai.onnx")


class RewriteRule:
    """Subclass and set ``pattern``; override ``check`` and ``rewrite``.

    ``follow[i]`` is which input of ``pattern[i+1]`` leads to ``pattern[i]`` (default 0;
    ``None`` means any input, for commutative ops such as Add).
    """

    pattern: ClassVar[tuple[str, ...]]
    follow: ClassVar[tuple[int | None, ...] | None] = None

    def match(self, anchor: gs.Node, graph: gs.Graph, local: set[int], names: NameGen) -> Match | None:
        if anchor.op != self.pattern[-1] or not _std(anchor):
            return None
        chain = [anchor]
        node = anchor
        follow = self.follow or (0,) * (len(self.pattern) - 1)
        for step in range(len(self.pattern) - 2, -1, -1):
            want = self.pattern[step]
            idx = follow[step]
            candidates = range(len(node.inputs)) if idx is None else [idx]
            found = None
            for i in candidates:
                if i >= len(node.inputs):
                    continue
                t = node.inputs[i]
                p = t.inputs[0] if len(t.inputs) == 1 else None
                if p is not None and id(p) in local and p.op == want and _std(p) and single_reader(t, graph):
                    found = p
                    break
            if found is None:
                return None
            chain.append(found)
            node = found
        return Match(list(reversed(chain)), graph, names)

    def check(self, m: Match, ctx: PassContext) -> MatchResult:
        return MatchResult.success()

    def rewrite(self, m: Match, ctx: PassContext) -> list[gs.Node]:
        """Rewire the graph; return the nodes that are now dead (removed by the pass)."""
        raise NotImplementedError


class RulePass(Pass):
    """A pass that applies ``rules`` at every anchor, explaining every refusal."""

    rules: ClassVar[Sequence[RewriteRule]] = ()
    preserves_order = False  # rewrites append the nodes they create; the manager re-sorts

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        fired = 0
        refused = 0
        names = NameGen(graph)
        anchors = {r.pattern[-1] for r in self.rules}
        for g in list(iter_graphs(graph)):
            local = {id(n) for n in g.nodes}
            dead_ids: set[int] = set()
            dead: list[gs.Node] = []
            for node in list(g.nodes):
                if node.op not in anchors or id(node) in dead_ids:
                    continue
                for rule in self.rules:
                    m = rule.match(node, g, local, names)
                    if m is None or any(id(n) in dead_ids for n in m.nodes):
                        continue
                    m.root = graph
                    verdict = rule.check(m, ctx)
                    if not verdict:
                        refused += 1
                        ctx.explain(self.name, m.anchor, verdict.reason)
                        continue
                    for n in rule.rewrite(m, ctx):
                        if id(n) not in dead_ids:
                            dead_ids.add(id(n))
                            n.inputs.clear()
                            n.outputs.clear()
                            dead.append(n)
                    fired += 1
                    break
            remove_nodes(g, dead)
        return PassResult(fired > 0, {"fired": fired, "refused": refused})
