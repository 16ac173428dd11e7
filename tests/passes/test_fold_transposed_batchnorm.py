import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion import FoldTransposedBatchNorm
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(0)
TOL = FoldTransposedBatchNorm.promise


def _params(c, var=None):
    return {"scale": RNG.standard_normal(c).astype(np.float32), "bias": RNG.standard_normal(c).astype(np.float32),
            "mean": RNG.standard_normal(c).astype(np.float32),
            "var": (np.abs(RNG.standard_normal(c)) + 0.1).astype(np.float32) if var is None else np.asarray(var, np.float32)}


def _model(shape, p, q, c, var=None, elem=TensorProto.FLOAT, opset=17, **bn_attrs):
    t0 = helper.make_node("Transpose", ["x"], ["t"], **({"perm": p} if p is not None else {}))
    bn = helper.make_node("BatchNormalization", ["t", "scale", "bias", "mean", "var"], ["b"], **bn_attrs)
    t1 = helper.make_node("Transpose", ["b"], ["y"], **({"perm": q} if q is not None else {}))
    return make_model([t0, bn, t1], {"x": (elem, shape)}, {"y": (elem, None)}, initializers=_params(c, var), opset=opset)


def _run(model):
    graph = gp.load(model).graph
    ctx = PassContext()
    return graph, FoldTransposedBatchNorm()(graph, ctx), ctx


def _x(shape):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    flat = x.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45]
    return {"x": x}


@pytest.mark.parametrize("shape,p,q,c", [
    ([2, 5, 6, 3], [0, 3, 1, 2], [0, 2, 3, 1], 3),   # NHWC -> NCHW -> BN -> NHWC
    ([2, 7, 4], [0, 2, 1], [0, 2, 1], 4),            # (N, L, C) as in audio/transformer models
    ([3, 4], None, None, 3),                          # no perm: reversal twice
    ([2, 3, 4, 5, 6], [0, 4, 1, 2, 3], [0, 2, 3, 4, 1], 6),
])
def test_folds_into_mul_add_on_the_channel_axis(shape, p, q, c):
    model = _model(shape, p, q, c)
    graph, result, _ = _run(model)
    assert result.modified and ops(graph) == ["Mul", "Add"]
    s = graph.nodes[0].inputs[1].values
    axis = (p or list(range(len(shape)))[::-1])[1]
    assert s.shape[axis] == c and s.size == c
    assert graph.outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), feeds=_x(shape), rtol=TOL.rtol, atol=TOL.atol)


def test_refused_with_reasons():
    cases = [
        (_model([2, 5, 6, 3], [0, 3, 1, 2], [0, 3, 1, 2], 3), "do not cancel"),
        (_model([2, 7, 4], [0, 2, 1], [0, 2, 1], 4, var=[0, 1, 1, 1], epsilon=0.0), "var + eps <= 0"),
        (_model([2, 7, 4], [0, 2, 1], [0, 2, 1], 4, elem=TensorProto.DOUBLE), "not float32"),
    ]
    for model, reason in cases:
        graph, result, ctx = _run(model)
        assert not result.modified
        assert reason in ctx.explanations[0].reason, ctx.explanations


def test_in_the_pipeline_the_estimate_drops():
    model = _model([1, 64, 64, 32], [0, 3, 1, 2], [0, 2, 3, 1], 32)
    result = gp.optimize(model)
    assert "BatchNormalization" not in result.report.ops_after and "Transpose" not in result.report.ops_after
    target = gp.Target.load("ascend910a")
    assert target.estimate(result.model).total_us < target.estimate(model).total_us
    after = gp.to_proto(result.model)
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(model, after, feeds=_x([1, 64, 64, 32]), rtol=TOL.rtol, atol=TOL.atol)
