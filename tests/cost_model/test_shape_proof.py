"""The shapes the estimating verbs price: proven on a copy, as ATC proves them (issue 21).

``graphpass cost``, ``diff``'s cost columns and the calibration benchmark estimate the graph
``graphpass.passes.shape_proof.prove_shapes`` gives: open input dims assumed (and listed), the
exporter's shape arithmetic folded; a static, resolved graph is estimated as it is.
"""

import json

import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass.cli import main
from graphpass.cost_model import get_target
from graphpass.passes.shape_proof import annotate, needs_proof, prove_shapes
from graphpass.testing import make_model


def _reshape_by_shape_arithmetic(batch="batch"):
    """x[batch, 8, 4, 4] -> Reshape to [2 * batch, 4, 4, 4] computed from Shape(x): the exporter's
    Shape -> Gather -> Unsqueeze -> Mul -> Concat chain."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["nu"]), helper.make_node("Mul", ["nu", "two"], ["h"]),
             helper.make_node("Concat", ["h", "rest"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    return make_model(nodes, {"x": [batch, 8, 4, 4]}, {"y": None},
                      initializers={"i0": np.array(0, np.int64), "ax": np.array([0], np.int64),
                                    "two": np.array([2], np.int64), "rest": np.array([4, 4, 4], np.int64)})


def _cost(path, capsys, *args):
    assert main(["cost", str(path), "--target", "ascend310p3", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_assumed_batch_is_priced_as_the_fixed_batch_and_said(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_reshape_by_shape_arithmetic().SerializeToString())
    plain = get_target("ascend310p3").estimate(gp.load(str(src)).graph)
    assert plain.breakdown_us["crossings"] > 0  # without the proof the shape chain is host work
    assumed, fixed = _cost(src, capsys), _cost(src, capsys, "--dim", "batch=1")
    assert assumed["assumed_dims"] == {"batch": 1} and fixed["assumed_dims"] == {}
    assert assumed["breakdown_us"]["crossings"] == 0
    assert assumed["total_us"] == pytest.approx(fixed["total_us"], rel=1e-9)
    assert assumed["total_us"] < plain.total_us / 2
    assert any("taken as 1" in a for a in assumed["assumptions"])
    assert any("shapes proven on a copy" in a and "batch=1" in a for a in assumed["assumptions"])


def test_a_static_resolved_graph_is_estimated_as_it_is(light_path, capsys):
    path = light_path("light_resnet50.onnx")
    graph = gp.load(path).graph
    proof = prove_shapes(graph)
    assert not needs_proof(graph) and proof.graph is graph and not proof.proven and proof.assumed == {}
    direct = get_target("ascend310p3").estimate(graph)
    assert annotate(direct, proof).assumptions == direct.assumptions
    via_cli = _cost(path, capsys)
    assert via_cli["total_us"] == direct.total_us and via_cli["assumptions"] == direct.assumptions


def test_the_proof_never_changes_the_model():
    model = gp.load(_reshape_by_shape_arithmetic())
    before = [(n.op, [t.name for t in n.outputs]) for n in model.graph.nodes]
    shapes = {t.name: list(t.shape or []) for n in model.graph.nodes for t in n.outputs}
    proof = prove_shapes(model.graph)
    assert proof.proven and proof.graph is not model.graph and len(proof.graph.nodes) < len(before)
    assert [(n.op, [t.name for t in n.outputs]) for n in model.graph.nodes] == before
    assert {t.name: list(t.shape or []) for n in model.graph.nodes for t in n.outputs} == shapes


def test_an_unnamed_input_dim_is_assumed_and_named_by_its_position(capsys, tmp_path):
    m = _reshape_by_shape_arithmetic(batch=None)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    d = _cost(src, capsys)
    assert d["assumed_dims"] == {"x[0]": 1} and d["breakdown_us"]["crossings"] == 0
    assert any("unknown dim x[0] taken as 1" in a for a in d["assumptions"])


def test_diff_cost_columns_price_the_proven_shapes(tmp_path):
    from graphpass.diff import diff_models

    src = tmp_path / "m.onnx"
    src.write_bytes(_reshape_by_shape_arithmetic().SerializeToString())
    d = diff_models(str(src), str(src), target="ascend310p3")
    fixed = get_target("ascend310p3").estimate(prove_shapes(gp.load(str(src), dims={"batch": 1}).graph).graph)
    assert d.cost["before_us"] == pytest.approx(fixed.total_us, abs=1e-3)
    assert d.cost["assumed_dims"] == {"before": {"batch": 1}, "after": {"batch": 1}}


def test_assumed_dims_come_in_input_order_and_are_never_said_to_be_fixed_by_the_user(tmp_path, capsys):
    w = np.ones((4, 3, 3, 3), np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": ["N", 3, "H", "W"]},
                   {"y": None}, initializers={"w": w})
    src = tmp_path / "conv.onnx"
    src.write_bytes(m.SerializeToString())
    d = _cost(src, capsys)
    assert list(d["assumed_dims"]) == ["N", "H", "W"]
    assert not any("fixed x" in a for a in d["assumptions"])  # the user fixed nothing
    fixed = _cost(src, capsys, "--input-shape", "x:1,3,-1,-1")
    assert list(fixed["assumed_dims"]) == ["H", "W"] and fixed["total_us"] == d["total_us"]


def test_a_proof_that_fails_leaves_the_plain_estimate_and_says_so(monkeypatch):
    from graphpass.passes.framework import PassManager

    def boom(self, *a, **k):
        raise RuntimeError("a pass broke")

    monkeypatch.setattr(PassManager, "__call__", boom)
    graph = gp.load(_reshape_by_shape_arithmetic()).graph
    proof = prove_shapes(graph)
    assert proof.graph is graph and not proof.proven and "could not be proven (RuntimeError)" in proof.note
    t = get_target("ascend310p3")
    report = annotate(t.estimate(graph), proof)
    assert report.total_us == t.estimate(graph).total_us and proof.note in report.assumptions


def test_under_target_none_nothing_is_proven(tmp_path, capsys, monkeypatch):
    """cost --target none has nothing to estimate (exit 2, issue 23), and proves nothing first."""
    import graphpass.passes.shape_proof as sp

    monkeypatch.setattr(sp, "prove_shapes", lambda *a, **k: pytest.fail("a proof under target none"))
    src = tmp_path / "m.onnx"
    src.write_bytes(_reshape_by_shape_arithmetic().SerializeToString())
    assert main(["cost", str(src), "--target", "none", "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "nothing to estimate" in captured.err