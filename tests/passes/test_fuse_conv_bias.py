import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.infra import PassContext
from graphpass.passes import fuse_conv_bias
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(1)


def _model(addend, conv_bias=False, add_first=False):
    inits = {"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32), "c": addend}
    ins = ["x", "w"] + (["b"] if conv_bias else [])
    if conv_bias:
        inits["b"] = RNG.standard_normal(6).astype(np.float32)
    add = helper.make_node("Add", ["c", "conv"] if add_first else ["conv", "c"], ["y"])
    return make_model([helper.make_node("Conv", ins, ["conv"]), add], {"x": [1, 3, 8, 8]}, {"y": [1, 6, 6, 6]},
                      initializers=inits)


def test_per_channel_and_scalar_addends_become_the_bias():
    cases = [RNG.standard_normal((1, 6, 1, 1)), RNG.standard_normal((6, 1, 1)), np.array([0.5])]
    for addend, conv_bias, add_first in zip(cases, (False, True, False), (False, True, True)):
        model = _model(addend.astype(np.float32), conv_bias, add_first)
        graph = gp.load(model)
        result = fuse_conv_bias(graph)
        assert result.stats["fired"] == 1 and ops(graph) == ["Conv"]
        assert graph.nodes[0].outputs[0].name == "y" and len(graph.nodes[0].inputs) == 3
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)


def test_spatial_addend_is_refused_with_reason():
    model = _model(RNG.standard_normal((1, 6, 6, 6)).astype(np.float32))
    graph = gp.load(model)
    ctx = PassContext()
    assert not fuse_conv_bias(graph, ctx).modified
    assert "not per output channel" in ctx.explanations[0].reason


def test_runtime_addend_is_refused():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Add", ["conv", "z"], ["y"])],
                       {"x": [1, 3, 8, 8], "z": [1, 6, 6, 6]}, {"y": [1, 6, 6, 6]},
                       initializers={"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model)
    ctx = PassContext()
    assert not fuse_conv_bias(graph, ctx).modified and "not a constant" in ctx.explanations[0].reason
