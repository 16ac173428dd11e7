import json
import os

import numpy as np
import onnx
from onnx import helper

from graphpass.cli import main, parse_input_shapes
from graphpass.testing import make_model

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "shufflenet_v2_x0_5.onnx")


def test_optimize_the_shipped_example_prints_report_and_writes_reports(tmp_path, capsys):
    out = tmp_path / "s.onnx"
    code = main(["optimize", EXAMPLE, "-o", str(out), "--input-shape", "input:1,3,224,224",
                 "--report", str(tmp_path / "r.json"), "--verify"])
    text = capsys.readouterr().out
    assert code == 0
    assert "fold_constants" in text and "op histogram" in text and "verified with onnxruntime" in text
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "graphpass.optimize_report/1"
    assert report["nodes"]["after"] < report["nodes"]["before"]
    assert report["ops"]["Shape"]["after"] == 0  # every dynamic shape chain folded away
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert main(["optimize", EXAMPLE, "-o", str(out), "-q", "--report", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("### graphpass optimize")


def test_passes_lists_every_pass(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name in ("fold_constants", "eliminate_dead_nodes", "specialize_shapes", "merge_transposes"):
        assert name in out


def test_inspect_shows_dynamic_dims_and_ops(capsys):
    assert main(["inspect", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "dynamic dims: input[0]=N" in out and "Conv" in out and "opsets: ai.onnx=13" in out


def test_verify_passes_same_model_and_fails_perturbed_one(tmp_path, capsys):
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [3]}, {"y": [3]},
                       initializers={"w": np.ones(3, np.float32)})
    a = tmp_path / "a.onnx"
    a.write_bytes(model.SerializeToString())
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.array([1, 1, 1.5], np.float32), "w"))
    b = tmp_path / "b.onnx"
    b.write_bytes(model.SerializeToString())
    assert main(["verify", str(a), str(a)]) == 0
    assert main(["verify", str(a), str(b)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_disable_and_passes_options(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", EXAMPLE, "-o", str(out), "--passes", "eliminate_identity", "-v"]) == 0
    text = capsys.readouterr().out
    assert "eliminate_identity" in text and "fold_constants" not in text
    assert main(["optimize", EXAMPLE, "-o", str(out), "--disable", "fold_constants,eliminate_identity"]) == 0
    assert "disabled: fold_constants, eliminate_identity" in capsys.readouterr().out


def test_parse_input_shapes():
    assert parse_input_shapes(["x:1,3,224,224", "ns:scope/y:4"]) == {"x": [1, 3, 224, 224], "ns:scope/y": [4]}


def test_passes_lists_each_pass_promise(capsys):
    import re

    from graphpass.infra.registry import all_passes

    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name, cls in all_passes().items():
        row = next(line for line in out.splitlines() if re.search(rf"\b{name}\b", line))
        assert str(cls.promise).split(" (")[0] in row, (name, row)
