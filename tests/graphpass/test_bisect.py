"""bisect names a deliberately wrong rewrite hidden in a pipeline of correct ones."""

import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.bisect import bisect
from graphpass.cli import main
from graphpass.passes.framework import Pass, PassKind, PassResult, register
from graphpass.passes.framework.registry import unregister
from graphpass.testing import make_model


class _BreakSecondRelu(Pass):
    """Wrong on purpose: turns the second Relu it sees into a Neg (once)."""

    name = "test_break_second_relu"
    summary = "deliberately wrong rewrite (tests only)"
    kind = PassKind.CLEANUP
    default_enabled = False

    def run(self, graph, ctx):
        relus = [n for n in graph.nodes if n.op == "Relu"]
        if len(relus) < 2 or getattr(graph, "_broken", False):
            return PassResult(False)
        relus[1].op = "Neg"
        graph.__dict__["_broken"] = True
        return PassResult(True, {"broken": 1})


def _model():
    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id0"), helper.make_node("Relu", ["a"], ["b"], name="relu1"),
             helper.make_node("Transpose", ["b"], ["c"], perm=[1, 0], name="t1"),
             helper.make_node("Transpose", ["c"], ["d"], perm=[1, 0], name="t2"),
             helper.make_node("Relu", ["d"], ["e"], name="relu2"), helper.make_node("Identity", ["e"], ["y"], name="id1")]
    return make_model(nodes, {"x": [3, 4]}, {"y": [3, 4]})


PIPE = ["eliminate_identity", "merge_transposes", "test_break_second_relu", "eliminate_dead_nodes"]


@pytest.fixture(autouse=True)
def _registered():
    register(_BreakSecondRelu)
    yield
    unregister(_BreakSecondRelu.name)


def test_bisect_names_the_wrong_rewrite_and_writes_both_models(tmp_path):
    res = bisect(_model(), tmp_path, passes=PIPE, target="none")
    assert res.first_bad is not None and res.record.name == "test_break_second_relu"
    assert res.applications >= 3 and res.first_bad == 3  # identity, transposes, then the wrong one
    # the wrong rewrite kept relu2's name and changed its op: neither added nor removed, changed
    assert res.changed == ["relu2 (Relu -> Neg)"] and res.added == [] and res.removed == []
    assert res.record.stats == {"broken": 1}
    good, bad = onnx.load(res.last_good), onnx.load(res.first_bad_model)
    assert "Neg" not in {n.op_type for n in good.graph.node} and "Neg" in {n.op_type for n in bad.graph.node}


def test_bisect_of_a_correct_pipeline_finds_nothing(tmp_path):
    res = bisect(_model(), tmp_path, passes=PIPE[:2] + PIPE[3:], target="none")
    assert res.first_bad is None and res.applications >= 2


def test_cli_bisect(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_model().SerializeToString())
    code = main(["bisect", str(src), "--passes", ",".join(PIPE), "--target", "none", "--out-dir", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 1 and "first bad application: #3 test_break_second_relu" in out
    assert "nodes changed: relu2 (Relu -> Neg)" in out
    assert (tmp_path / "b" / "first_bad.onnx").exists()


def test_optimize_verify_failure_exits_1_and_removes_the_output(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_model().SerializeToString())
    out = tmp_path / "o.onnx"
    args = ["optimize", str(src), "-o", str(out), "--passes", ",".join(PIPE), "--target", "none", "--verify", "-q"]
    assert main(args) == 1
    assert "verification failed" in capsys.readouterr().err and not out.exists()
    assert main(args + ["--keep-failed"]) == 1 and out.exists()
