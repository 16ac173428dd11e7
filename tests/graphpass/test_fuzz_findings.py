"""Failures the differential fuzzer (benchmarks/fuzz.py) found, minimized, one test each.

Each is a pass (or the model I/O) breaking its promise on a model of a few nodes. They are
expected failures (strict: each must fail today) in code other branches are fixing for issue 16;
when a fix lands the test starts passing and strict xfail makes it visible: drop the marker.
The check is graphpass.fuzzing.differential: the output model must pass the full checker and
give onnxruntime's outputs of the input, bitwise where every pass that changed the graph is
exact, else within the loosest declared tolerance (NaN/inf positions and signs exact).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphpass._fuzz_cases import Case
from graphpass.fuzzing import differential


def _model(nodes, inputs, outputs, inits=(), opset=17, sparse=()):
    graph = helper.make_graph(nodes, "finding", inputs, outputs, initializer=list(inits),
                              sparse_initializer=list(sparse))
    ops = [helper.make_opsetid("", opset)]
    m = helper.make_model(graph, opset_imports=ops)
    m.ir_version = max(helper.find_min_ir_version_for(ops), 7)
    return m


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds, passes=None, storage="inline", opset=17):
    out = differential(Case("float32", "finding", storage, opset, model, feeds, passes))
    assert out.status == "ok", out.reason


def _topk_sum(sorted_, largest, reduce="ReduceSum", x=None):
    if x is None:
        x = np.array([[0.75, -0.5, 0.75, 2.0], [1.0, 1.0, -3.0, 0.0], [np.nan, 0.5, -0.0, 0.5]], np.float32)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    red = (helper.make_node(reduce, ["v", "axes"], ["y"], keepdims=0) if reduce == "ReduceSum"
           else helper.make_node(reduce, ["v"], ["y"], axes=[1], keepdims=0))
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, sorted=sorted_, largest=largest), red],
                   [_vi("x", TensorProto.FLOAT, [3, 4]), _vi("k", TensorProto.INT64, [1])],
                   [_vi("y", TensorProto.FLOAT, [3])], [axes] if reduce == "ReduceSum" else [])
    return model, {"x": x, "k": np.array([2], np.int64)}


@pytest.mark.parametrize("largest", [0, 1])
def test_lower_dynamic_topk_unsorted_keeps_the_sum(largest):
    model, feeds = _topk_sum(0, largest)
    _check(model, feeds, ["lower_dynamic_topk"])


def test_lower_dynamic_topk_keeps_nan_positions():
    x = np.array([[0.0, -1.0, -3.4028235e38, -1.0], [0.5, -np.inf, 1.0, 0.0], [1e-45, -1.0, 1.0, 2.0]], np.float32)
    model, feeds = _topk_sum(0, 1, "ReduceMean", x)
    _check(model, feeds, ["lower_dynamic_topk"])


def _zero_trip_loop_with_cast_from_string():
    body = helper.make_graph(
        [helper.make_node("Cast", ["s"], ["inv"], to=TensorProto.FLOAT),
         helper.make_node("Max", ["v_in", "inv"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", TensorProto.FLOAT, [3])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT, [3])])
    model = _model([helper.make_node("Loop", ["m", "c", "x"], ["y"], body=body)],
                   [_vi("x", TensorProto.FLOAT, [3]), _vi("c", TensorProto.BOOL, []), _vi("s", TensorProto.STRING, [1])],
                   [_vi("y", TensorProto.FLOAT, [3])], [numpy_helper.from_array(np.array(0, np.int64), "m")], opset=16)
    return model, {"x": np.array([-0.5, 1.5, 0.0], np.float32), "c": np.array(True),
                   "s": np.array(["abc"], dtype=object)}


def test_hoist_loop_invariants_does_not_hoist_a_failing_cast_out_of_a_zero_trip_loop():
    model, feeds = _zero_trip_loop_with_cast_from_string()
    _check(model, feeds, ["hoist_loop_invariants"], opset=16)


def _layer_norm(opset, n=2):
    c = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]),
             helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [2, n])], [_vi("y", TensorProto.FLOAT, [2, n])],
                   [c(2.0, "two"), c(1e-5, "eps"), c(np.linspace(1.0, 0.5, n), "g"), c(np.linspace(0.0, 0.25, n), "b")],
                   opset=opset)
    return model, {"x": np.array([[0.5, -1.0], [2.0, 3.0]], np.float32)}


def test_fuse_layer_norm_device_op_is_valid_at_opset_11():
    model, feeds = _layer_norm(11)
    _check(model, feeds, ["fuse_layer_norm"], opset=11)


def _side_add(const: onnx.TensorProto | None, n: int, sparse=None):
    """x + c with c stored as given (the storage forms)."""
    name = const.name if const is not None else sparse.values.name
    return _model([helper.make_node("Add", ["x", name], ["y"])], [_vi("x", TensorProto.FLOAT, [n])],
                  [_vi("y", TensorProto.FLOAT, [n])], [const] if const is not None else [], opset=17,
                  sparse=[sparse] if sparse is not None else [])


def test_external_data_tensors_below_1_kib_survive_a_pass(tmp_path):
    small = numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")
    model = _side_add(small, 4)
    # a duplicate pair for eliminate_common_subexpressions to merge, as torch dynamo exports write them
    model.graph.node.append(helper.make_node("Add", ["x", "c"], ["y2"]))
    model.graph.output.append(_vi("y2", TensorProto.FLOAT, [4]))
    _check(model, {"x": np.array([0.5, -0.0, np.inf, 1.0], np.float32)}, ["eliminate_common_subexpressions"],
           storage="external")


def test_sparse_initializer_keeps_its_dtype_and_values():
    values = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sp")
    idx = numpy_helper.from_array(np.array([0, 3], np.int64), "sp_idx")
    model = _side_add(None, 6, helper.make_sparse_tensor(values, idx, [6]))
    _check(model, {"x": np.ones(6, np.float32)}, ["eliminate_common_subexpressions"], storage="sparse")


def test_string_initializer_is_kept():
    s = helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"bc"])
    model = _model([helper.make_node("Identity", ["s"], ["y"])], [], [_vi("y", TensorProto.STRING, [2])], [s])
    _check(model, {}, None, storage="string")


@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4])
def test_int4_initializer_survives(elem):
    q = helper.make_tensor("q", elem, [2], [1, 2])
    model = _model([helper.make_node("Cast", ["q"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Add", ["x", "f"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])], [q], opset=21)
    _check(model, {"x": np.zeros(2, np.float32)}, ["eliminate_common_subexpressions"], storage=onnx.TensorProto.DataType.Name(elem).lower(),
           opset=21)


def test_fused_device_op_bodies_take_the_model_dtype():
    f16 = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float16), n)  # noqa: E731
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
                    helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                   [_vi("x", TensorProto.FLOAT16, [1, 1, 3, 3])], [_vi("y", TensorProto.FLOAT16, [1, 1, 3, 3])],
                   [f16([[[[1.5]]]], "w"), f16(0.0, "lo"), f16(6.0, "hi")])
    x = np.array([-1.0, 0.0, -0.0, 2.0, 5.0, np.inf, -np.inf, 3.5, 65504.0], np.float16).reshape(1, 1, 3, 3)
    _check(model, {"x": x}, ["fuse_conv_activation"])


def test_hoist_loop_invariants_float16_is_bitwise_equal():
    body = helper.make_graph(
        [helper.make_node("Mul", ["b", "b"], ["inv"]), helper.make_node("Sub", ["v_in", "inv"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", TensorProto.FLOAT16, [3])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", TensorProto.FLOAT16, [3])])
    model = _model([helper.make_node("Loop", ["m", "c", "a"], ["y"], body=body)],
                   [_vi("a", TensorProto.FLOAT16, [3]), _vi("b", TensorProto.FLOAT16, [3]), _vi("c", TensorProto.BOOL, [])],
                   [_vi("y", TensorProto.FLOAT16, [3])], [numpy_helper.from_array(np.array(1, np.int64), "m")], opset=11)
    feeds = {"a": np.array([4.082, -5.113, 0.8364], np.float16), "b": np.array([-1.73, 6.645, 0.4517], np.float16),
             "c": np.array(True)}
    _check(model, feeds, ["hoist_loop_invariants"], opset=11)


def test_mixed_precision_is_held_to_valid_models_not_to_a_bound():
    """Where terms cancel, fp16 rounding is amplified beyond any per-element bound: mixed_precision
    is an opt-in precision change (Promise.opt_in), held to valid, runnable models."""
    w = np.array([2.360250234603882, 0.8611509203910828, 0.6041396260261536, 0.9445468187332153], np.float32)
    x = np.array([-1.7446105, -3.0312543, -0.5336402, -1.8768785, 0.9099082, 2.0303397, -0.3302629, -4.5481081,
                  -3.4269931, 0.1815157, 2.8432832, 0.0107685, -0.1199328, 2.8001122, 0.9195576, 0.9214908,
                  -0.4183047, 1.8890811], np.float32).reshape(1, 2, 3, 3)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
                    helper.make_node("Add", ["c", "b"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, [1, 2, 3, 3])], [_vi("y", TensorProto.FLOAT, [1, 2, 3, 3])],
                   [numpy_helper.from_array(w.reshape(2, 2, 1, 1), "w"),
                    numpy_helper.from_array(np.array(3.124041795730591, np.float32), "b")], opset=21)
    _check(model, {"x": x}, ["mixed_precision"], opset=21)


def test_every_tolerated_fuzz_failure_kind_has_its_xfail_test():
    """tests/graphpass/test_fuzz.py tolerates only the kinds recorded here."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_fuzz import KNOWN

    names = set(globals())
    assert set(KNOWN.values()) <= names, set(KNOWN.values()) - names


def test_fuse_layer_norm_near_float_max_is_the_stated_overflow_limit_and_nothing_else():
    """Near float32's max the decomposition overflows (inf - inf) where one kernel does not: the
    oracle finds the overflowing intermediate and files it under the promise's stated limit;
    on ordinary values the same fusion is checked against its tolerance and passes."""
    model, _ = _layer_norm(17, 3)
    x = np.array([[-3.0e38, 1e-45, -3.0e38], [1.0, 2.0, 3.0]], np.float32)  # the decomposition: inf - inf
    out = differential(Case("float32", "finding", "inline", 17, model, {"x": x}, ["fuse_layer_norm"]))
    assert out.status == "limit" and "overflows" in out.reason, out
    _check(model, {"x": np.array([[-3.0, 1e-3, 2.5], [1.0, 2.0, 3.0]], np.float32)}, ["fuse_layer_norm"])


def test_a_tolerance_mismatch_without_overflow_is_a_failure_not_a_limit():
    """The limit is found in the run, never assumed: NaN moved without any overflowing
    intermediate is a failure."""
    from graphpass.fuzzing import _overflowed

    model, _ = _layer_norm(17, 3)
    assert _overflowed(model, {"x": np.array([[-3.0, 1e-3, 2.5], [1.0, 2.0, 3.0]], np.float32)}) == ""
    assert _overflowed(model, {"x": np.array([[-3.0e38, 1e-45, -3.0e38], [1.0, 2.0, 3.0]], np.float32)})


def test_oracle_reads_external_shape_operands_and_leaves_the_case_unchanged():
    """onnx's full checker cannot read a TopK k kept in external data (its limit, not the
    model's): the oracle falls back to the structural checker; saving the case externally must
    not move the case's own tensors out of its proto."""
    from graphpass._fuzz_cases import Case
    from graphpass.fuzzing import differential

    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
                           helper.make_node("Cast", ["v"], ["c"], to=TensorProto.FLOAT),
                           helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16)], "g",
                          [_vi("x", TensorProto.FLOAT16, [2, 5])],
                          [_vi("y", TensorProto.FLOAT16, [2, 3]), _vi("i", TensorProto.INT64, [2, 3])],
                          [numpy_helper.from_array(np.array([3], np.int64), "k")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float16)
    for passes in (["eliminate_cast_pairs"], None):
        outcome = differential(Case("float16", "topk", "external", 17, model, {"x": x}, passes))
        assert outcome.status == "ok", outcome


def test_tolerance_of_a_float16_output_is_a_few_of_its_own_ulps():
    """MatMul+Add -> Gemm in float16 rounds once where the original rounds twice: one fp16 ulp
    (~1e-3 relative), inside the reassociation promise read in float16's own precision, and
    nothing more: ten ulps off is still a failure."""
    from graphpass.fuzzing import compare

    ref = np.array([0.4833984375], np.float16)
    one_ulp = np.nextafter(ref, np.float16(1))
    assert compare(ref, one_ulp, exact=False, rtol=1e-5, atol=1e-6) == ""
    ten_ulps = (ref.astype(np.float32) * (1 + 10 * float(np.finfo(np.float16).eps))).astype(np.float16)
    assert compare(ref, ten_ulps, exact=False, rtol=1e-5, atol=1e-6) != ""
    assert compare(ref, one_ulp, exact=True, rtol=0, atol=0) != ""


def test_layout_does_not_read_a_layer_norm_scale_as_reduction_axes():
    """propagate_layout crashed (cannot convert float NaN to integer): the cost model read the
    second input of every 'reduce'-layout op as axes, and a LayerNorm device op's is its Scale."""
    model, feeds = _layer_norm(17, 2)
    for t in model.graph.initializer:
        if t.name == "g":
            t.CopyFrom(numpy_helper.from_array(np.array([np.nan, 1.0], np.float32), "g"))
    _check(model, feeds)


def test_overflow_is_found_in_a_conv_even_with_nan_elsewhere():
    """A Conv mixes channels: its inf at a pixel whose inputs are finite is an overflow, while a
    NaN fed at another pixel is propagation, not overflow."""
    from graphpass.fuzzing import _overflowed

    w = numpy_helper.from_array(np.array([[[[2.0]], [[1.5]]]], np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"])], [_vi("x", TensorProto.FLOAT, [1, 2, 1, 2])],
                   [_vi("y", TensorProto.FLOAT, [1, 1, 1, 2])], [w])
    x = np.array([[[[3e38, np.nan]], [[1e38, 1.0]]]], np.float32)
    assert "Conv" in _overflowed(model, {"x": x})
    x[0, 0, 0, 0] = 1.0
    assert _overflowed(model, {"x": x}) == ""  # only NaN propagation left
