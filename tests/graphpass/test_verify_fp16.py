"""fp16 that is really fp16 (issue 17): onnxruntime's CPU provider computes chains of fp16 ops in
fp32; graphpass.fp16 rounds every fp16 value, and verify, bisect and optimize --verify use it."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graphpass as gp
from graphpass.check import fp16
from graphpass.check import verify as V
from graphpass.bisect import bisect
from graphpass.cli import main
from graphpass.errors import VerificationError
from graphpass.testing import make_model

X = np.array([[1.0, 2.0, 0.5, -1.0]], np.float32)


def _chain(dtype, ops, shape=(1, 4)):
    """x -> Cast(dtype) -> ops (Mul/Add/Sub by constants) -> Cast(float) -> y."""
    np_t = np.float16 if dtype == T.FLOAT16 else np.float32
    nodes = [helper.make_node("Cast", ["x"], ["t0"], to=dtype)]
    inits = {}
    for k, (op, c) in enumerate(ops):
        inits[f"c{k}"] = np.array(c, np_t)
        nodes.append(helper.make_node(op, [f"t{k}", f"c{k}"], [f"t{k + 1}"]))
    nodes.append(helper.make_node("Cast", [f"t{len(ops)}"], ["y"], to=T.FLOAT))
    return make_model(nodes, {"x": list(shape)}, {"y": list(shape)}, initializers=inits)


OVERFLOW = [("Mul", 300.0), ("Mul", 300.0), ("Div", 1000.0)]  # 90,000 > 65,504 midway
UNDERFLOW = [("Mul", 1e-4), ("Mul", 1e-4), ("Mul", 1e4)]  # 1e-8 flushes to 0 midway
ABSORPTION = [("Mul", 1e-4), ("Add", 1.0), ("Sub", 1.0)]  # 1 + 1e-4 == 1 in fp16


def _run(model, emulate):
    return V.Runner(model, fp16_emulate=emulate).run({"x": X})["y"]


def test_onnxruntime_alone_hides_fp16_overflow_and_emulation_shows_it():
    m = _chain(T.FLOAT16, OVERFLOW)
    np.testing.assert_array_equal(_run(m, False), [[90, 180, 45, -90]])  # computed in fp32 inside the chain
    # 0.5 * 300 * 300 = 45000 -> 44992 in fp16; / 1000 = 44.992 -> 45.0 (fp16 spacing 1/32 there)
    np.testing.assert_array_equal(_run(m, True), np.array([[np.inf, np.inf, 45.0, -np.inf]], np.float32))


def test_emulation_shows_underflow_and_absorption():
    assert np.all(_run(_chain(T.FLOAT16, UNDERFLOW), True) == 0)  # x*1e-5*1e-3 flushed to zero
    assert np.all(_run(_chain(T.FLOAT16, ABSORPTION), True) == 0)  # 1 + x*1e-4 rounds to 1
    assert np.all(_run(_chain(T.FLOAT16, ABSORPTION), False) != 0)  # what onnxruntime alone computes


def test_each_fp16_value_is_rounded_once_as_numpy_rounds_it():
    """The emulated chain equals numpy's fp16 arithmetic step by step (correctly rounded ops)."""
    x = np.random.default_rng(3).standard_normal((1, 4)).astype(np.float32)
    ops = [("Mul", 3.3), ("Add", 0.1), ("Sub", 7.7), ("Mul", 123.4)]
    ref = x.astype(np.float16)
    for op, c in ops:
        f = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract}[op]
        ref = f(ref.astype(np.float32), np.float32(np.float16(c))).astype(np.float16)
    got = V.Runner(_chain(T.FLOAT16, ops)).run({"x": x})["y"]
    np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_a_model_without_fp16_is_left_alone():
    m = _chain(T.FLOAT, OVERFLOW)
    assert not fp16.has_fp16(m)
    emulated, stats = fp16.emulate(m)
    assert emulated is m and stats["rounded"] == 0


def test_fp16_graph_inputs_and_outputs_keep_their_dtype():
    m = make_model([helper.make_node("Mul", ["x", "c"], ["y"])], {"x": (T.FLOAT16, [4])}, {"y": (T.FLOAT16, [4])},
                   initializers={"c": np.array(300.0, np.float16)})
    out = V.Runner(m).run({"x": np.array([100, 1, -300, 0.5], np.float16)})["y"]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.array([30000, 300, -np.inf, 150], np.float16))


def test_fp16_inside_an_if_branch_is_rounded_too():
    then = helper.make_graph([helper.make_node("Mul", ["h", "k"], ["a"]), helper.make_node("Mul", ["a", "k"], ["b"]),
                              helper.make_node("Div", ["b", "d"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", T.FLOAT16, [1, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", T.FLOAT16, [1, 4])])
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=T.FLOAT16),
             helper.make_node("If", ["cond"], ["r"], then_branch=then, else_branch=other),
             helper.make_node("Cast", ["r"], ["y"], to=T.FLOAT)]
    m = make_model(nodes, {"x": [1, 4]}, {"y": [1, 4]},
                   initializers={"cond": np.array(True), "k": np.array(300, np.float16), "d": np.array(1000, np.float16)})
    assert np.isinf(_run(m, True)[0, 0]) and _run(m, False)[0, 0] == 90


def test_the_emulation_agrees_with_the_mixed_precision_passs_own():
    """The same force_fp16 conversion, run as real fp16 under emulation and as the pass's emulate
    mode (fp32 graph with rounding Casts), gives bitwise the same outputs."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import dbnet_precision

    model = dbnet_precision.build()
    feeds, _, _, _, _ = V.reference(model)
    outs = []
    for emulate in (False, True):
        opts = {"mixed_precision": {"mode": "force_fp16", "emulate": emulate}}
        proto = gp.to_proto(gp.optimize(model, enable=["mixed_precision"], options=opts).graph)
        assert any(t.data_type == T.FLOAT16 for t in proto.graph.initializer) is not emulate
        outs.append(V.Runner(proto).run(feeds))
    for k in outs[0]:
        np.testing.assert_array_equal(outs[0][k], outs[1][k])


def _save(tmp_path, model, name):
    p = tmp_path / name
    onnx.save(model, str(p))
    return str(p)


def test_verify_emulates_fp16_by_default(tmp_path, capsys):
    a = _save(tmp_path, _chain(T.FLOAT, OVERFLOW, (4, 8)), "a.onnx")
    b = _save(tmp_path, _chain(T.FLOAT16, OVERFLOW, (4, 8)), "b.onnx")
    assert main(["verify", a, b, "--no-fp16-emulate"]) == 0  # what onnxruntime alone says
    capsys.readouterr()
    assert main(["verify", a, b]) == 1
    out = capsys.readouterr().out
    assert "fp16 emulated in model B" in out and "inf positions or signs differ" in " ".join(out.split())


def test_verify_all_tensors_names_the_first_overflow(tmp_path):
    report = V.verify_models(_chain(T.FLOAT, OVERFLOW, (4, 8)), _chain(T.FLOAT16, OVERFLOW, (4, 8)), all_tensors=True)
    assert not report.ok and report.first_nonfinite == {"a": None, "b": "t2"}
    assert report.first_divergence == "t2"


def _fp32_overflow_model():
    """x * 300 * 300 / 1000: fine in fp32, 90,000 x overflows fp16 midway."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="mul1"), helper.make_node("Mul", ["a", "k"], ["b"], name="mul2"),
             helper.make_node("Div", ["b", "d"], ["y"], name="div")]
    return make_model(nodes, {"x": [2, 8]}, {"y": [2, 8]},
                      initializers={"k": np.array(300, np.float32), "d": np.array(1e3, np.float32)})


def test_bisect_names_the_application_that_introduces_fp16_overflow(tmp_path):
    res = bisect(_fp32_overflow_model(), tmp_path, enable=["mixed_precision"], target="none")
    assert res.first_bad is not None and res.record.name == "mixed_precision"
    assert res.fp16_emulated and "inf positions or signs differ" in res.detail
    hidden = bisect(_fp32_overflow_model(), tmp_path / "off", enable=["mixed_precision"], target="none", fp16_emulate=False)
    assert hidden.first_bad is None  # onnxruntime alone: "no failing application"


def test_cli_bisect_with_mixed_precision(tmp_path, capsys):
    src = _save(tmp_path, _fp32_overflow_model(), "m.onnx")
    assert main(["bisect", src, "--enable", "mixed_precision", "--target", "none", "--out-dir", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "fp16 emulated" in out and "first bad application: #" in out and "mixed_precision" in out


def test_optimize_force_fp16_verify_sees_the_overflow(tmp_path, capsys):
    src, out = _save(tmp_path, _fp32_overflow_model(), "m.onnx"), tmp_path / "o.onnx"
    args = ["optimize", src, "-o", str(out), "--mixed-precision", "force_fp16", "--target", "none", "--verify", "-q"]
    assert main(args + ["--no-fp16-emulate"]) == 0
    written = out.read_bytes()
    assert main(args) == 1
    # the failed run wrote nothing: the earlier run's output is untouched
    assert "inf positions or signs differ" in capsys.readouterr().err and out.read_bytes() == written


def test_optimize_force_fp16_verify_passes_a_benign_model(tmp_path, capsys):
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    m = make_model(nodes, {"x": [2, 8]}, {"y": [2, 8]}, initializers={"k": np.array(3.0, np.float32)})
    src, out = _save(tmp_path, m, "m.onnx"), tmp_path / "o.onnx"
    assert main(["optimize", src, "-o", str(out), "--mixed-precision", "force_fp16", "--target", "none", "--verify"]) == 0
    assert "with fp16 emulation" in " ".join(capsys.readouterr().out.split())


def test_verify_each_sees_the_overflow():
    with pytest.raises(VerificationError, match="after pass 'mixed_precision'"):
        gp.optimize(_fp32_overflow_model(), enable=["mixed_precision"], target="none", verify_each=True)


@pytest.mark.parametrize("where", ["sparse_initializer", "sparse_value"])
def test_a_sparse_fp16_tensor_is_emulated_in_float32_too(where):
    # A float16 sparse initializer (or a Constant's sparse_value) stayed float16 in the emulated
    # float32 model: Add(float, float16) is invalid and the original could not be run at all
    # (the fuzzer skipped 79 float16 models as "the original fails under fp16 emulation").
    values = onnx.numpy_helper.from_array(np.array([np.inf, -2.5], np.float16), "v")
    sparse = helper.make_sparse_tensor(values, onnx.numpy_helper.from_array(np.array([1, 3], np.int64), "i"), [4])
    nodes = [helper.make_node("Add", ["x16", "s"], ["y"])]
    if where == "sparse_value":
        nodes.insert(0, helper.make_node("Constant", [], ["s"], sparse_value=sparse))
        sparse.values.name = "unused"
    else:
        sparse.values.name = "s"
    model = make_model(nodes, {"x16": (T.FLOAT16, [4])}, {"y": (T.FLOAT16, [4])})
    if where == "sparse_initializer":
        model.graph.sparse_initializer.append(sparse)
    x = np.array([1.0, 2.0, -0.0, 0.5], np.float16)
    plain = V.Runner(model, fp16_emulate=False).run({"x16": x})["y"]
    emulated = V.Runner(model, fp16_emulate=True).run({"x16": x})["y"]
    assert emulated.dtype == np.float16
    np.testing.assert_array_equal(emulated, plain)  # one op: nothing to round between ops
    np.testing.assert_array_equal(emulated, [1.0, np.inf, -0.0, -2.0])


def test_a_model_whose_only_fp16_is_a_sparse_initializer_has_fp16():
    values = onnx.numpy_helper.from_array(np.array([1.5], np.float16), "s")
    sparse = helper.make_sparse_tensor(values, onnx.numpy_helper.from_array(np.array([2], np.int64), "i"), [4])
    model = make_model([helper.make_node("Cast", ["s"], ["y"], to=T.FLOAT)], {}, {"y": [4]})
    model.graph.sparse_initializer.append(sparse)
    assert fp16.has_fp16(model)
    np.testing.assert_array_equal(V.Runner(model, fp16_emulate=True).run({})["y"], [0, 0, 1.5, 0])
