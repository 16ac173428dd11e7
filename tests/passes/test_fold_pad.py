import numpy as np
import onnx
from onnx import helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes import fold_pad
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(4)


def _model(op_node, pads=(0, 0, 1, 2, 0, 0, 1, 0), value=None, opset=17, out_shape=(1, 4, 7, 8)):
    inits = {"pads": np.array(pads, np.int64), "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    pad_in = ["x", "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_in.append("v")
    return make_model([helper.make_node("Pad", pad_in, ["p"]), op_node], {"x": [1, 3, 7, 7]}, {"y": list(out_shape)},
                      initializers=inits, opset=opset)


def test_zero_pad_folds_into_conv():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 1, 1, 1])
    model = _model(conv, out_shape=(1, 4, 9, 9))
    graph = gp.load(model).graph
    assert fold_pad(graph).stats["fired"] == 1
    assert ops(graph) == ["Conv"]
    assert list(graph.nodes[0].attrs["pads"]) == [2, 3, 2, 1]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_average_pool_is_refused():
    """Its own padding stays out of the sum: a window of -0.0 would average to -0.0, not +0.0."""
    for attrs in ({}, {"pads": [1, 1, 1, 1], "count_include_pad": 1}):
        pool = helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], **attrs)
        graph = gp.load(_model(pool, out_shape=(1, 3, 9, 9) if attrs else (1, 3, 7, 7))).graph
        ctx = PassContext()
        assert not fold_pad(graph, ctx).modified
        assert "AveragePool leaves its own padding out of the sum" in ctx.explanations[0].reason


def test_refusals_say_why():
    maxpool = helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3])
    for model, reason in (
        (_model(maxpool, out_shape=(1, 3, 6, 6)), "MaxPool pads with -inf"),
        (_model(helper.make_node("Conv", ["p", "w"], ["y"]), value=1.0, out_shape=(1, 4, 7, 6)), "pad value 1.0 is not 0"),
        (_model(helper.make_node("Conv", ["p", "w"], ["y"]), value=-0.0, out_shape=(1, 4, 7, 6)), "pad value -0.0"),
        (_model(helper.make_node("Conv", ["p", "w"], ["y"]), value=1e-45, out_shape=(1, 4, 7, 6)), "is not 0"),
        (_model(helper.make_node("Conv", ["p", "w"], ["y"]), pads=(0, 1, 0, 0, 0, 0, 0, 0), out_shape=(1, 4, 5, 5)),
         "batch or channel"),
    ):
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not fold_pad(graph, ctx).modified
        assert reason in ctx.explanations[0].reason


def test_reflect_and_edge_pads_are_refused():
    for mode in ("reflect", "edge"):
        conv = helper.make_node("Conv", ["p", "w"], ["y"])
        model = _model(conv, out_shape=(1, 4, 7, 6))
        model.graph.node[0].attribute.append(helper.make_attribute("mode", mode))
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not fold_pad(graph, ctx).modified and ops(graph) == ["Pad", "Conv"]
        assert f"Pad mode '{mode}'" in ctx.explanations[0].reason


def test_pad_folds_into_a_conv_without_pads_of_its_own():
    model = _model(helper.make_node("Conv", ["p", "w"], ["y"]), out_shape=(1, 4, 7, 7))
    graph = gp.load(model).graph
    assert fold_pad(graph).stats["fired"] == 1 and ops(graph) == ["Conv"]
    assert list(graph.nodes[0].attrs["pads"]) == [1, 2, 1, 0]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_opset_18_axes_name_the_padded_axes():
    # pads (1, 2) before and (1, 0) after, on axes given as an input (negative ones too)
    for axes in ([2, 3], [-2, -1], [3, 2]):
        pads = [1, 2, 1, 0] if axes[0] != 3 else [2, 1, 0, 1]
        model = make_model([helper.make_node("Pad", ["x", "pads", "", "axes"], ["p"]),
                            helper.make_node("Conv", ["p", "w"], ["y"])], {"x": [1, 3, 7, 7]}, {"y": [1, 4, 7, 7]},
                           initializers={"pads": np.array(pads, np.int64), "axes": np.array(axes, np.int64),
                                         "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)}, opset=18)
        graph = gp.load(model).graph
        assert fold_pad(graph).stats["fired"] == 1 and ops(graph) == ["Conv"], axes
        assert list(graph.nodes[0].attrs["pads"]) == [1, 2, 1, 0], axes
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def _refused(model, reason):
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fold_pad(graph, ctx).modified and ops(graph) == ["Pad", "Conv"]
    assert reason in ctx.explanations[0].reason, (reason, ctx.explanations[0].reason)


def test_runtime_pads_or_axes_negative_pads_and_unknown_rank_are_refused_with_reason():
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv = helper.make_node("Conv", ["p", "w"], ["y"])
    _refused(make_model([helper.make_node("Pad", ["x", "pads"], ["p"]), conv],
                        {"x": [1, 3, 7, 7], "pads": (7, [8])}, {"y": (1, None)}, initializers={"w": w}),
             "pads are not constant and non-negative")
    _refused(make_model([helper.make_node("Pad", ["x", "pads", "", "axes"], ["p"]), conv],
                        {"x": [1, 3, 7, 7], "axes": (7, [2])}, {"y": (1, None)},
                        initializers={"w": w, "pads": np.array([1, 1, 1, 1], np.int64)}, opset=18),
             "pads are not constant and non-negative")
    _refused(_model(conv, pads=(0, 0, 1, 0, 0, 0, -1, 0), out_shape=(1, 4, 5, 5)), "pads are not constant and non-negative")
    _refused(make_model([helper.make_node("Pad", ["x", "pads"], ["p"]), conv], {"x": (1, None)}, {"y": (1, None)},
                        initializers={"w": w, "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}),
             "the padded tensor's rank is unknown or below 3")


def test_pads_on_each_batch_or_channel_side_are_refused():
    for k in (0, 1, 4, 5):  # batch begin, channel begin, batch end, channel end (rank 4)
        pads = [0] * 8
        pads[k] = 1
        out = [1 + (k in (0, 4)), 4, 5, 5]
        model = _model(helper.make_node("Conv", ["p", "w"], ["y"]), pads=pads, out_shape=out)
        if k in (1, 5):  # a padded channel axis needs a weight of 4 input channels
            w = next(t for t in model.graph.initializer if t.name == "w")
            w.CopyFrom(onnx.numpy_helper.from_array(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"))
        _refused(model, "the Pad pads the batch or channel axis")


def test_a_conv_with_auto_pad_is_refused_with_reason():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], auto_pad="SAME_UPPER")
    _refused(_model(conv, out_shape=(1, 4, 8, 9)), "Conv uses auto_pad=")
