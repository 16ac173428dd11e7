"""The estimate's per-signature shortcut (AscendCostModel._signature): a node whose tensors all
have static shapes is priced once per signature and walk state, and that must give the very
report the general path (every fact read off the node) gives, to the bit."""

import dataclasses
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import AscendCostModel
from graphpass.ir import annotations as A
from graphpass.ir.graph import subgraphs_of
from graphpass.testing import make_model

EXPORTERS = Path(__file__).resolve().parents[1] / "data" / "exporters"
F16 = TensorProto.FLOAT16


def _positions(graph: gs.Graph, pre: str = "", out: dict | None = None) -> dict[int, str]:
    out = {} if out is None else out
    for i, node in enumerate(graph.nodes):
        out[id(node)] = f"{pre}{i}"
        for j, sub in enumerate(subgraphs_of(node)):
            _positions(sub, f"{pre}{i}.{j}/", out)
    return out


def _dump(model: AscendCostModel, graph: gs.Graph, **options) -> str:
    """Everything an estimate says (every per-node record, engines, crossings, implicit
    TransData, totals), as text: repr tells -0.0 from 0.0 and every last bit of a float."""
    engines, report = model.placement(graph, node_records=True, **options)
    where = _positions(graph)
    costs, _ = model.node_costs(graph, **options)
    return repr((dataclasses.asdict(report), sorted((where[k], v) for k, v in engines.items()), sorted(costs.items())))


def _general_only(monkeypatch):
    """Price every node the general way (as before the signatures)."""
    monkeypatch.setattr(AscendCostModel, "_signature", lambda self, *args: (None, None, 0))


def _signatures(model: AscendCostModel, graph: gs.Graph) -> int:
    cx_out: list = []
    model.placement_report(graph, {}, cx_out, {}, False, {})
    return len(cx_out[0].sigs)


def _both(monkeypatch, model, graph, **options) -> tuple[str, str]:
    fast = _dump(model, graph, **options)
    with monkeypatch.context() as m:
        _general_only(m)
        general = _dump(model, graph, **options)
    return fast, general


@pytest.mark.parametrize("name", ["resnet18.torchscript", "mobilenet_v3_small.dynamo", "gpt2.torchscript",
                                  "nms_detector.torchscript", "vad_control_flow.torchscript", "llama_static.dynamo"])
def test_real_exports_get_the_general_paths_report(monkeypatch, name):
    graph = gp.load(EXPORTERS / f"{name}.onnx").graph
    model = AscendCostModel()
    for options in ({}, {"precision_mode": "must_keep_origin_dtype"}, {"fusion": False}):
        fast, general = _both(monkeypatch, model, graph, **options)
        assert fast == general, (name, options)
    if name != "vad_control_flow.torchscript":  # (its nodes are few and mostly control flow)
        assert _signatures(model, graph) > 0  # the shortcut was taken


def test_optimized_graph_with_annotations_gets_the_general_paths_report(monkeypatch):
    # what the pipeline leaves: fused device ops, formats and engines annotated
    graph = gp.optimize(gp.load(EXPORTERS / "resnet18.torchscript.onnx")).model.graph
    annotated = [n for n in graph.nodes if A.get_engine(n)] + [
        t for n in graph.nodes for t in n.outputs if A.get_format(t)]
    node = next(n for n in graph.nodes if n.op != "Constant")
    A.set_engine(node, "AICPU")  # an annotation against the signature's engine
    model = AscendCostModel("ascend910b2")
    for options in ({}, {"precision_mode": "force_fp16"}):
        fast, general = _both(monkeypatch, model, graph, **options)
        assert fast == general, options
    assert annotated and _signatures(model, graph) > 0


def _slices_model():
    nodes, inits = [], {}
    for k, step in ((0, 1), (1, 2)):  # the same shapes, the same signature; a step of 2 on the last axis
        for name, v in ((f"st{k}", [0]), (f"en{k}", [8]), (f"ax{k}", [3]), (f"sp{k}", [step])):
            inits[name] = np.asarray(v, np.int64)
        nodes.append(helper.make_node("Slice", ["x", f"st{k}", f"en{k}", f"ax{k}", f"sp{k}"], [f"y{k}"]))
    # the declared shapes are the same (the cost model reads declared shapes)
    return make_model(nodes, {"x": [1, 4, 8, 8]}, {"y0": [1, 4, 8, 4], "y1": [1, 4, 8, 4]}, inits)


def test_nodes_of_one_signature_whose_engine_reads_values_keep_their_own_engine(monkeypatch):
    graph = gp.load(_slices_model()).graph
    model = AscendCostModel()
    engines, _ = model.placement(graph)
    by_name = {n.outputs[0].name: engines[id(n)] for n in graph.nodes}
    assert by_name["y0"][0] == "AICORE"
    assert by_name["y1"][0] == "AICPU" and "step 2 on the last axis" in by_name["y1"][1]
    fast, general = _both(monkeypatch, model, graph)
    assert fast == general


def test_reduces_of_one_signature_keep_their_own_formats(monkeypatch):
    # ReduceMean's axes are an input (opset 18): over C its output leaves 5HD, over H it stays
    inits = {"w": np.ones((16, 16, 1, 1), np.float16), "c": np.asarray([1], np.int64), "h": np.asarray([2], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("ReduceMean", ["a", "c"], ["over_c"]),
             helper.make_node("ReduceMean", ["a", "h"], ["over_h"])]
    # one declared output shape for both, so that both nodes have one signature
    model_proto = make_model(nodes, {"x": (F16, [1, 16, 16, 16])},
                             {"over_c": (F16, [1, 16, 1, 16]), "over_h": (F16, [1, 16, 1, 16])}, inits, opset=18)
    graph = gp.load(model_proto).graph
    model = AscendCostModel()
    _, report = model.placement(graph)
    assert [r["formats_out"] for r in report.nodes if r["op"] == "ReduceMean"] == [["ND"], ["NC1HWC0"]]
    fast, general = _both(monkeypatch, model, graph)
    assert fast == general


def test_symbolic_shapes_are_read_in_the_general_paths_order(monkeypatch):
    # the first read of a symbolic dim writes its assumption: the node that reads a graph input
    # first takes the general path, the others their signature; the assumptions come out the same
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "z"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = gp.load(make_model(nodes, {"x": ["batch", 8], "z": ["seq", 8]}, {"y": ["batch", 8]})).graph
    model = AscendCostModel()
    fast, general = _both(monkeypatch, model, graph)
    assert fast == general
    assert _signatures(model, graph) >= 1
    _, report = model.placement(graph)
    assert report.assumed_dims == {"batch": 1, "seq": 1}
    assert [a.split(" (")[0] for a in report.assumptions] == ["symbolic dim 'batch' taken as 1",
                                                               "symbolic dim 'seq' taken as 1"]
