import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.passes.framework import PassContext
from graphpass.passes.lowering import LowerReflectPad
from graphpass.testing import assert_equivalent, make_model, ops, ort_run

NASTY = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3.4e38, -3.4e38, 1.5, -2.5], np.float32)


def _pad(shape, pads, opset=17, axes=None, elem=TensorProto.FLOAT, out=None):
    inits = {"pads": np.array(pads, np.int64)}
    inputs = ["x", "pads"]
    if opset < 11:
        node = helper.make_node("Pad", ["x"], ["y"], mode="reflect", pads=list(pads))
        inits = {}
    else:
        if axes is not None:
            inits["axes"] = np.array(axes, np.int64)
            inputs += ["", "axes"]
        node = helper.make_node("Pad", inputs, ["y"], mode="reflect")
    return make_model([node], {"x": (elem, shape)}, {"y": (elem, out)}, initializers=inits, opset=opset)


def _run(model, target="ascend910a"):
    graph = gp.load(model).graph
    ctx = PassContext(target=target)
    result = LowerReflectPad()(graph, ctx)
    return graph, result, ctx


def _feeds(shape, dtype=np.float32):
    n = int(np.prod(shape))
    if np.issubdtype(dtype, np.floating):
        vals = np.resize(NASTY, n).astype(dtype)
    elif dtype == np.bool_:
        vals = (np.arange(n) % 3 == 0)
    else:
        vals = (np.arange(n) * 7919 - 13).astype(dtype)
    return {"x": vals.reshape(shape)}


@pytest.mark.parametrize("opset", [10, 11, 13, 18, 21])
def test_reflect_pad_becomes_slices_and_concats_bitwise(opset):
    shape = [2, 3, 5, 6]
    model = _pad(shape, [0, 0, 2, 1, 0, 0, 3, 5], opset=opset)
    graph, result, _ = _run(model)
    assert result.modified and result.stats["fired"] == 1
    assert "Pad" not in ops(graph)
    # H (2, 3): two reversed Slices; W, the last axis (step 1 only on AI Core): 1 -> a unit-step Slice, 5 -> a Gather
    assert ops(graph).count("Concat") == 2 and ops(graph).count("Slice") == 3 and ops(graph).count("Gather") == 1
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds(shape), exact=True)


def test_axes_input_with_negative_axes_opset18():
    shape = [2, 4, 7]
    model = _pad(shape, [1, 3, 2, 0], opset=18, axes=[-1, 1])
    graph, result, _ = _run(model)
    assert result.modified and ops(graph).count("Concat") == 2
    after = gp.to_proto(graph)
    assert_equivalent(model, after, feeds=_feeds(shape), exact=True)
    y = ort_run(after, _feeds(shape))["y"]
    np.testing.assert_array_equal(y, np.pad(_feeds(shape)["x"], [(0, 0), (3, 0), (1, 2)], mode="reflect"))


@pytest.mark.parametrize("dtype,elem", [(np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE),
                                        (np.int32, TensorProto.INT32), (np.int64, TensorProto.INT64),
                                        (np.uint8, TensorProto.UINT8), (np.int8, TensorProto.INT8)])
def test_every_dtype_is_copied_exactly(dtype, elem):
    shape = [1, 2, 4, 4]
    model = _pad(shape, [0, 0, 3, 3, 0, 0, 3, 3], elem=elem)
    graph, result, _ = _run(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds(shape, dtype), exact=True)


def test_one_element_sides_are_unit_step_slices():
    shape = [2, 3, 4]
    model = _pad(shape, [0, 1, 1, 0, 1, 1])
    graph, result, _ = _run(model)
    assert result.modified and "Gather" not in ops(graph)
    for n in graph.nodes:
        if n.op == "Slice":
            assert list(n.inputs[4].values) == [1]
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds(shape), exact=True)


def test_symbolic_sizes_and_an_empty_batch():
    model = _pad(["n", 2, "h", "w"], [0, 0, 1, 2, 0, 0, 1, 2])
    graph, result, _ = _run(model)
    assert result.modified
    after = gp.to_proto(graph)
    for shape in ([3, 2, 4, 5], [0, 2, 3, 3]):
        assert_equivalent(model, after, feeds=_feeds(shape), exact=True)


def test_refused_with_reasons():
    cases = [
        (_pad([1, 2, 3, 3], [0, 0, 3, 0, 0, 0, 0, 0]), "reflect needs a pad below the size"),
        (_pad([1, 2, 5, 5], [0, 0, -1, 0, 0, 0, 1, 0]), "negative pads"),
        (_pad([1, 2, 5, 5], [0, 0, 0, 0, 0, 0, 0, 0]), "no axis is padded"),
    ]
    const = make_model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")], {"x": [1, 2, 5, 5]},
                       {"y": None}, initializers={"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})
    cases.append((const, "mode=constant"))
    dyn = make_model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": [1, 2, 5, 5],
                     "p": (TensorProto.INT64, [8])}, {"y": None})
    cases.append((dyn, "the pads are not a constant"))
    for model, reason in cases:
        graph, result, ctx = _run(model)
        assert not result.modified
        assert reason in ctx.explanations[0].reason, ctx.explanations


def test_needs_a_target_and_is_skipped_under_none():
    model = _pad([1, 2, 5, 5], [0, 0, 1, 1, 0, 0, 1, 1])
    with pytest.raises(UsageError, match="needs a hardware target"):
        _run(model, target="none")
    result = gp.optimize(model, target="none")
    assert "Pad" in result.report.ops_after


def test_cost_model_prices_the_gain_and_the_pipeline_fires():
    model = _pad([1, 16, 64, 64], [0, 0, 3, 3, 0, 0, 3, 3])
    target = gp.Target.load("ascend910a")
    before = target.estimate(model)
    assert any(n["engine"] == "AICPU" and "reflect" in n["note"] for n in before.nodes)
    result = gp.optimize(model)
    assert "Pad" not in result.report.ops_after
    after = target.estimate(result.model)
    assert after.total_us < before.total_us
    assert not any(n["engine"] == "AICPU" for n in after.nodes)
    assert "Gather" in result.report.ops_after  # the last axis: no Slice with step -1 (CANN: step 1 only there)
    assert_equivalent(model, gp.to_proto(result.model), feeds=_feeds([1, 16, 64, 64]), exact=True)
    onnx.checker.check_model(gp.to_proto(result.model), full_check=True)
