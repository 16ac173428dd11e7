"""resize_to_nearest: linear/cubic Resize -> nearest, an opt-in approximation whose error is reported (issue 25)."""

import math

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.check import verify as V
from graphpass.cli import main
from graphpass.cost_model.base import CostModel
from graphpass.cost_model.op_info import load_op_table
from graphpass.cost_model.report import CostReport
from graphpass.passes import resize_to_nearest
from graphpass.passes.framework import PassContext, all_passes
from graphpass.passes.lowering.resize_to_nearest import RESIZE_NEAREST
from graphpass.testing import check_full, make_model, ops, ort_run

SCALES = np.float32([1, 1, 2, 2])


def _resize(mode="linear", opset=17, **attrs):
    if opset == 10:
        node = helper.make_node("Resize", ["x", "scales"], ["y"], name="rs", mode=mode)
    else:
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", mode=mode, **attrs)
    relu = helper.make_node("Relu", ["y"], ["z"])
    return make_model([node, relu], {"x": [1, 2, 4, 5]}, {"z": [1, 2, 8, 10]}, {"scales": SCALES}, opset=opset)


class _PreferNearest(CostModel):
    """Prices a linear or cubic Resize above a nearest one (the tiny graphs here are launch-bound)."""

    target = "test"

    def estimate(self, graph, **kw):
        modes = [n.attrs.get("mode") for n in graph.nodes if n.op == "Resize"]
        return CostReport("test", 2.0 if any(m in ("linear", "cubic", b"linear", b"cubic") for m in modes) else 1.0)


def _apply(model, target="ascend910b2", cost_model=None):
    graph = gp.load(model).graph
    ctx = PassContext(target=target, cost_model=cost_model) if cost_model else PassContext(target=target)
    return graph, resize_to_nearest(graph, ctx), ctx


@pytest.mark.parametrize("mode, extra", [("linear", {"coordinate_transformation_mode": "half_pixel"}),
                                         ("linear", {"coordinate_transformation_mode": "align_corners", "antialias": 1}),
                                         ("cubic", {"cubic_coeff_a": -0.5, "exclude_outside": 1})])
def test_linear_and_cubic_become_nearest_with_cann_rounding(mode, extra):
    opset = 18 if "antialias" in extra else 17
    model = _resize(mode, opset=opset, **extra)
    graph, result, _ = _apply(model, cost_model=_PreferNearest())
    assert result.modified and result.stats["resizes"] == 1 and result.stats["from_modes"] == {mode: 1}
    rs = next(n for n in graph.nodes if n.op == "Resize")
    assert rs.attrs["mode"] == "nearest" and rs.attrs["nearest_mode"] == "round_prefer_ceil"
    assert rs.attrs.get("coordinate_transformation_mode") == extra.get("coordinate_transformation_mode")
    assert not {"cubic_coeff_a", "exclude_outside", "antialias"} & set(rs.attrs)
    after = gp.to_proto(graph)
    check_full(after)
    # the reported error is the max abs difference on the verification inputs (optimize --verify's)
    feeds, _ = V.make_inputs(model, seed=0)
    a, b = ort_run(model, feeds)["z"], ort_run(after, feeds)["z"]
    assert result.stats["max_abs_error"] == pytest.approx(float(np.abs(a.astype(np.float64) - b).max()))
    assert result.stats["max_abs_error"] > 0.01  # an approximation: not a rounding
    assert result.stats["max_abs_error_by_output"] == {"z": result.stats["max_abs_error"]}


def test_resize_10_has_only_a_mode():
    graph, result, _ = _apply(_resize(opset=10), cost_model=_PreferNearest())
    assert result.modified
    rs = next(n for n in graph.nodes if n.op == "Resize")
    assert rs.attrs == {"mode": "nearest"}
    check_full(gp.to_proto(graph))


def test_nearest_is_left_alone():
    graph, result, _ = _apply(_resize("nearest"))
    assert not result.modified and ops(graph) == ["Resize", "Relu"]


def test_a_graph_that_does_not_run_is_not_changed_and_says_why():
    model = _resize()
    model.graph.node.append(helper.make_node("Mystery", ["z"], ["w"], domain="my.ops"))
    model.graph.output[0].name = "w"
    model.opset_import.append(helper.make_opsetid("my.ops", 1))
    graph, result, ctx = _apply(model, cost_model=_PreferNearest())
    assert not result.modified
    assert next(n for n in graph.nodes if n.op == "Resize").attrs["mode"] == "linear"
    assert "could not be measured" in ctx.explanations[0].reason


def test_never_in_the_default_pipeline():
    model = _big("cubic")
    plain = gp.optimize(model).model.to_proto()
    assert [a.s for n in plain.graph.node for a in n.attribute if a.name == "mode"] == [b"cubic"]
    enabled = gp.optimize(model, enable=["resize_to_nearest"]).model.to_proto()
    modes = [a.s for n in enabled.graph.node if n.op_type == "Resize" for a in n.attribute if a.name == "mode"]
    assert modes == [b"nearest"]


def test_the_promise_is_a_named_approximation_that_loosens_nothing():
    cls = all_passes()["resize_to_nearest"]
    assert cls.promise is RESIZE_NEAREST and RESIZE_NEAREST.approximate and not RESIZE_NEAREST.bounded
    assert not cls.default_enabled
    assert "approximation" in str(RESIZE_NEAREST)
    # alone: the outputs are held exactly; beside a tolerance pass: to that tolerance, no looser
    assert (V.tolerance_for([RESIZE_NEAREST]).rtol, V.tolerance_for([RESIZE_NEAREST]).atol) == (0.0, 0.0)
    reassoc = all_passes()["fold_batchnorm"].promise
    tol = V.tolerance_for([RESIZE_NEAREST, reassoc])
    assert (tol.rtol, tol.atol) == (V.tolerance_for([reassoc]).rtol, V.tolerance_for([reassoc]).atol)
    assert "resize-nearest loosens nothing" in tol.why


def test_verify_fails_honestly_unless_the_error_is_accepted(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_big("cubic"), src)
    code = main(["optimize", str(src), "-o", str(out), "--enable", "resize_to_nearest", "--verify"])
    err = capsys.readouterr().err
    assert code == 1 and "resize_to_nearest ran: an approximation" in err and "--atol" in err
    assert not out.exists()
    code = main(["optimize", str(src), "-o", str(out), "--enable", "resize_to_nearest", "--verify", "--atol", "10"])
    printed = capsys.readouterr().out
    assert code == 0 and out.exists()
    assert "max_abs_error" in printed  # the summary line of the pass states the measured error


def test_the_op_table_prices_each_mode():
    table = load_op_table()
    rows = {m: table.lookup_node(gp.load(_resize(m)).graph.nodes[0]) for m in ("nearest", "linear", "cubic")}
    assert {m: (r.ascend, r.engine) for m, r in rows.items()} == {
        "nearest": ("ResizeNearestNeighborV2", "AICORE"), "linear": ("ResizeBilinearV2", "AICORE"),
        "cubic": ("ResizeBicubic", "AICPU")}
    assert all("atlasoxol_09_0131" in r.src for r in rows.values())
    # a Resize without a mode attribute is ONNX's default, nearest
    bare = gp.load(make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"])], {"x": [1, 1, 2, 2]},
                              {"y": [1, 1, 4, 4]}, {"scales": SCALES})).graph.nodes[0]
    assert table.lookup_node(bare).ascend == "ResizeNearestNeighborV2"


def _big(mode):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", mode=mode)
    return make_model([node], {"x": [1, 32, 128, 128]}, {"y": [1, 32, 256, 256]}, {"scales": SCALES})


@pytest.mark.parametrize("target", ["ascend910b2", "ascend910a", "ascend310p3"])
def test_only_where_the_estimate_drops(target):
    # cubic: ATC's parser refuses it (priced on AI CPU): nearest runs on AI Core
    t = gp.Target.load(target)
    before = t.estimate(_big("cubic")).total_us
    graph, result, _ = _apply(_big("cubic"), target)
    assert result.modified and t.estimate(gp.to_proto(graph)).total_us < before
    # linear: AI Core either way; the Resize is memory- or launch-bound, nearest saves nothing
    graph, result, ctx = _apply(_big("linear"), target)
    assert not result.modified
    assert "buys nothing" in ctx.explanations[0].reason and target in ctx.explanations[0].reason


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_lraspp_corpus(exporter, tmp_path):
    # LR-ASPP's two bilinear upsamplings (the segmentation head): on AI Core either way in the estimate
    path = f"tests/data/exporters/lraspp_mobilenet_v3.{exporter}.onnx"
    graph = gp.load(path).graph
    ctx = PassContext(target="ascend910b2")
    assert not resize_to_nearest(graph, ctx).modified
    reasons = [e.reason for e in ctx.explanations]
    assert len(reasons) == 2 and all("buys nothing on ascend910b2" in r for r in reasons)
    # where a cost model takes it: the error it reports is the outputs' max abs difference on the
    # verification inputs
    model = gp.load(path)
    ctx = PassContext(target="ascend910b2", cost_model=_PreferNearest())
    result = resize_to_nearest(model.graph, ctx)
    assert result.modified and result.stats["from_modes"] == {"linear": 2}
    out = tmp_path / "o.onnx"
    gp.save(model, out)
    onnx.checker.check_model(str(out), full_check=True)
    original = onnx.load(path)
    feeds, _ = V.make_inputs(original, seed=0)
    a, b = ort_run(original, feeds), ort_run(onnx.load(str(out)), feeds)
    whole = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)
    assert 0 < whole < math.inf and result.stats["max_abs_error"] == pytest.approx(whole)


def test_moved_nan_or_inf_is_an_infinite_error():
    from graphpass.passes.lowering.resize_to_nearest import ResizeToNearest

    a = {"y": np.array([1.0, np.nan, np.inf], np.float32), "i": np.array([1, 2])}
    assert ResizeToNearest._errors(a, {"y": np.array([1.5, np.nan, np.inf], np.float32), "i": np.array([1, 2])}) == \
        {"y": 0.5, "i": 0.0}
    assert ResizeToNearest._errors(a, {"y": np.array([np.nan, np.nan, np.inf], np.float32), "i": a["i"]})["y"] == math.inf
    assert ResizeToNearest._errors(a, {"y": np.array([1.0, np.nan, -np.inf], np.float32), "i": a["i"]})["y"] == math.inf
    assert ResizeToNearest._errors(a, {"y": a["y"], "i": np.array([1, 3])})["i"] == 1.0  # integers: the difference
