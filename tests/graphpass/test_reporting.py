"""Every report has the same interface (graphpass.reporting.Report): a schema id, to_dict, to_json,
to_markdown, to_table; the JSON is standard (no Infinity) and carries the schema id."""

import json
import math

import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass.check import precision as P
from graphpass.check import verify as V
from graphpass.reporting import FORMATS, Report, ReportLike, finite, markdown_table, to_json
from graphpass.testing import make_model


def _model(scale: float = 2.0):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "s"], ["y"], name="mul")]
    return make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, {"s": np.array(scale, np.float32)})


def _reports(tmp_path):
    from graphpass.bisect import bisect
    from graphpass.cost_model import create
    from graphpass.diff import diff_models

    a, b = _model(2.0), _model(1e6)
    result = gp.optimize(a, target="none")
    yield "optimize", result.report
    yield "cost", create("ascend910a").estimate(gp.load(a))
    yield "diff", diff_models(a, b)
    yield "verify", V.verify_models(a, b)
    yield "precision", P.analyze(b, check=False)
    yield "bisect", bisect(a, tmp_path / "bisect", target="none")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return dict(_reports(tmp_path_factory.mktemp("reports")))


KINDS = ["optimize", "cost", "diff", "verify", "precision", "bisect"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_report_has_the_one_interface(reports, kind):
    r = reports[kind]
    assert isinstance(r, Report) and isinstance(r, ReportLike)
    assert r.SCHEMA.startswith("graphpass.") and "/" in r.SCHEMA
    d = r.to_dict()
    assert d["schema"] == type(r).SCHEMA
    parsed = json.loads(r.to_json(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert parsed == json.loads(json.dumps(finite(d), default=str))
    md, table = r.to_markdown(), r.to_table()
    assert md.startswith("### graphpass ") and md.endswith("\n")
    assert table.strip() and "###" not in table
    for fmt in FORMATS:
        assert r.render(fmt) == getattr(r, f"to_{fmt}")()


def test_existing_schema_ids_are_kept(reports):
    assert {k: type(r).SCHEMA for k, r in reports.items()} == {
        "optimize": "graphpass.optimize_report/1", "cost": "graphpass.cost_report/1", "diff": "graphpass.diff/1",
        "verify": "graphpass.verify_report/2", "precision": "graphpass.precision_report/2",
        "bisect": "graphpass.bisect/1"}
    from graphpass.cost_model import SCHEMA as COST
    from graphpass.diff import SCHEMA as DIFF

    assert (COST, DIFF) == ("graphpass.cost_report/1", "graphpass.diff/1")


def test_an_unknown_format_is_a_usage_error(reports):
    with pytest.raises(gp.UsageError, match="one of json, markdown, table"):
        reports["verify"].render("yaml")


def test_json_is_standard_even_for_infinite_differences():
    a, b = _model(2.0), _model(2.0)
    b.graph.initializer[0].CopyFrom(__import__("onnx").numpy_helper.from_array(np.array(np.inf, np.float32), "s"))
    report = V.verify_models(a, b, feeds={"x": np.ones((2, 3), np.float32)})
    assert not report.ok
    text = report.to_json()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["outputs"][0]["max_abs"] in ("inf", 0.0)  # inf positions differ: no finite diff


def test_to_json_writes_numpy_scalars_as_numbers_and_unicode_as_is():
    assert json.loads(to_json({"n": np.int64(3), "f": np.float32(0.5), "i": math.inf, "s": "µs →"})) == {
        "n": 3, "f": 0.5, "i": "inf", "s": "µs →"}
    assert "µs →" in to_json({"s": "µs →"})


def test_markdown_table_escapes_pipes_and_aligns():
    assert markdown_table(["a", ("b", "right")], [("x|y", 1)]) == ["| a | b |", "|---|---:|", "| x\\|y | 1 |"]


def test_verify_cli_table_and_json_come_from_the_report(tmp_path, capsys):
    from graphpass.cli import main

    p = tmp_path / "m.onnx"
    __import__("onnx").save(_model(), str(p))
    assert main(["verify", str(p), str(p)]) == 0
    out = capsys.readouterr().out
    report = V.verify_models(_model(), _model())
    assert out == report.to_table()
    assert main(["verify", str(p), str(p), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "graphpass.verify_report/2"
