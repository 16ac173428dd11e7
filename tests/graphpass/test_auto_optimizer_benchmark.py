"""benchmarks/auto_optimizer.py without auto_optimizer: its measuring and table code, with a stand-in
for auto_optimizer's venv (a `python` that copies the model, or breaks it)."""

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("ao_bench", BENCH / "auto_optimizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(BENCH))


def _venv(tmp_path: Path, body: str) -> Path:
    """A fake venv whose python is called as `python -c JOB src dst`."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\n" + body + "\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return venv


def _model(path: Path) -> Path:
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _feeds():
    import numpy as np

    return {"x": np.array([[-1.0, 0.0, 2.0], [float("nan"), -0.0, 3.0]], np.float32)}


@pytest.mark.skipif(os.name != "posix", reason="the stand-in venv is a shell script")
def test_measure_counts_nodes_and_flags_where_graphpass_is_behind(bench, tmp_path):
    src = _model(tmp_path / "m.onnx")
    # the stand-in "auto_optimizer" drops the Identity: one node fewer than the input
    body = (f'"{sys.executable}" -c "import onnx,sys; m=onnx.load(sys.argv[1]); m.graph.node[1].input[0]=\'x\'; '
            'del m.graph.node[0]; onnx.save(m, sys.argv[2])" "$3" "$4"; echo \'{"applied": ["KnowledgeX"]}\'')
    venv = _venv(tmp_path, body)
    rows = bench.measure("m", src, _feeds(), tmp_path / "work", venv, "ascend910a", timeout=120)
    by = {r["tool"]: r for r in rows}
    assert by["(original)"]["nodes"] == 2 and by["auto_optimizer"]["nodes"] == 1
    assert by["graphpass"]["nodes"] == 1  # eliminate_identity
    assert by["graphpass"]["matches"] and by["auto_optimizer"]["matches"]
    assert by["auto_optimizer"]["applied"] == ["KnowledgeX"]
    assert by["graphpass"]["aicpu"] == 0
    assert bench.behind(rows) == []
    table = bench.render(rows)
    assert "| m | 2 / 1 / 1 |" in table and "X" in table and "behind auto_optimizer on 0" in table


@pytest.mark.skipif(os.name != "posix", reason="the stand-in venv is a shell script")
def test_a_broken_or_failing_tool_is_a_row_not_a_crash(bench, tmp_path):
    src = _model(tmp_path / "m.onnx")
    venv = _venv(tmp_path, 'echo "Traceback: it broke" >&2; exit 1')
    rows = bench.measure("m", src, _feeds(), tmp_path / "work", venv, "ascend910a", timeout=120)
    ao = next(r for r in rows if r["tool"] == "auto_optimizer")
    assert ao["error"] == "Traceback: it broke" and ao["nodes"] is None and not ao["matches"]
    assert "failed" in bench.render(rows)


def test_behind_compares_nodes_and_aicpu_only_when_auto_optimizer_kept_the_outputs(bench):
    def row(tool, nodes, aicpu, matches=True):
        return {"model": "m", "tool": tool, "nodes": nodes, "aicpu": aicpu, "matches": matches, "error": None,
                "seconds": 1.0, "applied": []}

    assert bench.behind([row("graphpass", 5, 0), row("auto_optimizer", 4, 0)])[0]["worse"] == ["nodes"]
    assert bench.behind([row("graphpass", 4, 2), row("auto_optimizer", 4, 1)])[0]["worse"] == ["aicpu"]
    assert bench.behind([row("graphpass", 5, 2), row("auto_optimizer", 4, 1, matches=False)]) == []
    assert json.dumps(bench.behind([row("graphpass", 3, 0), row("auto_optimizer", 4, 1)])) == "[]"
