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


def test_a_fused_attention_names_the_tensors_that_make_its_scores():
    """After fuse_attention the scores are inside the op: the query (here its projection, which
    overflows float16) is what the analysis can name."""
    import graphpass as gp
    from graphpass.passes.framework import PassContext
    from graphpass.passes.fusion.fuse_attention import FuseAttention

    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"], name="q_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [1, 2, 4, 8]
    model = make_model(nodes, {"x": shape, "k": shape, "v": shape}, {"y": shape},
                       initializers={"w": (np.eye(8) * 1e5).astype(np.float32)}, opset=18)
    m = gp.load(model)
    assert FuseAttention()(m, PassContext(target="ascend910b2")).modified
    fused = gp.to_proto(m, emit="device")
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in ("x", "k", "v")}
    report = P.analyze(fused, feeds, check=False)
    f = next(f for f in report.findings if f.tensor == "q")
    assert f.hazard == "overflow" and f.role == "attention scores input"
    assert "fused attention's scores" in f.detail
