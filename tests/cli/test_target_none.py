"""Issue 23: ``--target none`` works for every verb that takes a target; where there is nothing
to do without hardware facts (cost, calibrate) it says so in one line, exit 2 (never 3)."""

from pathlib import Path

import onnx
import pytest

from graphpass.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "models" / "shufflenet_v2_x0_5.onnx")


def _verbs_with_a_target() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    return {verb for verb, p in sub.choices.items() if any("--target" in a.option_strings for a in p._actions)}


def test_every_verb_with_a_target_is_covered_here():
    assert _verbs_with_a_target() <= {"optimize", "diff", "bisect", "cost", "calibrate", "pr-comment",
                                      "atc", "atc-check", "evaluate"}


def test_evaluate_runs_without_a_target(capsys):
    assert main(["evaluate", EXAMPLE, "--target", "none", "--format", "json"]) == 0
    (r,) = __import__("json").loads(capsys.readouterr().out)
    assert r["status"] == "ok" and r["target"] == "none" and r["cost_before_us"] is None and r["gain_pct"] is None


def test_optimize_diff_and_bisect_run_without_a_target(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", EXAMPLE, "-o", str(out), "--target", "none"]) == 0
    text = capsys.readouterr().out
    assert "target=none" in text and "estimated cost" not in text and "no cost model" in text
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert main(["diff", EXAMPLE, str(out), "--target", "none"]) == 0
    text = capsys.readouterr().out
    assert "nodes 374 -> " in text and "estimated" not in text
    assert main(["bisect", EXAMPLE, "--target", "none", "--out-dir", str(tmp_path / "b")]) == 0
    assert "no failing application" in capsys.readouterr().out


@pytest.mark.parametrize("argv,says", [
    (["cost", EXAMPLE, "--target", "none"], "nothing to estimate"),
    (["calibrate", EXAMPLE, "x.csv", "--target", "none", "-o", "c.toml"], "needs a hardware target"),
    (["atc", EXAMPLE, "--target", "none", "-o", "kit", "--shape-profile", "N=1"], "needs a hardware target"),
    (["atc-check", EXAMPLE, "--target", "none", "--fusion-result", "f.json"], "needs a hardware target"),
    (["optimize", EXAMPLE, "-o", "o.onnx", "--target", "none", "--atc", "kit"], "needs a hardware target"),
])
def test_cost_and_calibrate_without_a_target_say_so_exit_2(argv, says, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and says in err[0]
