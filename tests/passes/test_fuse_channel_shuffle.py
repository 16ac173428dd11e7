import os

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import CostModel
from graphpass.cost_model.report import CostReport
from graphpass.passes.framework import PassContext
from graphpass.passes import fuse_channel_shuffle
from graphpass.passes.fusion.fuse_channel_shuffle import shuffle_permutation
from graphpass.testing import assert_equivalent, make_model, ops


def _shuffle_model(c=12, g=3, zeros=False, perm=(0, 2, 1, 3, 4)):
    s1 = [0, g, c // g, 0, -1] if zeros else [2, g, c // g, 5, 5]
    return make_model([helper.make_node("Reshape", ["x", "s1"], ["r"]),
                       helper.make_node("Transpose", ["r"], ["t"], perm=list(perm)),
                       helper.make_node("Reshape", ["t", "s2"], ["y"])],
                      {"x": [2, c, 5, 5]}, {"y": [2, c, 5, 5]},
                      initializers={"s1": np.array(s1, np.int64), "s2": np.array([2, -1, 5, 5], np.int64)})


def test_permutation_matches_the_reshape_transpose_reshape_definition():
    x = np.arange(12)
    expected = x.reshape(3, 4).T.ravel()
    np.testing.assert_array_equal(x[shuffle_permutation(12, 3)], expected)


def test_shuffle_becomes_gather():
    for zeros in (False, True):
        model = _shuffle_model(zeros=zeros)
        graph = gp.load(model)
        assert fuse_channel_shuffle(graph).stats["fired"] == 1
        assert ops(graph) == ["Gather"]
        gather = graph.nodes[0]
        assert gather.attrs["axis"] == 1 and gather.outputs[0].name == "y"
        assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_not_a_shuffle_is_refused_with_reason():
    graph = gp.load(_shuffle_model(perm=(0, 1, 2, 4, 3)))
    ctx = PassContext()
    assert not fuse_channel_shuffle(graph, ctx).modified
    assert "perm [0, 1, 2, 4, 3]" in ctx.explanations[0].reason


class _PreferTranspose(CostModel):
    target = "test"

    def estimate(self, graph, **kw):
        return CostReport("test", 1.0 if any(n.op == "Transpose" for n in graph.nodes) else 2.0)


def test_cost_model_can_keep_the_transpose():
    graph = gp.load(_shuffle_model())
    ctx = PassContext(cost_model=_PreferTranspose())
    assert not fuse_channel_shuffle(graph, ctx).modified
    assert "prefers the Transpose" in ctx.explanations[0].reason


def test_every_shuffle_of_light_shufflenet_becomes_a_gather(light_path):
    result = gp.optimize(light_path("light_shufflenet.onnx"))
    hist = result.report.ops_after
    assert hist.get("Transpose", 0) == 0 and hist["Gather"] == 16
