"""Issue 23: what a person sees by default is short. ``optimize`` prints at most 20 lines on every
model of the corpus (tests/data/exporters and examples/models); ``cost``, ``diff`` and
``precision`` at most 40. -v and the report files keep every detail."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from graphpass.cli import REPORT_LINES, SUMMARY_LINES, main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "exporters"))
from _corpus import exported, feeds_for  # noqa: E402

CORPUS = sorted((ROOT / "tests" / "data" / "exporters").glob("*.onnx")) + sorted((ROOT / "examples" / "models").glob("*.onnx"))
IDS = [p.name for p in CORPUS]


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_the_corpus_is_there():
    assert len(CORPUS) >= 20  # 21 exporter files and the shipped example


@pytest.mark.parametrize("model", CORPUS, ids=IDS)
def test_optimize_prints_at_most_20_lines_and_cost_diff_precision_at_most_40(model, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(model), "-o", str(out), "--report", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    assert len(_lines(text)) <= SUMMARY_LINES == 20, text
    assert text.splitlines()[0].startswith("graphpass optimize ") and text.rstrip().endswith(f"wrote {out}")
    report = json.loads((tmp_path / "r.json").read_text())
    if report["estimated_cost_us"]["before"] is not None:
        assert "estimated cost (cost model, not measured)" in text
    changed = {r["name"] for r in report["passes"] if r["modified"] and not r["rolled_back"]}
    for name in changed:  # every pass that changed something is named, or counted
        assert f"  {name} " in text or "more passes (-v lists them)" in text
    entry = next((e for e in exported() if e["file"] == model.name), None)
    precision = ["precision", str(model)]
    if entry is not None:  # token ids within the vocabulary
        np.savez(tmp_path / "in.npz", **feeds_for(entry))
        precision += ["--inputs", str(tmp_path / "in.npz")]
    for verb in (["cost", str(model)], ["diff", str(model), str(out)], precision):
        assert main(verb) == 0
        text = capsys.readouterr().out
        assert 0 < len(_lines(text)) <= REPORT_LINES == 40, (verb[0], text)


def test_verbose_keeps_the_per_pass_table_and_vv_every_warning(tmp_path, capsys):
    model = ROOT / "tests" / "data" / "exporters" / "vit.dynamo.onnx"
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(model), "-o", str(out)]) == 0
    short = capsys.readouterr().out
    assert "op histogram" not in short.replace("per-pass table and op histogram", "")
    warning = [x for x in short.splitlines() if "kept in the origin format" in x]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "tensors kept" in warning[0]
    count = int(warning[0].split()[1])
    assert main(["optimize", str(model), "-o", str(out), "-v"]) == 0
    v = capsys.readouterr().out
    assert "op histogram" in v and "┃ stats" in v
    assert main(["optimize", str(model), "-o", str(out), "-vv"]) == 0
    vv = capsys.readouterr().out
    assert sum("kept in origin format" in x for x in vv.splitlines()) == count > 1


def test_long_stats_never_go_into_table_cells(tmp_path, capsys):
    model = ROOT / "tests" / "data" / "exporters" / "vit.dynamo.onnx"
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "-v", "--report", str(tmp_path / "r.md")]) == 0
    text = capsys.readouterr().out
    rows = [x for x in text.splitlines() if x.startswith("│")]
    assert rows and not any("symbolic shape" in x for x in rows)  # the warnings are lines of their own
    md = (tmp_path / "r.md").read_text()
    table = [x for x in md.splitlines() if x.startswith("| ") and "`" in x]
    assert table and not any("symbolic shape" in x for x in table)
    assert "kept in origin format: tensor 'pixel_values'" in md  # ... but the report file keeps them


def test_the_summary_keeps_its_budget_with_many_passes_warnings_and_notes():
    import collections

    from graphpass.passes.framework.manager import PassRecord
    from graphpass.report import OptimizeReport

    records = [PassRecord(index=k, name=f"pass_{k:02d}", round=1 + k % 3, seconds=0.001, nodes_before=100, nodes_after=99,
                          modified=True, stats={"fired": 1, "sites": list(range(50)), "why": "x" * 300})
               for k in range(40)]
    layout = {"before": {"count": 3, "us": 1.0}, "after": {"count": 3, "us": 1.0}, "mode": "optimal",
              "origin_format": [f"tensor 't{k}' of kind {k % 12} has a symbolic shape ['b', {k}]" for k in range(200)]
              + [f"reason number {k}: {'word ' * k}" for k in range(15)],
              "transdata": [{"node": f"n{k}", "tensor": f"t{k}", "src": "NCHW", "dst": "NC1HWC0", "reason": f"why {k % 7}"}
                            for k in range(30)]}
    report = OptimizeReport(model="m.onnx", target="ascend910a", passes=records, skipped=[f"p{k}" for k in range(30)],
                            nodes_before=100, nodes_after=60, ops_before=collections.Counter(Relu=100),
                            ops_after=collections.Counter(Relu=60), seconds=1.0, cost_before_us=10.0, cost_after_us=5.0,
                            layout=layout, notes=[f"p{k} skipped: needs a hardware target" for k in range(9)]
                            + [f"note {k} about '{k}'" for k in range(25)])
    text = report.to_summary(max_lines=SUMMARY_LINES - 1)
    lines = text.splitlines()
    assert len(lines) <= SUMMARY_LINES - 1, text
    assert lines[0].startswith("graphpass optimize m.onnx") and "estimated cost" in lines[1]
    assert any("more passes (-v lists them)" in x for x in lines) and any("more warnings and notes" in x for x in lines)
    assert all(len(x) <= 160 for x in lines)
    assert not any("xxxxx" in x or "[0, 1, 2" in x for x in lines)  # long stats never shown whole
    wide = report.to_table(verbose=1)
    assert "xxxxx" not in wide and "sites=50" in wide  # in a cell: counted, never listed


def test_brief_text_counts_runs_of_one_kind_keeps_table_rows_and_cuts_to_the_budget():
    from graphpass.reporting import brief_text, message_kind

    assert message_kind("symbolic dim 'unk__7' taken as 1 (fix the inputs)") == message_kind("symbolic dim 'b' taken as 12")
    assert message_kind("tensor 'a' is big") != message_kind("tensor 'a' is small")
    text = "\n".join(["head"] + [f"assumption: symbolic dim 'd{k}' taken as 1" for k in range(30)]
                     + ["┏━━━┓", "│ row_1 │", "│ row_2 │", "│ row_3 │", "└───┘", "x" * 500])
    out = brief_text(text, 40, width=100).splitlines()
    assert out[:3] == ["head", "assumption: symbolic dim 'd0' taken as 1", "... and 29 more like it (-v shows everything)"]
    assert out[3:8] == ["┏━━━┓", "│ row_1 │", "│ row_2 │", "│ row_3 │", "└───┘"]  # a table is never folded
    assert out[8] == "x" * 99 + "…"
    many = "\n".join(f"line {k} of kind {'abcdefghij'[k % 10]}" for k in range(100))
    cut = brief_text(many, 40).splitlines()
    assert len(cut) == 40 and cut[-1] == "... 61 more lines (-v shows everything)"


def test_a_logged_warning_shows_once_per_kind_with_a_count(monkeypatch, capsys):
    import io
    import logging

    from graphpass import cli

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    monkeypatch.setattr(cli.sys, "stderr", stream)
    handler.stream = stream
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        cli._setup_logging(0, False)
        log = logging.getLogger("graphpass.passes.cleanup.fold_constants")
        for k in range(30):
            log.warning("fold_constants: cannot evaluate %s '%s': %s", "Add", f"n{k}", "boom")
        log.warning("another kind of warning")
        for line in cli._WARNINGS.summary():
            print(line, file=stream)
        lines = stream.getvalue().splitlines()
        assert lines == ["fold_constants: cannot evaluate Add 'n0': boom", "another kind of warning",
                         "graphpass: WARNING: 29 more like 'fold_constants: cannot evaluate Add 'n0': boom' (-v shows each)"]
        stream.truncate(0), stream.seek(0)
        cli._setup_logging(1, False)  # -v: every one
        for k in range(3):
            log.warning("fold_constants: cannot evaluate %s '%s': %s", "Add", f"n{k}", "boom")
        assert len(stream.getvalue().splitlines()) == 3 and cli._WARNINGS.summary() == []
    finally:
        root.removeHandler(handler)
        cli._WARNINGS.reset(enabled=True)
