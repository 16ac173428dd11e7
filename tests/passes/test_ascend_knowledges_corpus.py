"""Issue 25's conv/pool knowledges on real exports (tests/data/exporters/, benchmarks/export_corpus.py)."""

import onnx
import pytest

import graphpass as gp
from graphpass.check import verify as V
from graphpass.passes.framework import all_passes

DATA = "tests/data/exporters/"


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_style_transfer_reflection_pads_leave_ai_cpu(exporter, tmp_path):
    path = DATA + f"style_transfer.{exporter}.onnx"
    target = gp.Target.load("ascend910a")
    before = target.estimate(path)
    aicpu_before = [n for n in before.nodes if n["engine"] == "AICPU"]
    assert sum("reflect" in n["note"] for n in aicpu_before) == 8  # its 2 nearest Resizes run on AI Core (op_info.toml)
    result = gp.optimize(path)
    assert "Pad" not in result.report.ops_after
    fired = sum(r.stats.get("fired", 0) for r in result.report.passes if r.name == "lower_reflect_pad" and r.modified)
    assert fired == 8
    after = target.estimate(result.model)
    assert len([n for n in after.nodes if n["engine"] == "AICPU"]) == len(aicpu_before) - 8
    assert after.total_us < before.total_us
    out = tmp_path / "out.onnx"
    gp.save(result.model, out)
    onnx.checker.check_model(str(out), full_check=True)
    applied = [r.name for r in result.report.passes if r.application]
    import numpy as np

    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    checked = V.check_outputs(path, str(out), {"x": x}, promises=V.promises_of(applied, all_passes()))
    assert checked.ok, checked.describe()
