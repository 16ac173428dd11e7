"""Small passes and a cost model the framework tests share (wrong or dishonest on purpose)."""

from onnx import helper

from graphpass.cost_model import CostModel, CostReport
from graphpass.ir.graph import count_nodes
from graphpass.passes.framework import Pass, PassKind, PassResult
from graphpass.testing import make_model


def chain_model():
    """x -> Identity -> Relu -> Transpose -> Transpose -> Neg -> y (something for every cleanup)."""
    return make_model([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                       helper.make_node("Transpose", ["b"], ["c"], perm=[1, 0]),
                       helper.make_node("Transpose", ["c"], ["d"], perm=[1, 0]),
                       helper.make_node("Neg", ["d"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})


class BreakRelu(Pass):
    """A deliberately wrong rewrite: Relu -> Neg."""

    name = "break_relu"
    summary = "Relu -> Neg, wrong on purpose"
    kind = PassKind.FUSION

    def run(self, graph, ctx):
        hit = [n for n in graph.nodes if n.op == "Relu"]
        for n in hit:
            n.op = "Neg"
        return PassResult(bool(hit), {"broken": len(hit)})


class Liar(Pass):
    """Changes the graph and says it did not."""

    name = "liar"
    summary = "changes the graph and says it did not"
    kind = PassKind.CLEANUP

    def run(self, graph, ctx):
        graph.nodes.pop()
        return PassResult(False)


class NegCost(CostModel):
    """Cost = 10 per Neg + 1 per node: BreakRelu's Relu -> Neg looks worse."""

    target = "test"

    def estimate(self, graph, **kw):
        return CostReport("test", float(sum(10 for n in graph.nodes if n.op == "Neg") + count_nodes(graph)))
