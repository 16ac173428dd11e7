import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass import verify as V
from graphpass.cost_model import create
from graphpass.infra import PassContext
from graphpass.passes import lower_dynamic_topk
from graphpass.testing import check_full, make_model, ops, ort_run

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import dbnet_loss  # noqa: E402

I64 = TensorProto.INT64


def _model(reducer="ReduceSum", keepdims=0, use_indices=False, extra_consumer=None):
    outs = ["v", "i"]
    nodes = [helper.make_node("TopK", ["x", "k"], outs, axis=1)]
    nodes.append(helper.make_node(reducer, ["v"], ["y"], keepdims=keepdims) if reducer else helper.make_node("Relu", ["v"], ["y"]))
    outputs = {"y": [] if not keepdims and reducer else [2, 1]}
    if reducer and reducer != "Relu":
        outputs = {"y": [1, 1] if keepdims else []}
    if use_indices:
        outputs["i"] = (I64, [2, None])
    if extra_consumer:
        nodes.append(helper.make_node(extra_consumer, ["v"], ["z"]))
        outputs["z"] = [2, None]
    model = make_model(nodes, {"x": [2, 10], "k": (I64, [1])}, outputs)
    return model


def _run_k(model, k, seed=0):
    x = np.random.default_rng(seed).standard_normal((2, 10)).astype(np.float32)
    return ort_run(model, {"x": x, "k": np.array([k], np.int64)})


@pytest.mark.parametrize("reducer", ["ReduceSum", "ReduceMean"])
def test_runtime_k_reduction_becomes_static_topk_and_mask(reducer):
    model = _model(reducer)
    graph = gp.load(model)
    result = lower_dynamic_topk(graph)
    assert result.stats["lowered"] == 1
    topk = next(n for n in graph.nodes if n.op == "TopK")
    assert np.asarray(topk.inputs[1].values).tolist() == [10]  # static: the whole axis
    assert "Less" in ops(graph)
    out = gp.to_proto(graph)
    check_full(out)
    for k in range(0, 11):
        a, b = _run_k(model, k, seed=k), _run_k(out, k, seed=k)
        np.testing.assert_allclose(b["y"], a["y"], rtol=1e-6, atol=1e-6, equal_nan=True)
    assert not create().estimate(graph).dynamic_regions


@pytest.mark.parametrize("kwargs, reason", [
    ({"use_indices": True}, "indices are used"),
    ({"reducer": None}, "feed Relu"),
])
def test_other_consumers_are_refused_with_reason(kwargs, reason):
    graph = gp.load(_model(**kwargs))
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert reason in ctx.explanations[0].reason
    assert create().estimate(graph).dynamic_regions  # still host-scheduled


def test_constant_k_is_already_static():
    model = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"]), helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)],
                       {"x": [2, 10]}, {"y": []}, initializers={"k": np.array([3], np.int64)})
    graph = gp.load(model)
    result = lower_dynamic_topk(graph)
    assert not result.modified and result.stats["static_k"] == 1


def test_dbnet_loss_is_equal_on_20_batches_and_has_no_dynamic_shape_left():
    model = dbnet_loss.build()
    result = gp.optimize(model)
    graph = result.graph
    assert all(not (n.op == "TopK" and not hasattr(n.inputs[1], "values")) for n in graph.nodes)
    assert not create().estimate(graph).dynamic_regions
    out = gp.to_proto(graph)
    check_full(out)
    sa, sb = V.session(model), V.session(out)
    positives = set()
    for feeds in dbnet_loss.batches(20):
        positives.add(float((feeds["gt"] * feeds["mask"]).sum() > 0) + float(feeds["gt"].min() == 1))
        a, b = V.run(sa, feeds), V.run(sb, feeds)
        np.testing.assert_allclose(b["loss_out"], a["loss_out"], rtol=1e-5)
    assert positives == {0.0, 1.0, 2.0}  # no positives, some, all
