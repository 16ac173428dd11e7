import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.passes.framework import PassContext
from graphpass.passes.lowering import SplitLargeKernelConv
from graphpass.passes.lowering.split_large_kernel_conv import kernel_pieces
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(0)
TOL = SplitLargeKernelConv.promise


def _conv(ks, shape, bias=True, group=1, cin=2, cout=4, **attrs):
    w = (RNG.standard_normal([cout, cin // group] + ks) * 0.05).astype(np.float32)
    inits = {"w": w}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(cout).astype(np.float32)
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], group=group, **attrs)
    return make_model([node], {"x": shape}, {"y": None}, initializers=inits)


def _run(model, target="ascend910a"):
    graph = gp.load(model).graph
    ctx = PassContext(target=target)
    return graph, SplitLargeKernelConv()(graph, ctx), ctx


def _x(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[[3, 40, 41, 100]] = [np.nan, np.inf, -np.inf, -0.0]
    return {"x": x}


def test_kernel_pieces_cover_the_kernel_within_the_limit():
    for k, limit in ((256, 255), (300, 255), (511, 255), (1000, 255), (765, 255)):
        pieces = kernel_pieces(k, limit)
        assert pieces[0][0] == 0 and pieces[-1][1] == k
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        assert all(0 < e - s <= limit for s, e in pieces) and len(pieces) == -(-k // limit)


@pytest.mark.parametrize("ks,pads,shape", [
    ([1, 300], [0, 5, 0, 7], [1, 2, 3, 400]),
    ([1, 300], [0, 150, 0, 149], [1, 2, 3, 300]),   # 'same' padding, as a long audio filter has
    ([1, 600], [0, 0, 0, 0], [1, 2, 3, 700]),       # three pieces
    ([260, 3], [10, 1, 20, 1], [1, 2, 265, 30]),    # along H
    ([300, 280], [0, 0, 0, 0], [1, 2, 310, 290]),   # both axes: four pieces
    ([400], [3, 4], [1, 2, 500]),                   # a 1-D Conv
])
def test_split_within_the_declared_tolerance(ks, pads, shape):
    model = _conv(ks, shape, pads=pads)
    graph, result, _ = _run(model)
    assert result.modified
    convs = [n for n in graph.nodes if n.op == "Conv"]
    assert len(convs) == np.prod([len(kernel_pieces(k, 255)) if k > 255 else 1 for k in ks])
    assert all(max(c.attrs["kernel_shape"]) <= 255 for c in convs)
    assert sum(len(c.inputs) == 3 for c in convs) == 1  # the bias once
    assert ops(graph)[-1] == "Sum"
    assert_equivalent(model, gp.to_proto(graph), feeds=_x(shape), rtol=TOL.rtol, atol=TOL.atol)


def test_grouped_without_bias():
    model = _conv([1, 270], [1, 4, 2, 300], bias=False, group=2, cin=4, cout=4, pads=[0, 3, 0, 3])
    graph, result, _ = _run(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), feeds=_x([1, 4, 2, 300]), rtol=TOL.rtol, atol=TOL.atol)


def test_refused_with_reasons():
    cases = [
        (_conv([3, 3], [1, 2, 8, 8]), "within the Cube's limit"),
        (_conv([1, 300], [1, 2, 3, 400], strides=[1, 2]), "stride 2, dilation 1 on the split axis 3"),
        (_conv([1, 300], [1, 2, 3, 400], auto_pad="SAME_UPPER"), "auto_pad=SAME_UPPER"),
        (_conv([1, 256], [1, 2, 3, 100], pads=[0, 300, 0, 0]), "reads padding only"),
        (_conv([1, 300], [1, 2, 3, "w"]), "is not static"),
    ]
    for model, reason in cases:
        graph, result, ctx = _run(model)
        assert not result.modified
        assert reason in ctx.explanations[0].reason, ctx.explanations


def test_cost_model_prices_the_gain_and_none_target_skips():
    model = _conv([1, 300], [1, 2, 3, 400])
    target = gp.Target.load("ascend910a")
    before = target.estimate(model)
    assert before.nodes[0]["engine"] == "AICPU" and "255" in before.nodes[0]["note"]
    result = gp.optimize(model)
    assert result.report.ops_after["Conv"] == 2
    assert target.estimate(result.model).total_us < before.total_us
    onnx.checker.check_model(gp.to_proto(result.model), full_check=True)
    with pytest.raises(UsageError, match="needs a hardware target"):
        _run(model, target="none")
    assert gp.optimize(model, target="none").report.ops_after["Conv"] == 1
