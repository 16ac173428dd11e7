import numpy as np
import onnx
from onnx import helper

import graphpass as gp
from graphpass.passes.framework import PassContext
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
        graph = gp.load(model).graph
        result = fuse_conv_bias(graph)
        assert result.stats["fired"] == 1 and ops(graph) == ["Conv"]
        assert graph.nodes[0].outputs[0].name == "y" and len(graph.nodes[0].inputs) == 3
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)


def test_spatial_addend_is_refused_with_reason():
    model = _model(RNG.standard_normal((1, 6, 6, 6)).astype(np.float32))
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_bias(graph, ctx).modified
    assert "not per output channel" in ctx.explanations[0].reason


def test_runtime_addend_is_refused():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Add", ["conv", "z"], ["y"])],
                       {"x": [1, 3, 8, 8], "z": [1, 6, 6, 6]}, {"y": [1, 6, 6, 6]},
                       initializers={"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_bias(graph, ctx).modified and "not a constant" in ctx.explanations[0].reason


def _refusal(model):
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_bias(graph, ctx).modified
    return ctx.explanations[0].reason


def test_addend_of_higher_rank_than_the_output_is_refused():
    # [1,1,6,1,1] + a 4-D Conv output is 5-D: folding it into the bias would drop a dimension
    for shape in ((1, 1, 6, 1, 1), (1, 1, 1, 1, 1)):
        addend = RNG.standard_normal(shape).astype(np.float32)
        model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Add", ["conv", "c"], ["y"])],
                           {"x": [1, 3, 8, 8]}, {"y": [1, 1, 6, 6, 6]},
                           initializers={"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32), "c": addend})
        assert "would broadcast the rank-4 output up" in _refusal(model)


def test_batchnorm_addend_of_higher_rank_or_unknown_rank_is_refused():
    bn_in = {k: RNG.uniform(0.5, 1.5, 6).astype(np.float32) for k in ("s", "b", "m", "v")}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Add", ["bn", "c"], ["y"])]
    model = make_model(nodes, {"x": [2, 6, 5]}, {"y": [1, 2, 6, 5]},
                       initializers={**bn_in, "c": RNG.standard_normal((1, 1, 6, 1)).astype(np.float32)})
    assert "would broadcast the rank-3 output up" in _refusal(model)
    # the rank of x unknown: a [6,1,1] addend could broadcast a 3-D BN output into another shape
    model = make_model(nodes, {"x": (onnx.TensorProto.FLOAT, None)}, {"y": (onnx.TensorProto.FLOAT, None)},
                       initializers={**bn_in, "c": RNG.standard_normal((6, 1, 1)).astype(np.float32)})
    assert "unknown" in _refusal(model)


def test_addend_that_would_move_inf_or_nan_is_refused_with_reason():
    for value, conv_bias, reason in ((np.inf, False, "holds inf or NaN"), (np.nan, True, "holds inf or NaN"),
                                     (3.4e38, True, "overflows float32")):
        addend = np.zeros((6, 1, 1), np.float32)
        addend[1] = value
        model = _model(addend, conv_bias=conv_bias)
        if conv_bias:
            for t in model.graph.initializer:
                if t.name == "b":
                    t.CopyFrom(onnx.numpy_helper.from_array(np.full(6, 3.4e38, np.float32), "b"))
        assert reason in _refusal(model), value


def test_conv_without_bias_gets_the_addend_exactly():
    # the missing bias is -0.0, the additive identity: a -0.0 addend stays -0.0
    addend = np.array([-0.0, 0.0, 1.5, -2.0, -0.0, 3.0], np.float32).reshape(6, 1, 1)
    graph = gp.load(_model(addend)).graph
    assert fuse_conv_bias(graph).modified
    bias = np.asarray(graph.nodes[0].inputs[2].values)
    assert np.array_equal(bias.view(np.uint32), addend.ravel().view(np.uint32))


def test_batchnorm_then_per_channel_add_joins_the_bn_bias():
    # case 4: BatchNormalization(x, s, B, m, v) -> Add(d) is one BatchNormalization with bias B + d
    bn_in = {k: RNG.uniform(0.5, 1.5, 6).astype(np.float32) for k in ("s", "b", "m", "v")}
    for shape, add_first in (((1, 6, 1, 1), False), ((6, 1, 1), True), ((1,), False)):
        d = RNG.standard_normal(shape).astype(np.float32)
        add = helper.make_node("Add", ["d", "bn"] if add_first else ["bn", "d"], ["y"])
        model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]), add],
                           {"x": [2, 6, 5, 5]}, {"y": [2, 6, 5, 5]}, initializers={**bn_in, "d": d})
        graph = gp.load(model).graph
        result = fuse_conv_bias(graph)
        assert result.stats["fired"] == 1 and ops(graph) == ["BatchNormalization"], shape
        bias = np.asarray(graph.nodes[0].inputs[2].values)
        np.testing.assert_array_equal(bias, (bn_in["b"] + np.broadcast_to(d.reshape(-1), (6,))).astype(np.float32))
        assert graph.nodes[0].outputs[0].name == "y"
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)


def test_batchnorm_bias_and_addend_that_cancel_fold_to_zero():
    # B + d = 0 exactly (1 + -1): a sum that is 0 is exact, nothing to refuse
    bn_in = {k: RNG.uniform(0.5, 1.5, 6).astype(np.float32) for k in ("s", "m", "v")}
    bn_in["b"] = np.ones(6, np.float32)
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
                        helper.make_node("Add", ["bn", "d"], ["y"])],
                       {"x": [2, 6, 5, 5]}, {"y": [2, 6, 5, 5]}, initializers={**bn_in, "d": -np.ones((6, 1, 1), np.float32)})
    graph = gp.load(model).graph
    assert fuse_conv_bias(graph).stats["fired"] == 1
    np.testing.assert_array_equal(graph.nodes[0].inputs[2].values, np.zeros(6, np.float32))
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)


def test_conv_bias_and_addend_that_cancel_fold_to_zero():
    # b + c = 0 exactly: a sum that is 0 is exact, nothing to refuse (only a product can round
    # a nonzero parameter to zero)
    model = _model(np.zeros((6, 1, 1), np.float32), conv_bias=True)
    inits = {t.name: t for t in model.graph.initializer}
    b = onnx.numpy_helper.to_array(inits["b"])
    inits["c"].CopyFrom(onnx.numpy_helper.from_array(-b.reshape(6, 1, 1), "c"))
    graph = gp.load(model).graph
    assert fuse_conv_bias(graph).stats["fired"] == 1 and ops(graph) == ["Conv"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[2].values, np.zeros(6, np.float32))
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)
