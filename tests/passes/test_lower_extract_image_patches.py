"""ExtractImagePatches -> Conv, checked against a numpy reference of TensorFlow's semantics."""

import math

import onnx

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes import lower_extract_image_patches
from graphpass.passes.lowering.lower_extract_image_patches import tf_extract_image_patches
from graphpass.testing import make_model, ops, ort_run, check_full


def _model(h, w, c, k, s, r, padding, domain="tf"):
    expected = tf_extract_image_patches(np.zeros((1, h, w, c), np.float32), [1, k, k, 1], [1, s, s, 1], [1, r, r, 1], padding)
    node = helper.make_node("ExtractImagePatches", ["x"], ["y"], domain=domain, ksizes=[1, k, k, 1], strides=[1, s, s, 1],
                            rates=[1, r, r, 1], padding=padding)
    return make_model([node], {"x": [1, h, w, c]}, {"y": list(expected.shape)}, extra_opsets={domain: 1})


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("s", [1, 2])
@pytest.mark.parametrize("r", [1, 2])
@pytest.mark.parametrize("c", [1, 3, 16, 17])
@pytest.mark.parametrize("hw", [(9, 9), (10, 8)])
def test_lowered_conv_matches_tf_exactly(padding, s, r, c, hw):
    h, w = hw
    graph = gp.load(_model(h, w, c, 3, s, r, padding)).graph
    result = lower_extract_image_patches(graph)
    assert result.stats["fired"] == 1 and "Conv" not in ops(graph) and ops(graph).count("Gather") == 1
    out = gp.to_proto(graph)
    check_full(out)
    x = np.random.default_rng(h * 100 + c).standard_normal((1, h, w, c)).astype(np.float32)
    got = ort_run(out, {"x": x})["y"]
    np.testing.assert_array_equal(got, tf_extract_image_patches(x, [1, 3, 3, 1], [1, s, s, 1], [1, r, r, 1], padding))


@pytest.mark.parametrize("attrs, reason", [
    ({"padding": "REFLECT"}, "neither SAME nor VALID"),
    ({"ksizes": [2, 3, 3, 1]}, "not 1 on the batch and channel axes"),
    ({"strides": [1, 0, 1, 1]}, "strides [1, 0, 1, 1] holds a value below 1"),
    ({"rates": [1, 1, 0, 1]}, "rates [1, 1, 0, 1] holds a value below 1"),
])
def test_unlowerable_attributes_are_left_with_a_reason(attrs, reason):
    base = {"ksizes": [1, 3, 3, 1], "strides": [1, 1, 1, 1], "rates": [1, 1, 1, 1], "padding": "VALID", **attrs}
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", **base)],
                       {"x": [1, 8, 8, 3]}, {"y": [1, 6, 6, 27]}, extra_opsets={"tf": 1})
    graph = gp.load(model).graph
    ctx = PassContext()
    result = lower_extract_image_patches(graph, ctx)
    assert not result.modified and result.stats["refused"] == 1
    assert ops(graph) == ["ExtractImagePatches"] and reason in ctx.explanations[0].reason


@pytest.mark.parametrize("x_shape", [[8, 8, 3], None], ids=["rank-3", "unknown-rank"])
def test_an_input_not_known_to_be_4d_is_left_with_a_reason(x_shape):
    base = {"ksizes": [1, 3, 3, 1], "strides": [1, 1, 1, 1], "rates": [1, 1, 1, 1], "padding": "VALID"}
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", **base)],
                       {"x": (TensorProto.FLOAT, x_shape)}, {"y": (TensorProto.FLOAT, None)}, extra_opsets={"tf": 1})
    graph = gp.load(model).graph
    ctx = PassContext()
    result = lower_extract_image_patches(graph, ctx)
    assert not result.modified and result.stats["refused"] == 1
    assert ctx.explanations[0].reason == "the input's rank is unknown or not 4 (NHWC)"


def test_symbolic_size_with_same_padding_is_refused():
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 3, 1],
                                         strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")],
                       {"x": [1, "H", "W", 3]}, {"y": [1, "H", "W", 27]}, extra_opsets={"tf": 1})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_extract_image_patches(graph, ctx).modified
    assert "symbolic spatial size" in ctx.explanations[0].reason


def test_siammask_example_loses_its_host_crossings_and_cost():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import siammask_patches

    from graphpass.cost_model import create
    from graphpass.ir import annotations as A

    graph = gp.load(siammask_patches.build()).graph
    for n in graph.nodes:
        if n.op == "ExtractImagePatches":
            A.set_engine(n, "HOST")  # the py_func fallback
    before = create().estimate(graph)
    result = gp.optimize(graph)
    after = create().estimate(result.graph)
    assert before.crossings and not after.crossings
    assert after.total_us < before.total_us
    assert "ExtractImagePatches" not in ops(result.graph)


# --- issue 16: only moves values; inf, NaN, -0.0, subnormals, dtype max and every dtype bit for bit ---

def _assert_bitwise(got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape, ref.shape)
    assert got.tobytes() == ref.tobytes(), (got, ref)


def _special_input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.choice(np.array([info.min, info.max, 0, 1, 2], dtype), shape)
    finfo = np.finfo(dtype)
    pool = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, finfo.smallest_subnormal, -finfo.smallest_subnormal,
                     finfo.max, -finfo.max, 1.5, -2.25], dtype)
    return rng.choice(pool, shape)


def _lower_proto(model):
    graph = gp.load(model).graph
    assert lower_extract_image_patches(graph).stats["fired"] == 1
    out = gp.to_proto(graph)
    check_full(out)
    return out


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("s, r", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_special_values_stay_in_their_patch_bit_for_bit(padding, s, r):
    # the one-hot Conv multiplied each patch element by 0 or 1: an inf turned the other outputs NaN
    model = _model(9, 8, 3, 3, s, r, padding)
    out = _lower_proto(model)
    for seed in range(5):
        x = _special_input((1, 9, 8, 3), np.float32, seed)
        ref = tf_extract_image_patches(x, [1, 3, 3, 1], [1, s, s, 1], [1, r, r, 1], padding)
        _assert_bitwise(ort_run(out, {"x": x})["y"], ref)


def test_one_inf_does_not_touch_its_neighbours():
    out = _lower_proto(_model(4, 4, 1, 3, 1, 1, "VALID"))
    x = np.zeros((1, 4, 4, 1), np.float32)
    x[0, 1, 1, 0] = np.inf
    got = ort_run(out, {"x": x})["y"]
    assert not np.isnan(got).any() and np.isinf(got).sum() == 4  # four 3x3 windows hold it, once each


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16, TensorProto.INT8,
                                  TensorProto.UINT8, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_every_dtype_is_moved_bit_for_bit(elem, padding):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    expected = tf_extract_image_patches(np.zeros((1, 7, 6, 2), np.float32), [1, 2, 3, 1], [1, 2, 1, 1], [1, 1, 2, 1], padding)
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 2, 3, 1],
                                         strides=[1, 2, 1, 1], rates=[1, 1, 2, 1], padding=padding)],
                       {"x": (elem, [1, 7, 6, 2])}, {"y": (elem, list(expected.shape))}, extra_opsets={"tf": 1})
    out = _lower_proto(model)
    if elem == TensorProto.BFLOAT16:
        x = _special_input((1, 7, 6, 2), np.float32, elem).astype(dtype)
    else:
        x = _special_input((1, 7, 6, 2), dtype, elem)
    try:
        got = ort_run(out, {"x": x})["y"]
    except Exception as e:  # noqa: BLE001 - onnxruntime's CPU provider lacks some kernels
        pytest.skip(f"onnxruntime cannot run Pad/Reshape/Gather on {dtype}: {str(e)[:80]}")
    _assert_bitwise(got, tf_extract_image_patches(x, [1, 2, 3, 1], [1, 2, 1, 1], [1, 1, 2, 1], padding))


def test_valid_padding_on_symbolic_sizes_is_lowered():
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 2, 1],
                                         strides=[1, 2, 3, 1], rates=[1, 2, 1, 1], padding="VALID")],
                       {"x": ["N", "H", "W", "C"]}, {"y": ["N", None, None, None]}, extra_opsets={"tf": 1})
    out = _lower_proto(model)
    assert ops(out).count("Slice") == 6 and ops(out)[-1] == "Concat"
    for hw in [(5, 2), (9, 8), (10, 11), (4, 2)]:
        x = _special_input((2, *hw, 3), np.float32, sum(hw))
        _assert_bitwise(ort_run(out, {"x": x})["y"],
                        tf_extract_image_patches(x, [1, 3, 2, 1], [1, 2, 3, 1], [1, 2, 1, 1], "VALID"))


@pytest.mark.parametrize("opset", [10, 11, 13, 21])
def test_opsets_with_attribute_and_input_pads(opset):
    model = _model(5, 6, 2, 3, 2, 1, "SAME")
    model.opset_import[0].version = opset
    out = _lower_proto(model)
    x = _special_input((1, 5, 6, 2), np.float32, opset)
    _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], "SAME"))


def test_opset_9_is_refused():
    model = _model(5, 6, 2, 3, 1, 1, "VALID")
    model.opset_import[0].version = 9
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not lower_extract_image_patches(graph, ctx).modified
    assert "no steps below opset 10" in ctx.explanations[0].reason


def test_one_by_one_kernel_is_a_strided_copy():
    model = _model(6, 6, 2, 1, 2, 1, "SAME")
    out = _lower_proto(model)
    assert ops(out) == ["Reshape", "Gather", "Reshape"]
    x = _special_input((1, 6, 6, 2), np.float32, 3)
    _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 1, 1, 1], [1, 2, 2, 1], [1, 1, 1, 1], "SAME"))


def test_siammask_example_checks_bit_for_bit_and_can_fail():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import siammask_patches

    lowered = gp.to_proto(gp.optimize(siammask_patches.build()).graph)
    assert siammask_patches.check_bit_for_bit(lowered, seeds=2) == []
    gather = next(n for n in lowered.graph.node if n.op_type == "Gather")
    positions = next(t for t in lowered.graph.initializer if t.name == gather.input[1])
    wrong = onnx.numpy_helper.to_array(positions).copy()
    wrong[..., [0, 1]] = wrong[..., [1, 0]]  # a wrong channel order
    positions.CopyFrom(onnx.numpy_helper.from_array(wrong, positions.name))
    assert siammask_patches.check_bit_for_bit(lowered, seeds=1)[0].startswith("model patches differ")


def test_symbolic_one_by_one_kernel_is_a_strided_slice():
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 1, 1, 1],
                                         strides=[1, 2, 2, 1], rates=[1, 1, 1, 1], padding="VALID")],
                       {"x": [1, "H", "W", 2]}, {"y": [1, None, None, 2]}, extra_opsets={"tf": 1})
    out = _lower_proto(model)
    assert ops(out) == ["Slice", "Identity"]
    x = _special_input((1, 7, 6, 2), np.float32, 4)
    _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 1, 1, 1], [1, 2, 2, 1], [1, 1, 1, 1], "VALID"))


def test_symbolic_batch_with_static_spatial_sizes_uses_the_gather():
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 3, 1],
                                         strides=[1, 1, 2, 1], rates=[1, 1, 1, 1], padding="SAME")],
                       {"x": ["N", 5, 6, 2]}, {"y": ["N", 5, 3, 18]}, extra_opsets={"tf": 1})
    out = _lower_proto(model)
    assert "Gather" in ops(out)
    for batch in (0, 1, 3):
        x = _special_input((batch, 5, 6, 2), np.float32, batch)
        _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 3, 3, 1], [1, 1, 2, 1], [1, 1, 1, 1], "SAME"))


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_a_big_position_table_takes_the_slice_form(monkeypatch, padding):
    from graphpass.passes.lowering import lower_extract_image_patches as module

    monkeypatch.setattr(module, "MAX_POSITIONS", 10)
    model = _model(9, 8, 3, 3, 2, 1, padding)
    out = _lower_proto(model)
    assert "Gather" not in ops(out) and ops(out).count("Slice") == 9
    x = _special_input((1, 9, 8, 3), np.float32, 11)
    _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], padding))


def test_missing_rates_mean_rate_one_and_missing_ksizes_are_refused():
    # rates is optional in TF's op (default 1); ksizes and strides are not
    node = helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 2, 1],
                            strides=[1, 1, 2, 1], padding="VALID")
    model = make_model([node], {"x": [1, 7, 8, 2]}, {"y": [1, 5, 4, 12]}, extra_opsets={"tf": 1})
    out = _lower_proto(model)
    x = _special_input((1, 7, 8, 2), np.float32, 21)
    _assert_bitwise(ort_run(out, {"x": x})["y"], tf_extract_image_patches(x, [1, 3, 2, 1], [1, 1, 2, 1], [1, 1, 1, 1], "VALID"))
    for missing in ("ksizes", "strides"):
        attrs = {"ksizes": [1, 3, 3, 1], "strides": [1, 1, 1, 1]}
        del attrs[missing]
        model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", padding="VALID", **attrs)],
                           {"x": [1, 8, 8, 3]}, {"y": [1, 6, 6, 27]}, extra_opsets={"tf": 1})
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not lower_extract_image_patches(graph, ctx).modified
        assert f"{missing} None is not a 4-element list" in ctx.explanations[0].reason


def test_kernel_larger_than_the_input_gives_an_empty_output():
    # VALID, 3x3 kernel on a 2x2 image: no patch fits, TF returns [1, 0, 0, 9]
    model = _model(2, 2, 1, 3, 1, 1, "VALID")
    out = _lower_proto(model)
    x = _special_input((1, 2, 2, 1), np.float32, 22)
    got = ort_run(out, {"x": x})["y"]
    assert got.shape == (1, 0, 0, 9)
    _assert_bitwise(got, tf_extract_image_patches(x, [1, 3, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID"))


@pytest.mark.parametrize("table", ["gather", "slice"])
def test_an_undeclared_output_gets_its_static_shape_and_dtype(monkeypatch, table):
    # the patches feed a Relu and nothing declares their type or shape (no inference for the
    # tf domain): the lowering writes both, in either form
    from graphpass.passes.lowering import lower_extract_image_patches as module

    if table == "slice":
        monkeypatch.setattr(module, "MAX_POSITIONS", 10)
    nodes = [helper.make_node("ExtractImagePatches", ["x"], ["p"], domain="tf", ksizes=[1, 3, 3, 1],
                              strides=[1, 2, 2, 1], rates=[1, 1, 1, 1], padding="SAME"),
             helper.make_node("Relu", ["p"], ["y"])]
    model = make_model(nodes, {"x": [1, 9, 8, 3]}, {"y": [1, None, None, None]}, extra_opsets={"tf": 1})
    graph = gp.load(model).graph
    p = graph.tensors()["p"]
    assert p.dtype is None and p.shape is None
    assert lower_extract_image_patches(graph).stats["fired"] == 1
    assert ("Slice" in ops(graph)) == (table == "slice")
    p = graph.tensors()["p"]
    assert np.dtype(p.dtype) == np.float32 and list(p.shape) == [1, 5, 4, 27]
    out = gp.to_proto(graph)
    check_full(out)
    x = _special_input((1, 9, 8, 3), np.float32, 23)
    ref = np.maximum(tf_extract_image_patches(x, [1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], "SAME"), 0)
    np.testing.assert_array_equal(ort_run(out, {"x": x})["y"], ref)
