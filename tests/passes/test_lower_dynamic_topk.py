import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.check import verify as V
from graphpass.cost_model import create
from graphpass.passes.framework import PassContext
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
    graph = gp.load(model).graph
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
    graph = gp.load(_model(**kwargs)).graph
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert reason in ctx.explanations[0].reason
    assert create().estimate(graph).dynamic_regions  # still host-scheduled


def test_constant_k_is_already_static():
    model = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"]), helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)],
                       {"x": [2, 10]}, {"y": []}, initializers={"k": np.array([3], np.int64)})
    graph = gp.load(model).graph
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


# --- issue 16: sorted=0, masks by selection, special values, ties, k = 0 and k = n, dtypes ----------

def _topk_model(sorted_=1, largest=1, reducer="ReduceSum", elem=TensorProto.FLOAT, n=12, opset=17, keepdims=0):
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, sorted=sorted_, largest=largest),
             helper.make_node(reducer, ["v"], ["y"], keepdims=keepdims)]
    return make_model(nodes, {"x": (elem, [3, n]), "k": (I64, [1])}, {"y": (elem, [1, 1] if keepdims else [])}, opset=opset)


def _lowered(model):
    graph = gp.load(model).graph
    assert lower_dynamic_topk(graph).stats["lowered"] == 1
    out = gp.to_proto(graph)
    check_full(out)
    return out


def _assert_within_promise(got, ref):
    """The pass's promise: float rounding only, NaN/inf positions and signs exact.

    A zero that rounding produced (a tiny sum divided by the count) may take either sign under a
    tolerance; test_zero_sums_keep_their_sign pins the zeros the lowering itself must not flip.
    """
    from graphpass.passes.lowering import LowerDynamicTopK

    promise = LowerDynamicTopK.promise
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref)
        return
    r, g = ref.astype(np.float64), got.astype(np.float64)
    assert np.array_equal(np.isnan(r), np.isnan(g)), (got, ref)
    assert np.array_equal(np.isposinf(r), np.isposinf(g)) and np.array_equal(np.isneginf(r), np.isneginf(g)), (got, ref)
    fin = np.isfinite(r)
    assert np.all(np.abs(g[fin] - r[fin]) <= promise.atol + promise.rtol * np.abs(r[fin])), (got, ref)


def _inputs(rng, n=12, dtype=np.float32):
    """Rows of special values, of ties (including -0.0 against +0.0), and of random values."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        specials = np.array([info.max, info.min, 0, 1, 1, 1, -1 if info.min < 0 else 2, 5, 5, 0, 7, 3][:n], dtype)
        return np.stack([specials, rng.permutation(specials), rng.integers(-3, 4, n).astype(dtype)])
    f = np.finfo(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, f.smallest_subnormal, -f.smallest_subnormal, f.max, -f.max,
                         1.0, 1.0, -2.0][:n], dtype)
    ties = rng.choice(np.array([-0.0, 0.0, 1.0, -1.0], dtype), n)
    return np.stack([rng.permutation(specials), ties, rng.standard_normal(n).astype(dtype)])


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("reducer", ["ReduceSum", "ReduceMean"])
def test_unsorted_and_smallest_topk_reduce_to_the_same_values(sorted_, largest, reducer):
    # sorted=0 used to give the static TopK's unsorted prefix: a sum over other values (off by 7.7)
    model = _topk_model(sorted_, largest, reducer)
    out = _lowered(model)
    rng = np.random.default_rng(sorted_ * 2 + largest)
    for trial in range(20):
        x = rng.standard_normal((3, 12)).astype(np.float32)
        for k in (0, 1, 5, 11, 12):
            feeds = {"x": x, "k": np.array([k], np.int64)}
            _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("reducer", ["ReduceSum", "ReduceMean"])
def test_special_values_and_ties_keep_nan_inf_and_zero_signs(sorted_, largest, reducer):
    # the old mask multiplied by 0/1: an unselected -inf (or NaN) turned the sum into NaN
    model = _topk_model(sorted_, largest, reducer, keepdims=1)
    out = _lowered(model)
    rng = np.random.default_rng(7)
    for trial in range(10):
        x = _inputs(rng)
        for row in range(3):
            for k in range(13):
                feeds = {"x": np.repeat(x[row:row + 1], 3, axis=0), "k": np.array([k], np.int64)}
                _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


def test_unselected_minus_inf_is_not_nan():
    model = _topk_model(1, 1, "ReduceSum")
    out = _lowered(model)
    x = np.array([[2.0, -np.inf, 1.0]] * 3, np.float32)
    x = np.pad(x, ((0, 0), (0, 9)), constant_values=-np.inf)
    feeds = {"x": x, "k": np.array([2], np.int64)}
    assert ort_run(model, feeds)["y"] == 9.0
    assert ort_run(out, feeds)["y"] == 9.0
    assert "Mul" not in ops(out) and "Gather" in ops(out)


@pytest.mark.parametrize("k, expect_sign", [(0, False), (1, True), (2, True)])
def test_zero_sums_keep_their_sign(k, expect_sign):
    # a sum of -0.0 values is -0.0; the sum of nothing (k = 0) is +0.0
    model = _topk_model(1, 1, "ReduceSum")
    out = _lowered(model)
    feeds = {"x": np.full((3, 12), -0.0, np.float32), "k": np.array([k], np.int64)}
    ref, got = ort_run(model, feeds)["y"], ort_run(out, feeds)["y"]
    assert ref == 0 and got == 0 and bool(np.signbit(ref)) == bool(np.signbit(got)) == expect_sign


@pytest.mark.parametrize("elem", [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64,
                                  TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT64])
@pytest.mark.parametrize("reducer", ["ReduceSum", "ReduceMean"])
def test_every_dtype_topk_takes(elem, reducer):
    from onnx import helper as h

    model = _topk_model(0, 1, reducer, elem=elem)
    dtype = h.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(elem)
    x = _inputs(rng, dtype=dtype)
    if reducer == "ReduceMean" and np.dtype(dtype).kind in "iu":
        pytest.skip("integer means are refused: test_integer_mean_is_refused")
    try:
        ort_run(model, {"x": x, "k": np.array([3], np.int64)})
    except Exception as e:  # noqa: BLE001 - onnxruntime's CPU provider lacks some kernels
        pytest.skip(f"onnxruntime cannot run the original TopK/{reducer} on {dtype}: {str(e)[:80]}")
    out = _lowered(model)
    for row in range(3):
        for k in range(13):
            feeds = {"x": np.repeat(x[row:row + 1], 3, axis=0), "k": np.array([k], np.int64)}
            _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


@pytest.mark.parametrize("elem", [TensorProto.INT32, TensorProto.INT64])
def test_integer_mean_is_refused(elem):
    # onnxruntime's mean of [max, max, max] is max; a wrapped integer sum divided by 3 is not
    model = _topk_model(1, 1, "ReduceMean", elem=elem)
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert "integer mean" in ctx.explanations[0].reason


@pytest.mark.parametrize("elem", [TensorProto.BFLOAT16, TensorProto.UNDEFINED])
def test_unknown_or_non_numpy_dtypes_are_refused(elem):
    model = _topk_model(1, 1, "ReduceSum", elem=TensorProto.FLOAT)
    graph = gp.load(model).graph
    graph.nodes[0].inputs[0].dtype = None if elem == TensorProto.UNDEFINED else elem  # as gs holds them
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert "dtype" in ctx.explanations[0].reason


def test_promise_is_the_summation_order_tolerance_because_onnxruntime_sums_k_and_n_values_differently():
    # the static TopK's prefix is the same values, but a ReduceSum over n (masked) values adds them in
    # another order than one over k values: the last bits can differ, so the pass cannot claim exact
    from graphpass.passes.lowering import LowerDynamicTopK, LowerExtractImagePatches
    from graphpass.passes.placement import HoistLoopInvariants, PlaceAndSink

    assert not LowerDynamicTopK.promise.exact and LowerDynamicTopK.promise.name == "summation-order"
    assert all(c.promise.exact for c in (LowerExtractImagePatches, HoistLoopInvariants, PlaceAndSink))
    model = _topk_model(1, 1, "ReduceSum", n=40)
    out = _lowered(model)
    rng = np.random.default_rng(3)
    differ = 0
    for trial in range(50):
        feeds = {"x": rng.standard_normal((3, 40)).astype(np.float32), "k": np.array([int(rng.integers(1, 40))], np.int64)}
        a, b = ort_run(model, feeds)["y"], ort_run(out, feeds)["y"]
        _assert_within_promise(b, a)
        differ += a.tobytes() != b.tobytes()
    assert differ > 0  # if this ever fails, onnxruntime sums in a fixed order and the pass could be EXACT


@pytest.mark.parametrize("opset", [10, 11, 13, 18, 21])
def test_opsets_from_topk_10(opset):
    # TopK-10 has no sorted/largest attributes (it always sorts, largest first): none may be added
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceMean", ["v"], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": [3, 12], "k": (I64, [1])}, {"y": []}, opset=opset)
    out = _lowered(model)
    rng = np.random.default_rng(opset)
    for k in range(13):
        feeds = {"x": _inputs(rng)[[0, 0, 2]], "k": np.array([k], np.int64)}
        _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


def test_float16_mean_with_a_count_float16_cannot_hold_is_refused():
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceMean", ["v"], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": (TensorProto.FLOAT16, [3, 700]), "k": (I64, [1])}, {"y": (TensorProto.FLOAT16, [])})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert "counts up to 2100 values: not exact in float16" in ctx.explanations[0].reason


def _axes_model(reducer, axes, how, opset, topk_axis=1, keepdims=None, noop=None):
    """TopK over ``topk_axis`` of a [3, 12] input, then ``reducer`` with ``axes`` given as an
    attribute (``how="attr"``), a constant input (``"const"``), a runtime input (``"input"``), or
    not at all (``None``); keepdims left to its default (1) unless given."""
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    inputs, inits, graph_inputs = ["v"], {}, {"x": [3, 12], "k": (I64, [1])}
    if how == "attr":
        attrs["axes"] = axes
    elif how == "const":
        inputs.append("axes")
        inits["axes"] = np.array(axes, np.int64)
    elif how == "input":
        inputs.append("axes")
        graph_inputs["axes"] = (I64, [len(axes)])
    topk_attrs = {} if topk_axis is None else {"axis": topk_axis}
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], **topk_attrs),
             helper.make_node(reducer, inputs, ["y"], **attrs)]
    return make_model(nodes, graph_inputs, {"y": (TensorProto.FLOAT, None)}, initializers=inits, opset=opset)


@pytest.mark.parametrize("reducer, how, opset", [("ReduceSum", "attr", 11), ("ReduceSum", "const", 13),
                                                 ("ReduceMean", "attr", 13), ("ReduceMean", "const", 18)])
def test_reduction_over_the_topk_axis_alone_with_axes_given(reducer, how, opset):
    # axes=[1] (the TopK axis only): a mean divides by k alone, and the default keepdims=1 is kept
    model = _axes_model(reducer, [1], how, opset)
    out = _lowered(model)
    rng = np.random.default_rng(opset)
    for k in range(13):
        feeds = {"x": rng.standard_normal((3, 12)).astype(np.float32), "k": np.array([k], np.int64)}
        ref, got = ort_run(model, feeds)["y"], ort_run(out, feeds)["y"]
        assert ref.shape == (3, 1)
        _assert_within_promise(got, ref)


def test_topk_without_axis_attribute_works_on_the_last_axis():
    # TopK's axis defaults to -1: the last axis (12 values), not axis 0 (3 values)
    model = _axes_model("ReduceSum", None, None, 17, topk_axis=None, keepdims=0)
    graph = gp.load(model).graph
    assert lower_dynamic_topk(graph).stats["lowered"] == 1
    topk = next(n for n in graph.nodes if n.op == "TopK")
    assert np.asarray(topk.inputs[1].values).tolist() == [12]
    out = gp.to_proto(graph)
    rng = np.random.default_rng(3)
    for k in (0, 1, 5, 12):
        feeds = {"x": rng.standard_normal((3, 12)).astype(np.float32), "k": np.array([k], np.int64)}
        _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


@pytest.mark.parametrize("build, reason", [
    (lambda: _axes_model("ReduceSum", [0], "attr", 11), "does not reduce over the TopK axis"),
    (lambda: _axes_model("ReduceSum", [0], "const", 13), "does not reduce over the TopK axis"),
    (lambda: _axes_model("ReduceSum", [1], "input", 13), "does not reduce over the TopK axis"),
    (lambda: _axes_model("ReduceSum", [], "const", 13, noop=1), "does not reduce over the TopK axis"),
])
def test_reductions_not_over_the_topk_axis_are_refused(build, reason):
    graph = gp.load(build()).graph
    ctx = PassContext()
    result = lower_dynamic_topk(graph, ctx)
    assert not result.modified and result.stats["refused"] == 1
    assert reason in ctx.explanations[0].reason


def test_reduction_with_empty_axes_reduces_everything_and_is_lowered():
    # an empty axes input without noop_with_empty_axes reduces over all axes
    model = _axes_model("ReduceSum", [], "const", 13, keepdims=0)
    out = _lowered(model)
    rng = np.random.default_rng(5)
    for k in (0, 3, 12):
        feeds = {"x": rng.standard_normal((3, 12)).astype(np.float32), "k": np.array([k], np.int64)}
        _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


def test_values_that_are_also_a_graph_output_are_refused():
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": [3, 12], "k": (I64, [1])}, {"y": [], "v": [3, None]})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert "selected values are a graph output" in ctx.explanations[0].reason


def test_dynamic_input_shape_is_refused():
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": [3, "N"], "k": (I64, [1])}, {"y": []})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_dynamic_topk(graph, ctx).modified
    assert "shape is not static" in ctx.explanations[0].reason


def test_float16_mean_of_up_to_2048_values_is_lowered():
    # 1,500 is exact in float16 (every integer up to 2048 is): the mean is lowered; values of
    # 0 and 1 keep every partial sum exact, so both forms give the same bits
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceMean", ["v"], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": (TensorProto.FLOAT16, [1, 1500]), "k": (I64, [1])}, {"y": (TensorProto.FLOAT16, [])})
    out = _lowered(model)
    x = (np.random.default_rng(7).random((1, 1500)) < 0.7).astype(np.float16)
    for k in (0, 1, 1000, 1500):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        np.testing.assert_array_equal(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


def test_an_omitted_axes_input_reduces_everything_and_is_lowered():
    # ReduceSum(v, "") at opset 13: the axes input is given but empty-named, i.e. absent
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("ReduceSum", ["v", ""], ["y"], keepdims=0)]
    model = make_model(nodes, {"x": [3, 12], "k": (I64, [1])}, {"y": []}, opset=13)
    out = _lowered(model)
    rng = np.random.default_rng(6)
    for k in (0, 4, 12):
        feeds = {"x": rng.standard_normal((3, 12)).astype(np.float32), "k": np.array([k], np.int64)}
        _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])


def test_topk_without_axis_attribute_reduced_over_its_last_axis_alone_is_lowered():
    model = _axes_model("ReduceSum", [1], "attr", 11, topk_axis=None, keepdims=0)
    out = _lowered(model)
    rng = np.random.default_rng(8)
    for k in (0, 2, 12):
        feeds = {"x": rng.standard_normal((3, 12)).astype(np.float32), "k": np.array([k], np.int64)}
        _assert_within_promise(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"])
