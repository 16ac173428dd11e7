"""One output check (graphpass.verify.check_outputs) behind verify, optimize --verify, verify-each,
bisect, graphpass.testing, the conformance run and the fuzzer; and the check layer's imports."""


import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graphpass
from graphpass.check import verify as V
from graphpass.check.promise import EXACT, REASSOCIATION, Promise
from graphpass.testing import make_model



def _relu(op: str = "Relu"):
    return make_model([helper.make_node(op, ["x"], ["y"])], {"x": [4]}, {"y": [4]})


FEEDS = {"x": np.array([-1.0, -0.0, 2.0, np.nan], np.float32)}


def test_models_paths_runners_and_outputs_are_all_accepted(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_relu(), str(path))
    ref = V.Runner(_relu()).run(FEEDS)
    for reference in (_relu(), str(path), path, _relu().SerializeToString(), V.Runner(_relu()), ref):
        for candidate in (_relu(), str(path), path, _relu().SerializeToString(), V.Runner(_relu(), fp16_emulate=False)):
            checked = V.check_outputs(reference, candidate, FEEDS, V.Tolerance(0, 0, "exact"))
            assert checked.ok and [c.name for c in checked.comparisons] == ["y"] and checked.describe() == ""


def test_bytes_that_are_no_model_are_a_bad_model_error():
    with pytest.raises(graphpass.BadModelError):
        V.check_outputs(_relu(), b"not a model", FEEDS)


def test_a_difference_is_reported_with_the_tolerance():
    checked = V.check_outputs(_relu(), _relu("Abs"), FEEDS)
    assert not checked.ok and checked.failures[0].name == "y"
    assert checked.tolerance.why == "default" and "at rtol 0.0001, atol 0.001 (default)" in checked.describe()


def test_promises_pick_the_tolerance_exact_for_exact_passes():
    assert V.check_outputs(_relu(), _relu(), FEEDS, promises=[EXACT]).tolerance.rtol == 0
    tol = V.check_outputs(_relu(), _relu(), FEEDS, promises=[EXACT, REASSOCIATION]).tolerance
    assert (tol.rtol, tol.atol) == (V.DEFAULT_RTOL, V.DEFAULT_ATOL)
    assert V.check_outputs(_relu(), _relu(), FEEDS, rtol=0.5).tolerance.rtol == 0.5


def test_exact_comparison_sees_the_sign_of_zero():
    # Relu(-0.0) is -0.0 or 0.0 depending on the kernel; Abs(-0.0) is +0.0: exact must tell
    ref = {"y": np.array([-0.0], np.float32)}
    checked = V.check_outputs(ref, {"y": np.array([0.0], np.float32)}, {}, V.Tolerance(0, 0, "exact"))
    assert not checked.ok and "sign of zero" in checked.failures[0].note
    assert V.check_outputs(ref, {"y": np.array([0.0], np.float32)}, {}, V.Tolerance(1e-5, 0, "t")).ok


def test_ulp_floor_and_magnitude_atol():
    ref = {"y": np.array([0.4833984375], np.float16)}
    one_ulp = {"y": np.nextafter(ref["y"], np.float16(1))}
    tol = V.Tolerance(1e-5, 1e-6, "promise")
    assert not V.check_outputs(ref, one_ulp, {}, tol).ok
    assert V.check_outputs(ref, one_ulp, {}, tol, ulp_floor=True).ok
    big = {"y": np.array([1000.0, 0.0], np.float32)}
    off = {"y": np.array([1000.0, 0.05], np.float32)}
    assert not V.check_outputs(big, off, {}, V.Tolerance(0, 1e-4, "t")).ok
    assert V.check_outputs(big, off, {}, V.Tolerance(0, 1e-4, "t"), magnitude_atol=True).ok


def test_a_candidate_onnxruntime_cannot_run_is_a_bad_model_error():
    broken = _relu()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(graphpass.BadModelError, match="onnxruntime"):
        V.check_outputs(_relu(), broken, FEEDS)


def test_missing_and_retyped_outputs_fail():
    ref = {"y": np.zeros(2, np.float32), "z": np.zeros(2, np.int64)}
    checked = V.check_outputs(ref, {"y": np.zeros(2, np.float64)}, {}, V.Tolerance(1, 1, "loose"))
    assert [c.note.split(" ")[0] for c in checked.failures] == ["dtype", "missing"]


def test_int_outputs_are_exact_in_the_conformance_and_testing_helpers():
    from graphpass.testing import assert_equivalent

    m = make_model([helper.make_node("Cast", ["x"], ["y"], to=T.INT64)], {"x": [3]}, {"y": (T.INT64, [3])})
    assert_equivalent(m, m, feeds={"x": np.array([1.2, -3.7, 1e9], np.float32)})
    plus_one = make_model([helper.make_node("Cast", ["x"], ["c"], to=T.INT64),
                           helper.make_node("Add", ["c", "one"], ["y"])], {"x": [3]}, {"y": (T.INT64, [3])},
                          {"one": np.array(1, np.int64)})
    with pytest.raises(AssertionError, match="output 'y' differs"):
        assert_equivalent(m, plus_one, feeds={"x": np.array([1e9, 0, 0], np.float32)}, rtol=1.0, atol=1.0)


def test_promise_lives_in_its_own_module_and_pass_base_reexports_it():
    from graphpass.passes.framework import pass_base

    assert pass_base.Promise is Promise and pass_base.EXACT is EXACT and pass_base.REASSOCIATION is REASSOCIATION
    assert V.UNDECLARED.name == "undeclared" and isinstance(V.UNDECLARED, Promise)


def test_promises_of_reads_the_registry_the_caller_gives():
    known = graphpass.all_passes()
    assert V.promises_of(["fold_batchnorm", "nope"], known) == [known["fold_batchnorm"].promise, V.UNDECLARED]


# That verify and precision import nothing above the check layer is tests/architecture/test_layers.py's job.


def test_precision_checks_on_the_conversion_it_is_given():
    from graphpass.check import precision as P

    nodes = [helper.make_node("Mul", ["x", "big"], ["y"], name="mul")]
    m = make_model(nodes, {"x": [4]}, {"y": [4]}, {"big": np.array(1e5, np.float32)})
    seen = []

    def convert(model, mode, keep):
        seen.append((mode, list(keep)))
        from graphpass.passes.precision.mixed_precision import convert_model

        return convert_model(model, mode, keep)

    report = P.analyze(m, feeds={"x": np.ones(4, np.float32)}, convert=convert)
    assert seen and seen[0] == ("force_fp16", []) and report.checked and report.keep_fp32 == ["mul"]


def test_mixed_precision_reads_the_op_facts_of_the_ground_floor():
    from graphpass.ir import op_facts
    from graphpass.passes.precision import mixed_precision as mp

    assert mp.FLOAT_OPS is op_facts.FLOAT_OPS and mp.schema_data_slots is op_facts.schema_data_slots
    assert mp.WHITE | mp.BLACK <= op_facts.FLOAT_OPS
    assert op_facts.schema_data_slots("Resize", 3, 1, 19) == ({0}, {0})  # roi and scales keep their dtype
