"""Model zoos (issue 28): many models, each in its own worker with its own limits, results in
SQLite, resumable, summarized (graphpass.zoo, graphpass.cli_zoo)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphpass.zoo as zoo
from graphpass.cli import main
from graphpass.zoo.runner import Task, run_task

REPO = Path(__file__).resolve().parents[2]
EXPORTS = REPO / "tests" / "data" / "exporters"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _big(path: Path, n: int = 4_000_000) -> None:
    """A model of 16 MB: over a 12 MB --max-memory."""
    w = numpy_helper.from_array(np.zeros(n, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _hang(path: Path) -> None:
    """A Loop of 10**15 trips fed by an input: verifying it in onnxruntime runs for days."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")])
    g = helper.make_graph([helper.make_node("Loop", ["M", "c", "x"], ["y"], body=body)], "hang",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                          initializer=[numpy_helper.from_array(np.array(10**15, np.int64), "M"),
                                       numpy_helper.from_array(np.array(True), "c")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def zoo_dir(tmp_path):
    d = tmp_path / "models"
    (d / "exports").mkdir(parents=True)
    for name in ("vad_control_flow.torchscript.onnx", "style_transfer.torchscript.onnx"):
        shutil.copy(EXPORTS / name, d / "exports" / name)
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "light_squeezenet.onnx")
    (d / "corrupt.onnx").write_bytes(b"\x08\x07garbage, not a model")
    _hang(d / "hang.onnx")
    _big(d / "big.onnx")
    return d


def _rows(out: Path) -> dict[str, dict]:
    db = sqlite3.connect(out / zoo.DB_NAME)
    db.row_factory = sqlite3.Row
    rows = [dict(r) for r in db.execute("SELECT * FROM runs ORDER BY id")]
    db.close()
    return rows


def test_a_folder_with_bad_hanging_and_too_big_models_records_every_one(zoo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["optimize", str(zoo_dir), "-o", str(out), "--verify", "--timeout", "20", "--max-memory", "12M",
                 "--jobs", "2"])
    rows = {r["model"]: r for r in _rows(out)}
    assert set(rows) == {"exports/vad_control_flow.torchscript.onnx", "exports/style_transfer.torchscript.onnx",
                         "light_squeezenet.onnx", "corrupt.onnx", "hang.onnx", "big.onnx"}
    status = {m: r["status"] for m, r in rows.items()}
    assert status == {"exports/vad_control_flow.torchscript.onnx": "ok", "exports/style_transfer.torchscript.onnx": "ok",
                      "light_squeezenet.onnx": "ok", "corrupt.onnx": "bad-input", "hang.onnx": "timeout",
                      "big.onnx": "memory"}, {m: (r["status"], r["error"]) for m, r in rows.items()}
    assert code == 2  # the worst: a bad, hanging or too big model
    for m, r in rows.items():
        if r["status"] == "ok":
            assert r["verify"] and "verified" in r["verify"]
            assert Path(r["output"]).is_file() and Path(r["output"]) == out / "models" / m
            onnx.checker.check_model(r["output"], full_check=True)
            assert r["nodes_before"] >= r["nodes_after"] > 0 and r["peak_rss_mb"] > 10 and r["wall_s"] > 0
        else:
            assert not (out / "models" / m).exists() and r["error"]
    assert "over the memory limit" in rows["big.onnx"]["error"]
    assert rows["hang.onnx"]["wall_s"] < 60
    printed = capsys.readouterr().out
    assert "6 model(s): 3 ok" in printed and "1 timeout" in printed and "1 memory" in printed
    assert (out / "zoo-report.html").is_file() and (out / "zoo-report.md").is_file()


def test_a_rerun_skips_unchanged_models_and_reruns_changed_ones(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a.onnx")
    shutil.copy(EXPORTS / "vad_control_flow.torchscript.onnx", d / "b.onnx")
    out = tmp_path / "out"
    first = list(zoo.run([d], out, jobs=2))
    assert sorted(r["model"] for r in first) == ["a.onnx", "b.onnx"] and not any(r.get("skipped") for r in first)
    again = list(zoo.run([d], out, jobs=2))
    assert all(r.get("skipped") for r in again) and len(_rows(out)) == 2
    # a changed file and changed options are new work; --force reruns everything
    shutil.copy(EXPORTS / "style_transfer.torchscript.onnx", d / "b.onnx")
    changed = list(zoo.run([d], out, jobs=2))
    assert {r["model"]: bool(r.get("skipped")) for r in changed} == {"a.onnx": True, "b.onnx": False}
    other = list(zoo.run([d], out, options={"target": "ascend310p3"}))
    assert not any(r.get("skipped") for r in other) and all(r["target"] == "ascend310p3" for r in other)
    forced = list(zoo.run([d], out, force=True))
    assert not any(r.get("skipped") for r in forced) and len(_rows(out)) == 7


def test_a_batch_killed_halfway_finishes_only_the_rest(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    names = [f"m{k}.onnx" for k in range(5)]
    for n in names:
        shutil.copy(LIGHT / "light_squeezenet.onnx", d / n)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "graphpass", "optimize", str(d), "-o", str(out), "--jobs", "1", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / zoo.DB_NAME).is_file() and len(_rows(out)) >= 2:
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = {r["model"] for r in _rows(out)}
    assert 2 <= len(done) < len(names)
    rerun = list(zoo.run([d], out, jobs=2))
    ran = {r["model"] for r in rerun if not r.get("skipped")}
    assert ran == set(names) - done and {r["model"] for r in rerun if r.get("skipped")} == done
    rows = _rows(out)
    assert sorted(r["model"] for r in rows) == sorted(names) and all(r["status"] == "ok" for r in rows)


def test_evaluate_over_a_folder_and_the_report(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a.onnx")
    (d / "bad.onnx").write_bytes(b"nope")
    out = tmp_path / "ev"
    assert main(["evaluate", str(d), "-o", str(out), "--jobs", "2"]) == 2
    rows = {r["model"]: r for r in _rows(out)}
    assert rows["a.onnx"]["status"] == "ok" and rows["a.onnx"]["verb"] == "evaluate"
    assert rows["a.onnx"]["cost_before_us"] > 0 and rows["bad.onnx"]["status"] == "bad-input"
    assert not (out / "models").exists()  # evaluate writes no model
    capsys.readouterr()
    assert main(["zoo-report", str(out), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["models"] == 2 and s["status"] == {"ok": 1, "bad-input": 1}
    assert s["failures"][0]["models"] == ["bad.onnx"]

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.th, self.rows, self.script = 0, 0, False

        def handle_starttag(self, tag, attrs):
            self.th += tag == "th"
            self.rows += tag == "tr"
            self.script |= tag == "script"

    page = Cells()
    page.feed((out / "zoo-report.html").read_text())
    assert page.th == 12 and page.rows == 3 and page.script
    assert "src=" not in (out / "zoo-report.html").read_text()  # nothing loaded from elsewhere


def test_usage_errors_are_one_line_exit_2(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a.onnx")
    assert main(["optimize", str(d), "-o", str(tmp_path / "x"), "--report", str(tmp_path / "r.json")]) == 2
    assert "--report cannot be used with several models" in capsys.readouterr().err
    assert main(["optimize", str(d), "-o", str(tmp_path / "x.onnx")]) == 2
    assert main(["optimize", str(tmp_path / "nothing*.onnx"), "-o", str(tmp_path / "y")]) == 2
    assert main(["zoo-report", str(tmp_path / "empty")]) == 2
    assert main(["optimize", str(d), "-o", str(tmp_path / "z"), "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.startswith("graphpass: error")]) == 4


def test_the_memory_watchdog_kills_a_worker_over_its_limit(tmp_path):
    _big(tmp_path / "big.onnx", n=8_000_000)  # 32 MB of weights: the worker holds far more than 40 MB
    task = Task(model="big.onnx", path=tmp_path / "big.onnx", out_rel="big.onnx", verb="evaluate", options={},
                rss_limit=40 << 20, out_dir=tmp_path / "out")
    r = run_task(task)
    assert r["status"] == "memory" and "resident" in r["error"] and r["exit_code"] < 0


def test_ray_backend(tmp_path):
    pytest.importorskip("ray", reason="the ray backend needs the optional 'ray' extra")
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a.onnx")
    (d / "bad.onnx").write_bytes(b"nope")
    local = {r["model"]: r for r in zoo.run([d], tmp_path / "local", jobs=2)}
    ray_rows = {r["model"]: r for r in zoo.run([d], tmp_path / "ray", jobs=2, backend="ray")}
    keep = ("status", "exit_code", "nodes_before", "nodes_after", "cost_before_us", "cost_after_us", "input_hash")
    assert {m: {k: r[k] for k in keep} for m, r in local.items()} == \
        {m: {k: r[k] for k in keep} for m, r in ray_rows.items()}
    assert all(r["backend"] == "ray" for r in ray_rows.values())


def test_the_ray_backend_without_ray_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a.onnx")
    assert main(["optimize", str(d), "-o", str(tmp_path / "o"), "--backend", "ray"]) == 2
    assert "pip install 'graphpass[ray]'" in capsys.readouterr().err


def test_outputs_inside_the_input_folder_are_not_inputs_and_same_names_stay_apart(tmp_path):
    d = tmp_path / "m"
    (d / "a").mkdir(parents=True)
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "x.onnx")
    shutil.copy(LIGHT / "light_squeezenet.onnx", d / "a" / "x.onnx")
    out = d / "results"
    first = list(zoo.run([d], out))
    second = list(zoo.run([d, d / "a" / "x.onnx", str(tmp_path / "m" / "*.onnx")], out))
    assert sorted(r["model"] for r in first) == ["a/x.onnx", "x.onnx"]
    assert sorted(r["model"] for r in second) == ["a/x.onnx", "x.onnx"] and all(r.get("skipped") for r in second)
    from graphpass.zoo.runner import expand_models
    other = tmp_path / "o"
    other.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", other / "x.onnx")
    assert [n for n, _ in expand_models([d / "x.onnx", other / "x.onnx"])] == ["x.onnx", "x~2.onnx"]


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no chromium (.ci/run installs Debian's chromium)")
def test_the_report_page_sorts_in_a_headless_browser(tmp_path):
    """The zoo report's HTML in a real browser: its script ran (every row counted) and a column
    header sorts the rows (#sort=N clicks header N on load; column 9 is the wall time)."""
    import re

    d = tmp_path / "m"
    d.mkdir()
    for name in ("light_squeezenet.onnx", "light_shufflenet.onnx", "light_inception_v1.onnx"):
        shutil.copy(LIGHT / name, d / name)
    (d / "bad.onnx").write_bytes(b"nope")
    out = tmp_path / "out"
    rows = list(zoo.run([d], out, verb="evaluate", jobs=2))
    zoo.write_reports(out)
    page = out / "zoo-report.html"
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--virtual-time-budget=3000"]
    for col, key in ((9, "wall_s"), (0, "model")):
        dom = subprocess.run(args + ["--dump-dom", page.as_uri() + f"#sort={col}"], capture_output=True, text=True,
                             timeout=120).stdout
        assert re.search(r'data-rows="4"', dom), dom[:300]
        shown = re.findall(r'<tr class="[^"]*"><td[^>]*>([^<]*)</td>', dom)
        expect = [r["model"] for r in sorted(rows, key=lambda r: r[key])]
        assert shown == expect, (shown, expect)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_batch_leaves_no_worker_running(tmp_path, sig, code):
    d = tmp_path / "m"
    d.mkdir()
    _hang(d / "hang.onnx")
    out = tmp_path / f"out-{sig.name}"
    p = subprocess.Popen([sys.executable, "-m", "graphpass", "optimize", str(d), "-o", str(out), "--verify"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def workers():
        return subprocess.run(["pgrep", "-f", str(out / "models")], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 60
    while not workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers(), "the worker never started"
    time.sleep(1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    time.sleep(0.5)
    assert not workers()


def test_workers_run_the_installed_graphpass_not_a_folder_named_graphpass_where_the_batch_starts(tmp_path, monkeypatch):
    """Run from a folder holding a 'graphpass' folder (a source checkout): ``python -m graphpass``
    there imported that folder, not the installed package (a plain ``pip install .`` then failed
    every model)."""
    (tmp_path / "graphpass").mkdir()
    (tmp_path / "graphpass" / "__init__.py").write_text("raise ImportError('the wrong graphpass')\n")
    (tmp_path / "graphpass" / "__main__.py").write_text("raise SystemExit(1)\n")
    shutil.copy(LIGHT / "light_squeezenet.onnx", tmp_path / "a.onnx")
    monkeypatch.chdir(tmp_path)
    rows = list(zoo.run(["a.onnx"], "out", jobs=1, force=True))
    assert rows[0]["status"] == "ok", rows[0]["error"]
