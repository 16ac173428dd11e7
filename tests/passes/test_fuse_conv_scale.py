import numpy as np
import onnx
from onnx import helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes import fuse_conv_bias, fuse_conv_scale
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(2)


def _model(scale, conv_bias=False, mul_first=False, group=1, then_add=False):
    cin = 6 if group > 1 else 3
    inits = {"w": RNG.standard_normal((6, cin // group, 3, 3)).astype(np.float32), "s": scale}
    ins = ["x", "w"] + (["b"] if conv_bias else [])
    if conv_bias:
        inits["b"] = RNG.standard_normal(6).astype(np.float32)
    out = "m" if then_add else "y"
    nodes = [helper.make_node("Conv", ins, ["conv"], group=group),
             helper.make_node("Mul", ["s", "conv"] if mul_first else ["conv", "s"], [out])]
    if then_add:
        inits["d"] = RNG.standard_normal((1, 6, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["m", "d"], ["y"]))
    return make_model(nodes, {"x": [1, cin, 8, 8]}, {"y": [1, 6, 6, 6]}, initializers=inits)


def test_per_channel_and_scalar_scales_go_into_the_weights():
    cases = [RNG.uniform(0.5, 2, (1, 6, 1, 1)), RNG.uniform(0.5, 2, (6, 1, 1)), np.array([0.5])]
    for scale, conv_bias, mul_first, group in zip(cases, (False, True, False), (False, True, True), (1, 2, 1)):
        model = _model(scale.astype(np.float32), conv_bias, mul_first, group)
        graph = gp.load(model).graph
        result = fuse_conv_scale(graph)
        assert result.stats["fired"] == 1 and ops(graph) == ["Conv"]
        assert graph.nodes[0].outputs[0].name == "y"
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)
        onnx.checker.check_model(gp.to_proto(graph), full_check=True)


def test_caffe_scale_layer_conv_mul_add_becomes_one_conv():
    model = _model(RNG.uniform(0.5, 2, (1, 6, 1, 1)).astype(np.float32), then_add=True)
    graph = gp.load(model).graph
    assert fuse_conv_scale(graph).stats["fired"] == 1 and fuse_conv_bias(graph).stats["fired"] == 1
    assert ops(graph) == ["Conv"]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_spatial_scale_or_shared_weights_are_refused_with_reason():
    model = _model(RNG.standard_normal((1, 6, 6, 6)).astype(np.float32))
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_scale(graph, ctx).modified
    assert "not per output channel" in ctx.explanations[0].reason
    # the same weight read by a second Conv: scaling it would change the other one
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c1"]), helper.make_node("Mul", ["c1", "s"], ["y"]),
                        helper.make_node("Conv", ["x", "w"], ["z"])], {"x": [1, 3, 8, 8]},
                       {"y": [1, 6, 6, 6], "z": [1, 6, 6, 6]}, initializers={"w": w, "s": np.float32(2.0)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_scale(graph, ctx).modified
    assert "shared" in ctx.explanations[0].reason


def test_batchnorm_then_scale_and_shift_fold_into_the_batchnorm():
    """DenseNet's pre-activation BN -> Mul -> Add (a BN after a Concat cannot fold into a Conv)."""
    c = 6
    inits = {"s": RNG.uniform(0.5, 1.5, c).astype(np.float32), "b": RNG.standard_normal(c).astype(np.float32),
             "m": RNG.standard_normal(c).astype(np.float32), "v": RNG.uniform(0.5, 1.5, c).astype(np.float32),
             "k": RNG.uniform(0.5, 2, (c, 1, 1)).astype(np.float32), "d": RNG.standard_normal((1, c, 1, 1)).astype(np.float32)}
    model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
                        helper.make_node("Mul", ["n", "k"], ["p"]), helper.make_node("Add", ["d", "p"], ["r"]),
                        helper.make_node("Relu", ["r"], ["y"])], {"x": [2, c, 5, 5]}, {"y": [2, c, 5, 5]}, initializers=inits)
    graph = gp.load(model).graph
    assert fuse_conv_scale(graph).stats["fired"] == 1 and fuse_conv_bias(graph).stats["fired"] == 1
    assert ops(graph) == ["BatchNormalization", "Relu"]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_scale_of_higher_rank_than_the_output_is_refused():
    # [1,1,6,1,1] * a 4-D Conv output is 5-D: folding it into the weights would drop a dimension
    model = make_model([helper.make_node("Conv", ["x", "w"], ["conv"]), helper.make_node("Mul", ["conv", "s"], ["y"])],
                       {"x": [1, 3, 8, 8]}, {"y": [1, 1, 6, 6, 6]},
                       initializers={"w": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32),
                                     "s": RNG.uniform(0.5, 2, (1, 1, 6, 1, 1)).astype(np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_scale(graph, ctx).modified
    assert "would broadcast the rank-4 output up" in ctx.explanations[0].reason


def test_scale_that_would_move_inf_or_nan_is_refused_with_reason():
    # an inf scale: Conv * inf is ±inf per element, a folded sum of ±inf weights is NaN;
    # 1e-45 rounds nonzero weights to 0 (inf input: NaN, where the original gives ±inf);
    # 3e38 overflows a weight (|W| > 1.13)
    for value, reason in ((np.inf, "holds inf or NaN"), (np.nan, "holds inf or NaN"), (1e-45, "rounds a nonzero"),
                          (3e38, "overflows float32")):
        scale = np.ones((1, 6, 1, 1), np.float32)
        scale[0, 2] = value
        graph = gp.load(_model(scale)).graph
        ctx = PassContext()
        assert not fuse_conv_scale(graph, ctx).modified
        assert reason in ctx.explanations[0].reason, value


def test_batchnorm_scale_that_would_move_inf_or_nan_is_refused_with_reason():
    # BN -> Mul(k): the same guards as for a Conv (k folds into the BN's scale and bias)
    c = 6
    inits = {"s": RNG.uniform(0.5, 1.5, c).astype(np.float32), "b": RNG.uniform(0.5, 1.5, c).astype(np.float32),
             "m": RNG.standard_normal(c).astype(np.float32), "v": RNG.uniform(0.5, 1.5, c).astype(np.float32)}
    inits["s"][2] = 0.25  # 0.25 * 1e-45 rounds to 0 in float32
    for value, reason in ((np.inf, "holds inf or NaN"), (1e-45, "rounds a nonzero")):
        k = np.ones((c, 1, 1), np.float32)
        k[2] = value
        model = make_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
                            helper.make_node("Mul", ["n", "k"], ["y"])], {"x": [2, c, 5, 5]}, {"y": [2, c, 5, 5]},
                           initializers={**inits, "k": k})
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not fuse_conv_scale(graph, ctx).modified and ops(graph) == ["BatchNormalization", "Mul"]
        assert reason in ctx.explanations[0].reason, value


def test_scale_that_rounds_a_nonzero_bias_to_zero_is_refused_with_reason():
    # weights fine, but 0.25 * 1e-45 (the least float32 subnormal) is 0 in the bias: an inf
    # input would give NaN there, where the unfolded graph gives ±inf
    model = _model(np.full((1, 6, 1, 1), 0.25, np.float32), conv_bias=True)
    inits = {t.name: t for t in model.graph.initializer}
    b = onnx.numpy_helper.to_array(inits["b"]).copy()
    b[2] = 1e-45
    inits["b"].CopyFrom(onnx.numpy_helper.from_array(b, "b"))
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_scale(graph, ctx).modified and ops(graph) == ["Conv", "Mul"]
    assert "scale (into the bias) rounds a nonzero" in ctx.explanations[0].reason
