import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.passes.framework import PassContext
from graphpass.passes.lowering import LowerConv1dToConv2d
from graphpass.testing import assert_equivalent, make_model, ops

NASTY = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3.0e38, 1.5, -2.5, 0.25, 7.0], np.float32)
RNG = np.random.default_rng(0)


def _w(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _run(model, target="ascend910a"):
    graph = gp.load(model).graph
    ctx = PassContext(target=target)
    return graph, LowerConv1dToConv2d()(graph, ctx), ctx


def _feeds(shapes, nasty=True, dtype=np.float32):
    out = {}
    for k, shape in shapes.items():
        v = RNG.standard_normal(shape).astype(dtype)
        if nasty:
            flat = v.reshape(-1)
            flat[: min(flat.size, NASTY.size)] = NASTY[: min(flat.size, NASTY.size)]
        out[k] = v
    return out


def _then_pointwise(node, x_shape, inits, cout, elem=TensorProto.FLOAT, dtype=np.float32, inputs=None):
    """``node`` (writing "c") followed by a pointwise 1-D Conv: a region of two convs."""
    inits = dict(inits, wp=_w(3, cout, 1, dtype=dtype))
    second = helper.make_node("Conv", ["c", "wp"], ["y"], kernel_shape=[1])
    return make_model([node, second], inputs or {"x": (elem, x_shape)}, {"y": (elem, None)}, initializers=inits)


def _chain(opset=17):
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Add", ["r", "bias"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 0], dilations=[2])]
    return make_model(nodes, {"x": [2, 4, 17]}, {"y": [2, 6, 7]},
                      initializers={"w1": _w(8, 4, 3), "b1": _w(8), "bias": _w(8, 1), "w2": _w(6, 8, 3)}, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_a_chain_is_converted_together_bitwise(opset):
    model = _chain(opset)
    graph, result, _ = _run(model)
    assert result.modified and result.stats["convs"] == 2 and result.stats["elementwise"] == 2
    assert ops(graph) == ["Unsqueeze", "Conv", "Relu", "Add", "Conv", "Squeeze"]
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert convs[1].attrs["pads"] == [0, 1, 0, 0] and convs[1].attrs["dilations"] == [1, 2]
    assert convs[1].attrs["strides"] == [1, 2] and list(convs[0].inputs[1].values.shape) == [8, 4, 1, 3]
    assert graph.outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [2, 4, 17]}), exact=True)


def test_conv_transpose_grouped_with_output_padding():
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], kernel_shape=[4], strides=[3],
                            output_padding=[2], group=2, pads=[1, 2], dilations=[1])
    model = _then_pointwise(node, [1, 4, 9], {"w": _w(4, 3, 4), "b": _w(6)}, 6)
    graph, result, _ = _run(model)
    assert result.modified and ops(graph) == ["Unsqueeze", "ConvTranspose", "Conv", "Squeeze"]
    assert [n for n in graph.nodes if n.op == "ConvTranspose"][0].attrs["output_padding"] == [0, 2]
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 4, 9]}), exact=True)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad(auto_pad):
    node = helper.make_node("Conv", ["x", "w"], ["c"], auto_pad=auto_pad, strides=[2])
    model = _then_pointwise(node, [1, 3, 10], {"w": _w(5, 3, 4)}, 5)
    graph, result, _ = _run(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 10]}), exact=True)


@pytest.mark.parametrize("dtype,elem", [(np.float16, TensorProto.FLOAT16)])  # onnxruntime CPU has no double Conv
def test_other_float_dtypes(dtype, elem):
    node = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3])
    model = _then_pointwise(node, [1, 3, 8], {"w": _w(2, 3, 3, dtype=dtype)}, 2, elem=elem, dtype=dtype)
    graph, result, _ = _run(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 8]}, dtype=dtype), exact=True)


def test_values_read_outside_the_region_get_a_squeeze_and_keep_their_names():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["s", "w"], ["y"], kernel_shape=[1])]
    model = make_model(nodes, {"x": [1, 3, 5]}, {"y": [1, 3, 5], "t": [1, 5, 3]}, initializers={"w": _w(3, 3, 1)})
    graph, result, _ = _run(model)
    assert result.stats["squeezes"] == 2  # c (for the Transpose) and y (a graph output)
    assert sorted(t.name for t in graph.outputs) == ["t", "y"]
    assert [np.ndim(n.inputs[1].values) for n in graph.nodes if n.op == "Conv"] == [4, 4]
    assert len({id(n.inputs[1]) for n in graph.nodes if n.op == "Conv"}) == 1  # a shared weight reshaped once
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 5]}), exact=True)


def test_runtime_weight_is_unsqueezed():
    node = helper.make_node("Conv", ["x", "w"], ["c"])
    model = _then_pointwise(node, None, {}, 2, inputs={"x": [1, 3, 6], "w": [2, 3, 2]})
    graph, result, _ = _run(model)
    assert result.modified and ops(graph).count("Unsqueeze") == 2
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 6], "w": [2, 3, 2]}), exact=True)


def test_not_fired_on_2d_or_unknown_ranks_with_reason():
    conv2d = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 6, 6]}, {"y": None},
                        initializers={"w": _w(2, 3, 2, 2)})
    graph, result, ctx = _run(conv2d)
    assert not result.modified and not ctx.explanations
    unknown = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": (TensorProto.FLOAT, None), "w": (TensorProto.FLOAT, None)}, {"y": None})
    graph, result, ctx = _run(unknown)
    assert not result.modified
    assert "rank is unknown" in ctx.explanations[0].reason


def test_a_lone_conv_is_left_to_atc_with_the_reason():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3]), helper.make_node("Relu", ["c"], ["y"])],
                       {"x": [1, 3, 8]}, {"y": None}, initializers={"w": _w(2, 3, 3)})
    graph, result, ctx = _run(model)
    assert not result.modified and ops(graph) == ["Conv", "Relu"]
    assert "no fewer than ATC's parser adds itself" in ctx.explanations[0].reason


def test_a_conv_longer_than_the_ai_core_input_w_runs_along_h():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[2, 2], strides=[3])]
    model = make_model(nodes, {"x": [1, 3, 6000]}, {"y": None}, initializers={"w": _w(4, 3, 3), "w2": _w(2, 4, 5)})
    target = gp.Target.load("ascend910a")
    before = target.estimate(model)
    assert [n["engine"] for n in before.nodes] == ["AICPU", "AICORE", "AICPU"]
    graph, result, _ = _run(model)
    assert result.modified
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert [list(c.inputs[1].values.shape[2:]) for c in convs] == [[3, 1], [5, 1]]
    assert convs[1].attrs["pads"] == [2, 0, 2, 0] and convs[1].attrs["strides"] == [3, 1]
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 6000]}), exact=True)
    result = gp.optimize(model)
    after = target.estimate(result.model)
    assert "AICPU" not in [n["engine"] for n in after.nodes] and after.total_us < before.total_us
    # a lone wide conv goes too: it leaves AI CPU
    lone = make_model([nodes[0]], {"x": [1, 3, 6000]}, {"c": None}, initializers={"w": _w(4, 3, 3)})
    graph, result, _ = _run(lone)
    assert result.modified and ops(graph) == ["Unsqueeze", "Conv", "Squeeze"]
    assert_equivalent(lone, gp.to_proto(graph), feeds=_feeds({"x": [1, 3, 6000]}), exact=True)


def test_needs_a_target():
    with pytest.raises(UsageError, match="needs a hardware target"):
        _run(_chain(), target="none")
    assert "Squeeze" not in gp.optimize(_chain(), target="none").report.ops_after


def test_whisper_encoder_convs_become_2d_with_one_unsqueeze_and_one_squeeze():
    path = "tests/data/exporters/whisper.dynamo.onnx"
    before = gp.load(path)
    proto = gp.to_proto(before)
    counts0 = {op: ops(before.graph).count(op) for op in ("Conv", "Squeeze", "Unsqueeze")}
    graph, result, _ = _run(proto)
    assert result.stats["convs"] == 2 and result.stats["elementwise"] == 10  # both GELUs lifted with them
    counts1 = {op: ops(graph).count(op) for op in ("Conv", "Squeeze", "Unsqueeze")}
    assert counts1 == {"Conv": counts0["Conv"], "Squeeze": counts0["Squeeze"] + 1, "Unsqueeze": counts0["Unsqueeze"] + 1}
    target = gp.Target.load("ascend910a")
    assert target.estimate(graph).total_us < target.estimate(proto).total_us
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(proto, after, exact=True)
