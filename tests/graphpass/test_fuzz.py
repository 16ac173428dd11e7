"""Property-based fuzzing (CI-sized; ``python benchmarks/fuzz.py`` runs 2,000 per family).

1. random DAGs of the project's own ops through the default pipeline keep the checker and ORT
   happy (graphpass.fuzzing.models/check);
2. the differential tester: per dtype family, small models with special values, control flow,
   TopK, the fusions' patterns and storage forms through the default pipeline or one pass, each
   held to its promise (graphpass.fuzzing.differential). A failure of a kind already recorded as
   a strict xfail in test_fuzz_findings.py (a bug other branches are fixing) is tolerated here;
   any other failure fails the test.
Derandomized, so CI is reproducible.
"""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from graphpass._fuzz_cases import Case
from graphpass.fuzzing import FAMILIES, cases, check, compare, differential, models

_CI = dict(deadline=None, derandomize=True, database=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@settings(max_examples=25, **_CI)
@given(models())
def test_random_models_optimize_to_equivalent_models(model):
    assume(check(model))  # an input onnxruntime itself cannot run is not counted


#: failure kinds still tolerated: none. Every kind the fuzzer found was fixed (its test is in
#: test_fuzz_findings.py); a tolerance's stated limit (an intermediate overflowed) is its own
#: status, "limit", found in the run itself. Matched against
#: "<storage form> | <signature> | <promise> | <reason>"
KNOWN: dict[str, str] = {}


def _known(case, outcome) -> str | None:
    text = f"{case.storage} | {outcome.signature} | {outcome.promise} | {outcome.reason}"
    return next((test for pat, test in KNOWN.items() if re.search(pat, text)), None)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_pass_keeps_its_promise(family):
    seen = {"ok": 0, "skip": 0, "fail": 0, "limit": 0}

    @settings(max_examples=30, **_CI)
    @given(cases(family))
    def prop(case):
        outcome = differential(case)
        seen[outcome.status] += 1
        if outcome.status == "fail":
            assert _known(case, outcome), f"{case.describe()}: {outcome.reason}"

    prop()
    assert seen["ok"] + seen["fail"] + seen["limit"] >= 1, seen  # examples are really checked, not all skipped


def test_compare_is_bitwise_for_exact_and_keeps_nan_inf_for_tolerance():
    a = np.array([0.0, 1.0, np.nan, np.inf], np.float32)
    assert compare(a, a.copy(), True, 0, 0) == ""
    assert "bitwise" in compare(a, np.array([-0.0, 1.0, np.nan, np.inf], np.float32), True, 0, 0)
    assert "NaN" in compare(a, np.array([0.0, 1.0, 1.0, np.inf], np.float32), False, 1, 1)
    assert "inf" in compare(a, np.array([0.0, 1.0, np.nan, -np.inf], np.float32), False, 1, 1)
    assert compare(a, np.array([0.0, 1.0 + 1e-7, np.nan, np.inf], np.float32), False, 1e-5, 0) == ""
    assert "beyond" in compare(a, np.array([0.0, 1.01, np.nan, np.inf], np.float32), False, 1e-5, 1e-6)
    assert "dtype" in compare(a, a.astype(np.float64), True, 0, 0)


def test_differential_catches_a_pass_that_breaks_exactness(monkeypatch):
    """The tester can fail: an 'exact' pass that turns x + 0 into x is caught on -0.0 + 0."""
    from onnx import TensorProto, helper, numpy_helper

    from graphpass.passes.framework.pass_base import EXACT, Pass, PassKind, PassResult
    from graphpass.passes.framework.registry import register, unregister

    class DropAddZero(Pass):
        name = "test_drop_add_zero"
        summary = "x + 0 -> x (wrong for -0.0)"
        kind = PassKind.CLEANUP
        default_enabled = False
        promise = EXACT

        def run(self, graph, ctx):
            for node in list(graph.nodes):
                if node.op == "Add":
                    node.op = "Identity"
                    node.inputs.pop()
                    return PassResult(True, {"rewritten": 1})
            return PassResult(False)

    register(DropAddZero)
    try:
        g = helper.make_graph([helper.make_node("Add", ["x", "z"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(np.zeros(2, np.float32), "z")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        out = differential(Case("float32", "t", "inline", 17, m, {"x": np.array([-0.0, 1.0], np.float32)},
                                ["test_drop_add_zero"]))
        assert out.status == "fail" and "bitwise" in out.reason, out
    finally:
        unregister("test_drop_add_zero")


def test_a_reproducer_of_an_external_data_case_is_self_contained(tmp_path):
    """The written model is the stored form the failure came from (its tensors in a .data file
    beside it), and the folder runs wherever it is moved."""
    import shutil
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from graphpass.fuzzing import Outcome, write_reproducer

    small, big = np.arange(2, dtype=np.float32) - 0.5, np.linspace(-1, 1, 300, dtype=np.float32)  # 8 B and 1,200 B
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "s"], ["y"]), helper.make_node("Add", ["b", "t"], ["z"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("b", TensorProto.FLOAT, [300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("z", TensorProto.FLOAT, [300])],
        [numpy_helper.from_array(small, "s"), numpy_helper.from_array(big, "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"a": np.array([-0.0, np.nan], np.float32), "b": np.ones(300, np.float32)}
    case = Case("float32", "elementwise", "external", 17, model, feeds, ["eliminate_identity"])
    path = write_reproducer(case, Outcome("fail", "a made-up failure", "sig"), tmp_path / "found")
    assert len(model.graph.initializer[0].raw_data) > 0  # the case itself is left inline
    moved = tmp_path / "elsewhere"
    shutil.move(str(tmp_path / "found"), str(moved))
    stored = moved / path.name
    head = onnx.load(str(stored), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in head.graph.initializer)
    locations = {e.value for t in head.graph.initializer for e in t.external_data if e.key == "location"}
    assert len(locations) == 1 and (moved / locations.pop()).is_file()  # relative, beside the model
    full = onnx.load(str(stored))
    for t, ref in zip(full.graph.initializer, (small, big)):
        assert numpy_helper.to_array(t).tobytes() == ref.tobytes()
    script = stored.with_suffix(".py")
    run = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Outcome(status='ok'" in run.stdout


def test_differential_puts_the_logger_level_back():
    """It silenced graphpass's logger for good: a CLI warning test run after the fuzzer saw nothing."""
    import logging

    from onnx import TensorProto, helper

    logger = logging.getLogger("graphpass")
    before = logger.level
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    differential(Case("float32", "t", "inline", 17, m, {"x": np.array([-0.0, 1.0], np.float32)}, ["eliminate_identity"]))
    assert logger.level == before
