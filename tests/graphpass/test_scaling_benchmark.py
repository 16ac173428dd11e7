"""benchmarks/scaling.py at its smallest size: graphpass (and the floor, onnx load+save) on 1k nodes,
one process each; the peers when they are installed."""

import importlib.util
import json
import sys
from pathlib import Path

import onnx
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def scaling():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("scaling_bench", BENCH / "scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(BENCH))


@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_synthetic_models_are_valid_and_of_the_size_asked(scaling, family, tmp_path):
    path, nodes = scaling.write_model(family, 1000, tmp_path)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert 950 <= nodes <= 1000 and nodes == len(model.graph.node)
    (tmp_path / "b").mkdir()
    again, _ = scaling.write_model(family, 1000, tmp_path / "b")
    assert again.read_bytes() == path.read_bytes()  # seeded


def test_graphpass_and_the_floor_at_1k_with_json_and_render(scaling, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert scaling.main(["--sizes", "1000", "--families", "cnn", "--tools", "graphpass", "onnx", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    gp, floor = rows
    assert gp["tool"] == "graphpass" and floor["tool"] == "onnx"
    for r in rows:
        assert r["error"] is None, r
        assert r["seconds"] > 0 and 20 * 2**20 < r["peak_rss"] < 4 * 2**30
    assert floor["nodes_left"] == floor["nodes"] == gp["nodes"]
    assert 0 < gp["nodes_left"] < gp["nodes"]  # the default pipeline removes the bait and folds the BatchNorms
    assert floor["time_ratio"] == pytest.approx(gp["seconds"] / floor["seconds"], rel=0.02)
    assert floor["rss_ratio"] == pytest.approx(gp["peak_rss"] / floor["peak_rss"], rel=0.02)
    phases = {p["phase"] for p in gp["profile"]}
    assert {"load", "pipeline", "save", "pass fold_batchnorm"} <= phases
    assert 0 < gp["bytes_per_node"] < gp["peak_rss"] / gp["nodes"]
    capsys.readouterr()
    assert scaling.main(["--render", str(out)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| model | nodes | tool |") and "| cnn | 990 | graphpass |" in md
    assert "KiB per node above" in md and "most time in" in md


def test_a_tool_out_of_time_is_killed_and_said(scaling, tmp_path):
    r = scaling.run_child([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, timeout=0.5)
    assert r["timed_out"] and r["seconds"] < 10 and r["returncode"] != 0


def test_the_childs_own_peak_rss(scaling, tmp_path):
    small = scaling.run_child([sys.executable, "-c", "pass"], tmp_path, timeout=60)
    big = scaling.run_child([sys.executable, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                            tmp_path, timeout=60)
    assert small["returncode"] == big["returncode"] == 0
    assert big["peak_rss"] - small["peak_rss"] > 250 * 2**20
    again = scaling.run_child([sys.executable, "-c", "pass"], tmp_path, timeout=60)
    assert again["peak_rss"] < small["peak_rss"] + 50 * 2**20  # not the largest child so far


def test_peers_at_1k_when_installed(scaling, tmp_path):
    pytest.importorskip("onnxsim")
    pytest.importorskip("onnxslim")
    rows = scaling.measure("transformer", 1000, ["graphpass", "onnxsim", "onnxslim", "ort-extended"], tmp_path, 300)
    for r in rows:
        assert r["error"] is None, r
        assert r["nodes_left"] <= r["nodes"] + 200 and r["time_ratio"] > 0
    assert not any(tmp_path.glob("*/*.onnx"))  # outputs removed after each tool


def test_render_of_a_missing_file_is_one_line_exit_2(scaling, tmp_path, capsys):
    assert scaling.main(["--render", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.json" in err


def test_a_model_past_the_limit_is_written_with_external_data(scaling, tmp_path, monkeypatch):
    monkeypatch.setattr(scaling, "EXTERNAL_ABOVE", 0)  # as a model past 2 GB is
    path, nodes = scaling.write_model("transformer", 100, tmp_path)
    assert (tmp_path / (path.name + ".data")).stat().st_size > 0
    assert any(t.data_location == 1 for t in onnx.load(path, load_external_data=False).graph.initializer)
    rows = scaling.measure("transformer", 100, ["graphpass", "onnx"], tmp_path, 300)
    assert [r["error"] for r in rows] == [None, None] and rows[0]["nodes_left"] < nodes
    assert not (tmp_path / (path.name + ".data")).exists()  # removed with the model
