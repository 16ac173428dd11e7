"""eliminate_empty_slices: Concat inputs empty on the Concat's axis are dropped (issue 25,
auto_optimizer's "empty Slice" knowledge); exact."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphpass as gp
from graphpass.passes import eliminate_empty_slices

F = TensorProto.FLOAT
VALUES = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, 3.4e38, -7.5], np.float32)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m, full_check=True)
    return m


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _run(m, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(before, after, feeds):
    onnx.checker.check_model(after, full_check=True)
    for a, b in zip(_run(before, feeds), _run(after, feeds)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _slice_concat(dims, starts, ends, axes, steps=None, concat_axis=1, dtype=F, extra=()):
    ins = ["x", "st", "en", "ax"] + (["sp"] if steps is not None else [])
    inits = [_i64("st", starts), _i64("en", ends), _i64("ax", axes)] + ([_i64("sp", steps)] if steps is not None else [])
    nodes = [helper.make_node("Slice", ins, ["s"]), helper.make_node("Concat", ["x", "s", *extra], ["c"], axis=concat_axis),
             helper.make_node("Identity", ["c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", dtype, dims)], [helper.make_tensor_value_info("y", dtype, ["o0", "o1"])],
                  inits)


def _optimized(m):
    graph = gp.load(m).graph
    result = eliminate_empty_slices(graph)
    return result, gp.to_proto(graph)


@pytest.mark.parametrize("dims", [[2, 4], [2, "n"]])
@pytest.mark.parametrize("starts, ends, steps", [([1], [1], None), ([3], [3], [-1]), ([-2], [-2], [2]),
                                                 ([9], [9], None), ([9], [9], [-1]), ([-2**63], [-2**63], None)])
def test_an_empty_slice_input_is_dropped_and_outputs_are_bitwise_equal(dims, starts, ends, steps):
    m = _slice_concat(dims, starts, ends, [1], steps)
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1 and result.stats["concats_removed"] == 1
    assert "Concat" not in [n.op_type for n in out.graph.node]
    _check(m, out, {"x": VALUES.reshape(2, 4)})


def test_a_static_zero_size_on_the_axis_is_empty_too():
    """starts 5, ends 7 on a dim of 4: both clamp to 4; inference says 0 on that axis."""
    m = _slice_concat([2, 4], [5], [7], [1])
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    _check(m, out, {"x": VALUES.reshape(2, 4)})


@pytest.mark.parametrize("dims", [[2, 4], [2, "n"]])
def test_equal_start_and_end_below_minus_the_size_with_a_negative_step_is_not_empty(dims):
    """ONNX clamps a negative step's start to [0, d-1] but its end to [-1, d-1]: Slice(x, -9, -9,
    step -3) on d = 4 selects x[0] (auto_optimizer's rule, start == end, calls it empty)."""
    m = _slice_concat(dims, [-9], [-9], [1], [-3])
    result, out = _optimized(m)
    assert not result.modified
    assert _run(m, {"x": VALUES.reshape(2, 4)})[0].shape == (2, 5)


def test_a_backward_slice_from_int64_max_is_left_alone():
    """The spec clamps start and end INT64_MAX to d-1 (empty); onnxruntime selects x[3], x[1]."""
    m = _slice_concat([2, 4], [2**63 - 1], [2**63 - 1], [1], [-2])
    result, _ = _optimized(m)
    assert not result.modified


def test_empty_on_another_axis_or_not_empty_is_left_alone():
    m = _slice_concat([2, 4], [1], [2], [1])  # one column: not empty
    result, _ = _optimized(m)
    assert not result.modified
    # two inputs empty on axis 1, concatenated on axis 0: neither is empty on the Concat's axis
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s1"]), helper.make_node("Slice", ["z", "st", "en", "ax"], ["s2"]),
             helper.make_node("Concat", ["s1", "s2"], ["c"], axis=0), helper.make_node("Identity", ["c"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4]), helper.make_tensor_value_info("z", F, [3, 4])],
               [helper.make_tensor_value_info("y", F, [5, 0])], [_i64("st", [1]), _i64("en", [1]), _i64("ax", [1])])
    result, out = _optimized(m)
    assert not result.modified
    _check(m, out, {"x": VALUES.reshape(2, 4), "z": np.ones((3, 4), np.float32)})
    # empty on axis 0 and concatenated on axis 0: dropped
    m = _slice_concat([2, 4], [1], [1], [0], concat_axis=0)
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    _check(m, out, {"x": VALUES.reshape(2, 4)})


def test_negative_axes_and_the_attribute_form_of_opset_9():
    m = _slice_concat([2, 4], [2], [2], [-1], concat_axis=-1)
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    _check(m, out, {"x": VALUES.reshape(2, 4)})
    nodes = [helper.make_node("Slice", ["x"], ["s"], starts=[1], ends=[1], axes=[1]),
             helper.make_node("Concat", ["x", "s"], ["y"], axis=1)]
    m9 = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])], [helper.make_tensor_value_info("y", F, [2, 4])],
                opset=9)
    result, out = _optimized(m9)
    assert result.stats["inputs_dropped"] == 1
    assert [o.name for o in out.graph.output] == ["y"]
    _check(m9, out, {"x": VALUES.reshape(2, 4)})


def test_a_slice_read_elsewhere_stays_and_a_graph_output_keeps_its_name():
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]), helper.make_node("Concat", ["x", "s", "x"], ["y"], axis=1),
             helper.make_node("Shape", ["s"], ["z"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])],
               [helper.make_tensor_value_info("y", F, [2, 8]), helper.make_tensor_value_info("z", TensorProto.INT64, [2])],
               [_i64("st", [0]), _i64("en", [0]), _i64("ax", [1])])
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1 and result.stats["concats_removed"] == 0
    ops = [n.op_type for n in out.graph.node]
    assert "Slice" in ops and ops.count("Concat") == 1 and [o.name for o in out.graph.output] == ["y", "z"]
    _check(m, out, {"x": VALUES.reshape(2, 4)})


def test_all_inputs_empty_keeps_one():
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s1"]), helper.make_node("Slice", ["x", "st", "en", "ax"], ["s2"]),
             helper.make_node("Concat", ["s1", "s2"], ["c"], axis=1), helper.make_node("Identity", ["c"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])], [helper.make_tensor_value_info("y", F, [2, 0])],
               [_i64("st", [1]), _i64("en", [1]), _i64("ax", [1])])
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    _check(m, out, {"x": VALUES.reshape(2, 4)})


@pytest.mark.parametrize("dtype, np_dtype", [(TensorProto.INT64, np.int64), (TensorProto.INT32, np.int32),
                                             (TensorProto.BOOL, np.bool_), (TensorProto.FLOAT16, np.float16),
                                             (TensorProto.DOUBLE, np.float64), (TensorProto.UINT8, np.uint8)])
def test_every_dtype(dtype, np_dtype):
    m = _slice_concat([2, 4], [1], [1], [1], dtype=dtype)
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    x = (np.arange(8) - 3).astype(np_dtype).reshape(2, 4) if np_dtype is not np.bool_ else (np.arange(8) % 3 == 0).reshape(2, 4)
    _check(m, out, {"x": x})


def test_an_empty_input_tensor_itself():
    """The model's input has a static 0 on the Concat axis."""
    nodes = [helper.make_node("Concat", ["x", "e"], ["y"], axis=1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4]), helper.make_tensor_value_info("e", F, [2, 0])],
               [helper.make_tensor_value_info("y", F, [2, 4])])
    result, out = _optimized(m)
    assert result.stats["inputs_dropped"] == 1
    _check(m, out, {"x": VALUES.reshape(2, 4), "e": np.zeros((2, 0), np.float32)})


def test_in_the_default_pipeline_the_slice_goes_too():
    m = _slice_concat([2, "n"], [1], [1], [1])
    out = gp.to_proto(gp.optimize(m, target="none").model)
    # the Slice is gone; the Concat writes the graph output, so it stays with its one input
    assert [(n.op_type, len(n.input)) for n in out.graph.node] == [("Concat", 1)]
    _check(m, out, {"x": VALUES.reshape(2, 4)})


def test_every_start_end_step_combination_it_drops_is_empty_in_onnxruntime():
    """A sweep over starts, ends and steps (clamping, negative indices, INT64 extremes): wherever
    the pass drops the Slice, onnxruntime's original output equals the rewritten one bitwise."""
    edge = [-2**63, -9, -4, -1, 0, 2, 4, 9, 2**63 - 1]
    fired = 0
    for d in (3, 4):
        x = np.arange(2 * d, dtype=np.float32).reshape(2, d) - 2.5
        for step in (-3, -1, 1, 2):
            for s in edge:
                for e in edge:
                    m = _slice_concat([2, d], [s], [e], [1], [step])
                    result, out = _optimized(m)
                    if result.modified:
                        fired += 1
                        _check(m, out, {"x": x})
    assert fired > 50  # the sweep exercises the pass, not only its refusals
