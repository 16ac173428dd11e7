import csv
import io
import json

import pytest

from graphpass.cli import main


def test_cost_table_names_the_estimate_and_the_breakdown(light_path, capsys):
    assert main(["cost", light_path("light_resnet50.onnx"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "cost-model estimate, not a measurement" in out
    assert "per engine" in out and "per op type" in out and "Conv" in out


def test_cost_json_and_csv(light_path, capsys, tmp_path):
    assert main(["cost", light_path("light_squeezenet.onnx"), "--format", "json", "--target", "ascend910b2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "graphpass.cost_report/1" and d["target"] == "ascend910b2"
    assert d["precision_mode"] == "force_fp16"  # ATC's default on every product, Atlas A2 included (issue 21)
    out = tmp_path / "c.csv"
    assert main(["cost", light_path("light_squeezenet.onnx"), "--format", "csv", "-o", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert rows and {"name", "op", "engine", "us", "bound"} <= set(rows[0])


def test_cost_iterations_per_loop_lowers_the_step_term(light_path, capsys):
    totals = []
    for n in ("1", "1000"):
        assert main(["cost", light_path("light_squeezenet.onnx"), "--format", "json", "--iterations-per-loop", n]) == 0
        totals.append(json.loads(capsys.readouterr().out)["total_us"])
    assert totals[1] < totals[0]


@pytest.mark.parametrize("args, needle", [
    (["--target", "ascend999"], "known targets: ascend910a"),
    (["--input-shape", "nope:1,2"], "not a graph input"),
])
def test_cost_bad_input_exits_2(light_path, capsys, args, needle):
    assert main(["cost", light_path("light_squeezenet.onnx"), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_cost_bad_precision_mode_is_a_usage_error(light_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["cost", light_path("light_squeezenet.onnx"), "--precision-mode", "fp8"])
    assert e.value.code == 2


def test_cost_table_lists_each_crossing(tmp_path, capsys):
    import numpy as np
    from onnx import helper

    from graphpass.testing import make_model

    m = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Resize", ["a", "", "s"], ["b"], mode="cubic"),
                    helper.make_node("Relu", ["b"], ["y"])], {"x": [1, 4, 8, 8]}, {"y": [1, 4, 16, 16]},
                   initializers={"s": np.array([1, 1, 2, 2], np.float32)})
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    assert main(["cost", str(src)]) == 0
    out = capsys.readouterr().out
    assert "a: AICORE -> AICPU" in out and "b: AICPU -> AICORE" in out


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_cost_under_target_none_says_there_is_nothing_to_estimate(light_path, capsys, fmt):
    # `graphpass cost --target none` crashed with exit 3 (the table formatted total_us=None); then
    # printed an empty estimate with exit 0. Issue 23 decided: nothing to estimate is a usage error
    assert main(["cost", light_path("light_squeezenet.onnx"), "--target", "none", "--format", fmt]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "nothing to estimate" in err[0] and "--target" in err[0]


# --- hostile review (attack2): the estimate under a symbolic batch -----------------------------

SHUFFLENET_TS = "tests/data/exporters/shufflenet_v2.torchscript.onnx"


def _total(capsys, *args):
    import os

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert main(["cost", os.path.join(here, SHUFFLENET_TS), "--target", "ascend310p3", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_cost_under_an_assumed_batch_of_1_is_the_cost_at_batch_1(capsys):
    assumed = _total(capsys)
    assert assumed["assumed_dims"].get("batch") == 1
    fixed = _total(capsys, "--dim", "batch=1")
    assert assumed["total_us"] == pytest.approx(fixed["total_us"], rel=0.01)


def test_cost_with_every_input_fixed_assumes_no_dim(capsys):
    assert _total(capsys, "--dim", "batch=1")["assumed_dims"] == {}
