import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.passes.framework import PassContext
from graphpass.passes.lowering import SplitAvgPool
from graphpass.testing import assert_equivalent, make_model, ops, ort_run

RNG = np.random.default_rng(0)
TOL = SplitAvgPool.promise


def _pool(shape=(1, 2, 40, 45), elem=TensorProto.FLOAT, opset=17, **attrs):
    attrs.setdefault("kernel_shape", [16, 17])
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    return make_model([node], {"x": (elem, list(shape))}, {"y": (elem, None)}, opset=opset)


def _run(model, target="ascend910a"):
    graph = gp.load(model).graph
    ctx = PassContext(target=target)
    return graph, SplitAvgPool()(graph, ctx), ctx


def _x(shape, dtype=np.float32, special=True):
    x = RNG.standard_normal(shape).astype(dtype)
    if special:
        flat = x.reshape(-1)
        flat[[0, 50, 300, 301, 900]] = [np.nan, np.inf, -np.inf, np.inf, -0.0]
    return {"x": x}


@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("pads,strides", [([0, 0, 0, 0], [16, 17]), ([3, 2, 1, 4], [5, 7]), ([0, 5, 2, 0], [1, 1])])
def test_split_into_h_then_w_within_tolerance(ceil_mode, count_include_pad, pads, strides):
    model = _pool(pads=pads, strides=strides, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    graph, result, _ = _run(model)
    assert result.modified and ops(graph) == ["AveragePool", "AveragePool"]
    h, w = graph.nodes
    assert h.attrs["kernel_shape"] == [16, 1] and w.attrs["kernel_shape"] == [1, 17]
    assert h.attrs["strides"] == [strides[0], 1] and w.attrs["strides"] == [1, strides[1]]
    assert h.attrs["pads"] == [pads[0], 0, pads[2], 0] and w.attrs["pads"] == [0, pads[1], 0, pads[3]]
    # NaN and +-inf positions and signs exact, the rest within the declared tolerance
    assert_equivalent(model, gp.to_proto(graph), feeds=_x([1, 2, 40, 45]), rtol=TOL.rtol, atol=TOL.atol)


def test_float16():  # onnxruntime's CPU AveragePool has float and float16 kernels only
    for dtype, elem in ((np.float16, TensorProto.FLOAT16),):
        model = _pool(elem=elem)
        graph, result, _ = _run(model)
        assert result.modified
        feeds = _x([1, 2, 40, 45], dtype)
        a, b = ort_run(model, feeds)["y"], ort_run(gp.to_proto(graph), feeds)["y"]
        rtol = 2e-3 if dtype == np.float16 else TOL.rtol
        np.testing.assert_allclose(b, a, rtol=rtol, atol=1e-3 if dtype == np.float16 else TOL.atol)


def test_auto_pad_valid_becomes_explicit_zero_pads():
    model = _pool(auto_pad="VALID", strides=[3, 2])
    graph, result, _ = _run(model)
    assert result.modified and all("auto_pad" not in n.attrs for n in graph.nodes)
    assert_equivalent(model, gp.to_proto(graph), feeds=_x([1, 2, 40, 45]), rtol=TOL.rtol, atol=TOL.atol)


def test_empty_batch():
    model = _pool(shape=("n", 2, 40, 45))
    graph, result, _ = _run(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.zeros((0, 2, 40, 45), np.float32)}, exact=True)


def test_refused_with_reasons():
    cases = [
        (_pool(kernel_shape=[3, 3]), "runs on AI Core on ascend910a"),
        (_pool(shape=(1, 1, 300, 4), kernel_shape=[260, 2]), "still over the AI Core's limit"),
        (_pool(auto_pad="SAME_UPPER"), "auto_pad=SAME_UPPER"),
        (_pool(shape=(1, 1, 300), kernel_shape=[290]), "only 2-D pools"),
    ]
    for model, reason in cases:
        graph, result, ctx = _run(model)
        assert not result.modified
        assert reason in ctx.explanations[0].reason, ctx.explanations


def test_cost_model_prices_the_gain_and_none_target_skips():
    at_limit = _pool(shape=(1, 16, 64, 64), kernel_shape=[16, 16], strides=[16, 16])  # 256: CANN's limit, not over
    assert not _run(at_limit)[1].modified
    model = _pool(shape=(1, 16, 64, 68), kernel_shape=[16, 17], strides=[16, 17])
    target = gp.Target.load("ascend910a")
    before = target.estimate(model)
    assert [n["engine"] for n in before.nodes] == ["AICPU"]
    result = gp.optimize(model)
    assert result.report.ops_after["AveragePool"] == 2
    assert target.estimate(result.model).total_us < before.total_us
    onnx.checker.check_model(gp.to_proto(result.model), full_check=True)
    with pytest.raises(UsageError, match="needs a hardware target"):
        _run(model, target="none")
    assert gp.optimize(model, target="none").report.ops_after["AveragePool"] == 1
