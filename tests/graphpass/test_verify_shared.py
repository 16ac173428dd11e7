"""optimize --verify, verify-each and bisect judge with verify's one comparison, at the tolerance
the applied passes promise; every verb refuses an --input-shape that names no input."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graphpass as gp
from graphpass.check import verify as V
from graphpass.bisect import bisect
from graphpass.cli import main
from graphpass.errors import VerificationError
from graphpass.passes.framework import Pass, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, REASSOCIATION
from graphpass.passes.framework.registry import unregister
from graphpass.testing import make_model


def _int_model():
    """ids = x + [0, 5, 100000]; y = Relu(f): one int64 output, one float output."""
    nodes = [helper.make_node("Add", ["x", "c"], ["ids"], name="add"), helper.make_node("Relu", ["f"], ["y"], name="relu")]
    return make_model(nodes, {"x": (T.INT64, [3]), "f": [2, 3]}, {"ids": (T.INT64, [3]), "y": [2, 3]},
                      initializers={"c": np.array([0, 5, 100000], np.int64)})


class _ShiftIds(Pass):
    """Wrong on purpose: rewrites the int constant [0, 5, 100000] to [3, 12, 99991] (once)."""

    name = "test_shift_ids"
    summary = "deliberately wrong int rewrite (tests only)"
    kind = PassKind.CLEANUP
    default_enabled = False
    promise = EXACT

    def run(self, graph, ctx):
        import onnx_graphsurgeon as gs

        for t in graph.tensors().values():
            if isinstance(t, gs.Constant) and t.name == "c" and int(t.values[0]) == 0:
                t.values = np.array([3, 12, 99991], np.int64)
                return PassResult(True, {"shifted": 1})
        return PassResult(False)


class _Ulp(Pass):
    """Adds one float32 ulp to Relu's output by an Add of a tiny constant (once)."""

    name = "test_ulp"
    summary = "one-ulp change (tests only)"
    kind = PassKind.CLEANUP
    default_enabled = False
    promise = EXACT

    def run(self, graph, ctx):
        import onnx_graphsurgeon as gs

        relu = next((n for n in graph.nodes if n.op == "Relu"), None)
        if relu is None or graph.__dict__.get("_ulp"):
            return PassResult(False)
        out = relu.outputs[0]
        raw = gs.Variable("relu_raw", dtype=np.float32, shape=out.shape)
        relu.outputs = [raw]
        graph.nodes.append(gs.Node("Add", inputs=[raw, gs.Constant("eps", np.array(1e-6, np.float32))], outputs=[out]))
        graph.__dict__["_ulp"] = True
        return PassResult(True, {"added": 1})


class _UlpTolerant(_Ulp):
    name = "test_ulp_tolerant"
    promise = REASSOCIATION


@pytest.fixture(autouse=True)
def _registered():
    for cls in (_ShiftIds, _Ulp, _UlpTolerant):
        register(cls)
    yield
    for cls in (_ShiftIds, _Ulp, _UlpTolerant):
        unregister(cls.name)


def _save(tmp_path, model, name="m.onnx"):
    p = tmp_path / name
    onnx.save(model, str(p))
    return str(p)


def test_optimize_verify_compares_int_outputs_exactly(tmp_path, capsys):
    src, out = _save(tmp_path, _int_model()), tmp_path / "o.onnx"
    assert main(["optimize", src, "-o", str(out), "--passes", "test_shift_ids", "--target", "none", "--verify", "-q"]) == 1
    err = capsys.readouterr().err
    assert "output 'ids' differs" in err and "3 of 3 values differ (exact)" in err and not out.exists()


def test_verify_each_compares_int_outputs_exactly():
    with pytest.raises(VerificationError, match="after pass 'test_shift_ids': output 'ids' differs"):
        gp.optimize(_int_model(), passes=["test_shift_ids"], target="none", verify_each=True)


def test_bisect_compares_int_outputs_exactly(tmp_path):
    res = bisect(_int_model(), tmp_path, passes=["eliminate_identity", "test_shift_ids"], target="none")
    assert res.first_bad == 1 and res.record.name == "test_shift_ids" and "output 'ids'" in res.detail


def test_only_exact_passes_means_exact_comparison(tmp_path, capsys):
    """An 'exact' pass that moves a value by 1e-6 fails --verify; the same change from a pass
    promising a tolerance passes at that promise."""
    src = _save(tmp_path, _int_model())
    out = tmp_path / "o.onnx"
    base = ["optimize", src, "-o", str(out), "--target", "none", "--verify"]
    assert main(base + ["--passes", "test_ulp", "-q"]) == 1
    assert "exact (only exact passes changed the graph)" in capsys.readouterr().err
    assert main(base + ["--passes", "test_ulp_tolerant"]) == 0
    assert "reassociation" in " ".join(capsys.readouterr().out.split())
    assert main(base + ["--passes", "test_ulp", "--atol", "1e-5", "-q"]) == 0  # given: the user's tolerance


def test_tolerance_for():
    assert V.tolerance_for([EXACT, EXACT]).rtol == 0 and V.tolerance_for([]).atol == 0
    t = V.tolerance_for([EXACT, REASSOCIATION])
    assert (t.rtol, t.atol) == (max(V.DEFAULT_RTOL, REASSOCIATION.rtol), max(V.DEFAULT_ATOL, REASSOCIATION.atol))
    assert V.tolerance_for([EXACT], fp16=True).atol == V.FP16_ATOL
    assert V.tolerance_for([REASSOCIATION], rtol=0.5).rtol == 0.5


def _verb_args(verb, src, tmp_path):
    return {"optimize": ["optimize", src, "-o", str(tmp_path / "o.onnx"), "--target", "none"],
            "cost": ["cost", src],
            "bisect": ["bisect", src, "--target", "none", "--out-dir", str(tmp_path / "b")],
            "verify": ["verify", src, src],
            "precision": ["precision", src]}[verb]


@pytest.mark.parametrize("verb", ["optimize", "cost", "bisect", "verify", "precision"])
def test_input_shape_naming_no_input_is_exit_2_in_every_verb(tmp_path, capsys, verb):
    src = _save(tmp_path, _int_model())
    assert main(_verb_args(verb, src, tmp_path) + ["--input-shape", "xx:3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'xx', which is not a graph input (inputs: x, f)" in err


def test_verify_refuses_a_wrong_rank_like_load_does(tmp_path, capsys):
    src = _save(tmp_path, _int_model())
    assert main(["verify", src, src, "--input-shape", "f:2,3,4"]) == 2
    assert "rank 3 given, the model's input has rank 2" in capsys.readouterr().err


def test_verify_table_shows_the_inputs_it_fed_and_the_rule(tmp_path, capsys):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [None, 3]}, {"y": [None, 3]})
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    src = _save(tmp_path, m)
    assert main(["verify", src, src, "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "inputs (seeded random, seed 7): x float32[2(batch), 3]" in out
    assert "symbolic dims (batch) fed as 2" in out
    assert "comparison: rtol 0.0001, atol 0.001 (default)" in out
    assert main(["verify", src, src, "--input-shape", "x:5,3", "--format", "json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["fed"] == [{"name": "x", "dtype": "float32", "shape": [5, 3], "symbolic": {}, "given": True}]
    assert d["seed"] == 0 and d["rtol"] == V.DEFAULT_RTOL


def test_symbolic_dims_fall_back_to_1_when_the_original_needs_it(tmp_path, capsys):
    """A model that only runs with batch 1 (a Reshape to a fixed size) is fed 1, and says so."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = make_model(nodes, {"x": [None, 3]}, {"y": [3]}, initializers={"s": np.array([3], np.int64)})
    src = _save(tmp_path, m)
    assert main(["verify", src, src]) == 0
    out = capsys.readouterr().out
    assert "x float32[1(x[0]), 3]" in out and "symbolic dims fed as 1: the original model fails with 2" in out


class _Unrunnable(Pass):
    """Wrong on purpose: renames Relu to an op onnxruntime does not know (once)."""

    name = "test_unrunnable"
    summary = "deliberately invalid rewrite (tests only)"
    kind = PassKind.CLEANUP
    default_enabled = False
    promise = EXACT

    def run(self, graph, ctx):
        relu = next((n for n in graph.nodes if n.op == "Relu"), None)
        if relu is None:
            return PassResult(False)
        relu.op, relu.domain = "Mystery", "com.vendor"
        return PassResult(True, {"broken": 1})


def test_an_optimized_model_onnxruntime_cannot_run_fails_verification(tmp_path, capsys):
    register(_Unrunnable)
    try:
        src, out = _save(tmp_path, _int_model()), tmp_path / "o.onnx"
        code = main(["optimize", src, "-o", str(out), "--passes", "test_unrunnable", "--target", "none", "--verify", "-q"])
        err = capsys.readouterr().err
        assert code == 1 and "verification failed: the optimized model does not run where the input does: onnxruntime cannot run the model" in err
        assert not out.exists()
    finally:
        unregister(_Unrunnable.name)


def test_a_model_b_that_cannot_take_the_inputs_fed_is_named(tmp_path, capsys):
    """B assumes batch 1 (a Reshape to a fixed size): at the fed batch 2 it cannot run; the message
    names B and the inputs fed, in one line."""
    a = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [None, 4]}, {"y": [None, 4]})
    b = make_model([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                   {"x": [None, 4]}, {"y": [None, 4]}, initializers={"s": np.array([1, 4], np.int64)})
    pa, pb = _save(tmp_path, a, "a.onnx"), _save(tmp_path, b, "b.onnx")
    assert main(["verify", pa, pb]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model B: onnxruntime failed to run the model" in err
    assert "inputs fed: x float32[2(x[0]), 4]" in err
    assert main(["verify", pa, pb, "--symbolic-dim", "1"]) == 0
