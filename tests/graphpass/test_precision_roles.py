"""issue 26: the fp16 precision analysis names the softmax and normalization inputs that overflow."""

import numpy as np
from onnx import helper

from graphpass.check import precision as P
from graphpass.testing import make_model

RNG = np.random.default_rng(2626)


def test_attention_scores_that_overflow_are_named_softmax_inputs():
    nodes = [helper.make_node("MatMul", ["q", "k"], ["scores"], name="qk"),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1, name="softmax")]
    model = make_model(nodes, {"q": [4, 8], "k": [8, 4]}, {"p": [4, 4]})
    feeds = {"q": (RNG.standard_normal((4, 8)) * 300).astype(np.float32),
             "k": (RNG.standard_normal((8, 4)) * 300).astype(np.float32)}
    report = P.analyze(model, feeds, check=False)
    f = next(f for f in report.findings if f.tensor == "scores")
    assert f.hazard == "overflow" and f.role == "softmax input"
    assert "Softmax input" in f.detail and "bfloat16" in f.detail
    assert "<softmax input>" in report.to_table()


def test_rms_norm_sum_of_squares_and_its_input_are_named():
    """x of |x| ~ 1000 fits fp16; x * x does not (the RMSNorm's variance overflows first)."""
    nodes = [helper.make_node("Mul", ["x", "g"], ["h"], name="scale"),
             helper.make_node("Pow", ["h", "two"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="mean"),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["h", "rms"], ["y"])]
    model = make_model(nodes, {"x": [2, 16]}, {"y": [2, 16]},
                       initializers={"g": np.array(1.0, np.float32), "two": np.array(2.0, np.float32),
                                     "eps": np.array(1e-6, np.float32)})
    feeds = {"x": (RNG.standard_normal((2, 16)) * 1000).astype(np.float32)}
    report = P.analyze(model, feeds, check=False)
    roles = {f.tensor: f.role for f in report.findings}
    assert roles.get("sq") == "normalization sum of squares"
    assert all(f.role == "" for f in report.findings if f.tensor not in ("sq", "ms", "mse"))


def test_an_overflow_elsewhere_has_no_role():
    nodes = [helper.make_node("Mul", ["x", "gain"], ["y"], name="gain_mul"),
             helper.make_node("Relu", ["y"], ["out"], name="relu")]
    model = make_model(nodes, {"x": [8]}, {"out": [8]}, initializers={"gain": np.array(1e3, np.float32)})
    report = P.analyze(model, {"x": np.full(8, 100.0, np.float32)}, check=False)
    f = next(f for f in report.findings if f.tensor == "y")
    assert f.hazard == "overflow" and f.role == ""
