"""Every pass that changes device cost is scored (issue 21): the placement and precision passes.

place_and_sink is scored: the veto rolls it back when the estimate rises and keeps it when it
falls. mixed_precision is scored and required (a precision the user asked for): its
applications are estimated, and kept even when the estimate rises.
"""

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import CostModel, CostReport
from graphpass.ir import annotations as A
from graphpass.passes.framework import PassContext, PassManager, get_pass
from graphpass.passes.framework.instruments import CostVeto
from graphpass.passes.pipelines import DEFAULT_PIPELINE, PIPELINES
from graphpass.testing import assert_equivalent, make_model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
TARGET = "ascend310p3"


def _run(graph, passes):
    veto = CostVeto()
    res = PassManager(passes, instruments=[veto])(graph, PassContext(target=TARGET))
    return res.records


def test_the_cost_changing_passes_are_scored_and_the_vetoable_ones_are_the_readmes():
    assert get_pass("place_and_sink").is_scored() and not get_pass("place_and_sink").required
    assert get_pass("mixed_precision").is_scored() and get_pass("mixed_precision").required
    # the README's list of what the cost model can veto is the registry's
    import re
    from pathlib import Path

    readme = (Path(gp.__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- vetoable:begin -->(.*?)<!-- vetoable:end -->", readme, re.S)
    assert m, "README: the list of passes the cost model can veto"
    listed = set(re.findall(r"`([a-z_0-9]+)`", m.group(1)))
    from graphpass.passes.framework import all_passes

    vetoable = {n for n in all_passes() if get_pass(n).is_scored() and not get_pass(n).required}
    assert listed == vetoable


def _resize_model():
    """x -> Resize (cubic: AI CPU on Ascend, ATC's parser takes nearest and linear only) -> Relu."""
    return make_model([helper.make_node("Relu", ["x"], ["a"], name="pre"),
                       helper.make_node("Resize", ["a", "", "s"], ["b"], mode="cubic", name="resize"),
                       helper.make_node("Relu", ["b"], ["y"], name="post")],
                      {"x": [1, 4, 8, 8]}, {"y": [1, 4, 16, 16]},
                      initializers={"s": np.array([1, 1, 2, 2], np.float32)})


class _SunkLoopsCost(CostModel):
    """A cost model under which a sunk Loop is dear (100 us each): what a target whose device
    loop is slower than the host's would say."""

    target = "sunk-loops"

    def estimate(self, graph, **kw):
        sunk = sum(1 for n in graph.nodes if n.op == "Loop" and A.get(n, A.SINK) == "device")
        return CostReport("sunk-loops", 10.0 + 100.0 * sunk)


def test_place_and_sink_is_rolled_back_when_the_estimate_rises():
    # on the Ascend model its placement agrees with the estimate by construction (the estimate's
    # own engines, annotations kept) and sinking only saves launches, so the estimate never
    # rises by it there; under a cost model that prices a sunk Loop dearer, the veto rolls it back
    model = _loop_model()
    graph = gp.load(model).graph
    veto = CostVeto(_SunkLoopsCost())
    rec = PassManager(["place_and_sink"], instruments=[veto])(graph, PassContext(target=TARGET)).records[0]
    assert rec.rolled_back and rec.cost_after_us > rec.cost_before_us and "rolled back" in rec.note
    loop = next(n for n in graph.nodes if n.op == "Loop")
    assert A.get(loop, A.SINK) is None and all(A.get_engine(n) is None for n in graph.nodes)  # as it was
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def _loop_model(trips=10):
    body = helper.make_graph(
        [helper.make_node("Relu", ["state_in"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "one"], ["state_out"], name="add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("state_in", F, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("state_out", F, [1, 4, 8, 8])])
    return make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="loop")],
                      {"x": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]},
                      initializers={"n": np.array(trips, np.int64), "one": np.array(1.0, np.float32)})


def test_place_and_sink_is_kept_when_sinking_lowers_the_estimate():
    model = _loop_model()
    graph = gp.load(model).graph
    rec = _run(graph, ["place_and_sink"])[0]
    assert rec.modified and not rec.rolled_back and rec.cost_after_us < rec.cost_before_us
    loop = next(n for n in graph.nodes if n.op == "Loop")
    assert A.get(loop, A.SINK) == "device"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def _conv_model():
    w = np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype(np.float32)
    return make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                       helper.make_node("Sigmoid", ["c"], ["y"], name="act")],
                      {"x": [1, 16, 32, 32]}, {"y": [1, 16, 32, 32]}, initializers={"w": w})


@pytest.mark.parametrize("mode", ["allow_fp32_to_fp16", "force_fp16"])
def test_mixed_precision_is_estimated_and_kept_even_when_the_estimate_rises(mode):
    # ATC's default precision (force_fp16) already computes the Conv in fp16: converting in the
    # graph adds boundary Casts, so the estimate rises; the user asked for it, so it stays
    from graphpass.passes.precision.mixed_precision import MixedPrecision

    graph = gp.load(_conv_model()).graph
    rec = _run(graph, [MixedPrecision(mode=mode)])[0]
    assert rec.modified and not rec.rolled_back
    assert rec.cost_before_us is not None and rec.cost_after_us > rec.cost_before_us
    assert any(n.op == "Cast" for n in graph.nodes)


def test_the_default_pipeline_still_places_a_plain_model():
    # scoring place_and_sink rolls back nothing where the graph carries no foreign annotation
    graph = gp.load(_resize_model()).graph
    records = _run(graph, list(PIPELINES[DEFAULT_PIPELINE]))
    rec = [r for r in records if r.name == "place_and_sink"]
    assert rec and not any(r.rolled_back for r in rec)
    assert A.get_engine(next(n for n in graph.nodes if n.op == "Resize")) == "AICPU"


def test_the_reports_final_estimate_is_a_fresh_estimate_of_the_result():
    """optimize's report takes the veto's last report instead of walking the graph again (issue 22):
    it must be what a fresh estimate of the optimized graph says, on every light model."""
    import onnx

    import graphpass as gp

    light = sorted((Path(onnx.__file__).parent / "backend/test/data/light").glob("*.onnx"))[:4]
    for path in light:
        result = gp.optimize(path, target="ascend910b2")
        fresh = gp.estimate(result.model, target="ascend910b2")
        assert result.report.cost_after_us == pytest.approx(fresh.total_us, rel=1e-12), path.name
        assert result.report.iterations_per_loop[1] == pytest.approx(fresh.total_us, rel=1e-12), path.name
