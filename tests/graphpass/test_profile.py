"""optimize --profile: the phases of a run with wall time and peak RSS, on stderr at the end."""

import collections
import json
import os
import re
import time

import numpy as np
import onnx
import pytest
from onnx import helper

from graphpass.cli import main
from graphpass.ir import profiling
from graphpass.testing import make_model

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "shufflenet_v2_x0_5.onnx")
_ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<calls>\d+)\s+(?P<total>[\d.]+)\s+(?P<self>[\d.]+)\s+(?P<peak>\d+)\s+(?P<raised>[+-]\d+)$")


def _rows(err: str) -> dict[str, dict]:
    """The table's phase rows by name (calls, total, self, peak MB, raised MB), plus other and total."""
    lines = err.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("graphpass profile"))
    rows = {}
    for ln in lines[start + 1:]:
        m = _ROW.match(ln)
        if m:
            rows[m["name"]] = {"calls": int(m["calls"]), "total": float(m["total"]), "self": float(m["self"]),
                               "peak": int(m["peak"]), "raised": int(m["raised"])}
        elif ln.startswith("other (outside the phases)"):
            rows["other"] = {"self": float(ln.split()[-1])}
        elif ln.startswith("total "):
            total, peak = ln.split()[1:]
            rows["total"] = {"total": float(total), "peak": int(peak)}
    return rows


def test_profile_prints_every_phase_to_stderr_with_pass_counts(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx"), "--verify", "--profile", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "graphpass profile" in err and "graphpass profile" not in out and "wrote" in out  # the report stays on stdout
    rows = _rows(err)
    for name in ("load", "read and validate", "import", "shape inference", "pipeline", "cost estimate", "export",
                 "report", "save", "check written", "verify", "other", "total"):
        assert name in rows, (name, err)
    # one row per pass name, its calls the applications the report lists
    applications = collections.Counter(p["name"] for p in json.loads(report.read_text())["passes"])
    assert applications
    for name, count in applications.items():
        assert rows[f"pass {name}"]["calls"] == count, name
    assert {k[5:] for k in rows if k.startswith("pass ")} == set(applications)
    assert rows["load"]["calls"] == rows["pipeline"]["calls"] == rows["save"]["calls"] == 1
    # self times and 'other' add up to the wall time (each printed rounded to 1 ms)
    selfs = sum(r["self"] for k, r in rows.items() if k != "total")
    assert abs(selfs - rows["total"]["total"]) <= 0.001 * len(rows) + 0.002
    # a phase contains what nests in it: the pipeline (run once) holds every pass application
    assert rows["pipeline"]["total"] >= sum(r["total"] for k, r in rows.items() if k.startswith("pass ")) - 0.002
    # memory: a high-water mark only rises, and the run's is the largest
    peaks = [r["peak"] for k, r in rows.items() if "peak" in r and k != "total"]
    assert 0 < min(peaks) and max(peaks) <= rows["total"]["peak"]
    assert rows["total"]["peak"] >= rows["load"]["peak"] >= rows["load"]["raised"] >= 0


def test_no_profile_without_the_flag_and_none_left_active(tmp_path, capsys):
    assert main(["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    assert "graphpass profile" not in capsys.readouterr().err
    assert profiling.active() is None
    assert main(["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx"), "-q", "--profile"]) == 0
    err = capsys.readouterr().err
    assert "graphpass profile" in err and "pass fold_constants" in err  # -q silences the report, not the profile
    assert profiling.active() is None


def test_profile_on_bad_input_is_exit_2_with_the_error_line_last(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    code = main(["optimize", str(bad), "-o", str(tmp_path / "o.onnx"), "--profile"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("graphpass: error:")
    assert "read and validate" in _rows(err)  # the profile of what ran before the failure
    assert profiling.active() is None and not (tmp_path / "o.onnx").exists()


def test_profile_of_a_graph_where_nothing_fires(tmp_path, capsys):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--profile", "--target", "none"]) == 0
    rows = _rows(capsys.readouterr().err)
    assert "cost estimate" not in rows  # the none target estimates nothing
    assert rows["pass eliminate_dead_nodes"]["calls"] >= 1
    assert "pass eliminate_identity" not in rows  # no Identity: the manager does not run it


def test_profile_rows_nesting_and_self_time():
    p = profiling.start()
    try:
        with profiling.phase("outer"):
            time.sleep(0.02)
            with profiling.phase("inner"):
                time.sleep(0.02)
                with profiling.phase("outer"):  # nested in one of its own name: counted once in total
                    time.sleep(0.01)
        profiling.enter("left open")
        with profiling.phase("after"):
            pass
        profiling.leave("left open")
        profiling.enter("never closed")
    finally:
        assert profiling.stop() is p
    assert profiling.active() is None
    outer, inner = p.rows["outer"], p.rows["inner"]
    assert outer.calls == 2 and inner.calls == 1
    assert outer.seconds == pytest.approx(0.05, abs=0.03)  # not 0.06: the nested one counts once
    assert inner.seconds >= 0.03 and inner.self_seconds == pytest.approx(inner.seconds - 0.01, abs=0.01)
    assert outer.self_seconds == pytest.approx(outer.seconds - inner.self_seconds, abs=0.01)
    assert p.rows["never closed"].calls == 1  # closed when the profile stopped
    assert p.rows["after"].calls == 1 and p.rows["left open"].self_seconds >= 0
    assert sum(r.self_seconds for r in p.rows.values()) <= p.seconds
    assert p.peak_rss >= max(r.peak_rss for r in p.rows.values()) > 0
    d = p.to_dict()
    assert [r["name"] for r in d["phases"]] == ["outer", "inner", "left open", "after", "never closed"]


def test_phases_record_nothing_when_no_profile_is_active():
    assert profiling.active() is None
    with profiling.phase("x"):
        profiling.enter("y")
        profiling.leave("y")

    @profiling.timed("z")
    def f(a):
        return a * 2

    assert f(np.int64(3)) == 6
    p = profiling.start()
    assert f(2) == 4
    profiling.stop()
    assert list(p.rows) == ["z"] and p.rows["z"].calls == 1


def test_profile_on_a_failed_verification_is_exit_1_with_verify_profiled(tmp_path, monkeypatch, capsys):
    from graphpass.ir import model_io

    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [3]}, {"y": [3]},
                       initializers={"w": np.ones(3, np.float32)})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    real = model_io.save

    def wrong_save(graph, path, *a, **k):  # writes a model whose weight differs
        out = real(graph, path, *a, **k)
        m = onnx.load(out)
        m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.full(3, 9, np.float32), m.graph.initializer[0].name))
        out.write_bytes(m.SerializeToString())
        return out

    monkeypatch.setattr(model_io, "save", wrong_save)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "--profile", "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("graphpass: error:")
    rows = _rows(err)
    assert rows["verify"]["calls"] == 1 and rows["save"]["calls"] == 1
    assert rows["report"]["calls"] == 1  # the optimize report; the CLI never reached its own
    assert profiling.active() is None
