"""ExtractImagePatches -> Conv, checked against a numpy reference of TensorFlow's semantics."""

import math

import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass.infra import PassContext
from graphpass.passes import lower_extract_image_patches
from graphpass.testing import make_model, ops, ort_run, check_full


def tf_extract_image_patches(x, ksizes, strides, rates, padding):
    """numpy reference of tf.image.extract_patches (NHWC; channel order kh, kw, C)."""
    n, h, w, c = x.shape
    _, kh, kw, _ = ksizes
    _, sh, sw, _ = strides
    _, rh, rw, _ = rates
    ekh, ekw = (kh - 1) * rh + 1, (kw - 1) * rw + 1
    if padding == "SAME":
        oh, ow = math.ceil(h / sh), math.ceil(w / sw)
        ph = max((oh - 1) * sh + ekh - h, 0)
        pw = max((ow - 1) * sw + ekw - w, 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = math.ceil((h - ekh + 1) / sh), math.ceil((w - ekw + 1) / sw)
    out = np.zeros((n, oh, ow, kh * kw * c), x.dtype)
    for y in range(oh):
        for z in range(ow):
            for i in range(kh):
                for j in range(kw):
                    out[:, y, z, (i * kw + j) * c:(i * kw + j + 1) * c] = x[:, y * sh + i * rh, z * sw + j * rw, :]
    return out


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
    graph = gp.load(_model(h, w, c, 3, s, r, padding))
    result = lower_extract_image_patches(graph)
    assert result.stats["fired"] == 1 and ops(graph) == ["Transpose", "Conv", "Transpose"]
    out = gp.to_proto(graph)
    check_full(out)
    x = np.random.default_rng(h * 100 + c).standard_normal((1, h, w, c)).astype(np.float32)
    got = ort_run(out, {"x": x})["y"]
    np.testing.assert_array_equal(got, tf_extract_image_patches(x, [1, 3, 3, 1], [1, s, s, 1], [1, r, r, 1], padding))


@pytest.mark.parametrize("attrs, reason", [
    ({"padding": "REFLECT"}, "neither SAME nor VALID"),
    ({"ksizes": [2, 3, 3, 1]}, "not 1 on the batch and channel axes"),
])
def test_unlowerable_attributes_are_left_with_a_reason(attrs, reason):
    base = {"ksizes": [1, 3, 3, 1], "strides": [1, 1, 1, 1], "rates": [1, 1, 1, 1], "padding": "VALID", **attrs}
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", **base)],
                       {"x": [1, 8, 8, 3]}, {"y": [1, 6, 6, 27]}, extra_opsets={"tf": 1})
    graph = gp.load(model)
    ctx = PassContext()
    assert not lower_extract_image_patches(graph, ctx).modified
    assert ops(graph) == ["ExtractImagePatches"] and reason in ctx.explanations[0].reason


def test_symbolic_size_with_same_padding_is_refused():
    model = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 3, 1],
                                         strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")],
                       {"x": [1, "H", "W", 3]}, {"y": [1, "H", "W", 27]}, extra_opsets={"tf": 1})
    graph = gp.load(model)
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

    graph = gp.load(siammask_patches.build())
    for n in graph.nodes:
        if n.op == "ExtractImagePatches":
            A.set_engine(n, "HOST")  # the py_func fallback
    before = create().estimate(graph)
    result = gp.optimize(graph)
    after = create().estimate(result.graph)
    assert before.crossings and not after.crossings
    assert after.total_us < before.total_us
    assert "ExtractImagePatches" not in ops(result.graph)
