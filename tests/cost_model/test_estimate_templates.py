"""The estimate's node templates (AscendCostModel._templates): a node whose signature and
runtime inputs' walk state (format, producer's engine, fp16 storage, folded by GE) and whose
engine and output format annotations match a node walked before takes that node's whole walk
entry. That must give the very report the signature path alone, and the general path, give, to
the bit (a repr of every per-node record, engine, crossing and implicit TransData)."""

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import AscendCostModel
from graphpass.ir import annotations as A
from graphpass.testing import make_model

from test_estimate_signature import _both, _dump  # noqa: E402

EXPORTERS = Path(__file__).resolve().parents[1] / "data" / "exporters"
F16 = TensorProto.FLOAT16


def _templates(model: AscendCostModel, graph) -> int:
    cx_out: list = []
    model.placement_report(graph, {}, cx_out, {}, False, {})
    return len(cx_out[0].templates)


def _without_templates(monkeypatch, model, graph, **options) -> str:
    with monkeypatch.context() as m:
        m.setattr(AscendCostModel, "_templates", False)
        return _dump(model, graph, **options)


def _check(monkeypatch, model, graph, options=({}, {"precision_mode": "force_fp16"}, {"fusion": False})) -> None:
    for opts in options:
        fast, general = _both(monkeypatch, model, graph, **opts)
        assert fast == general, opts
        assert fast == _without_templates(monkeypatch, model, graph, **opts), opts


@pytest.mark.parametrize("name", ["resnet18.torchscript", "mobilenet_v3_small.dynamo", "gpt2.torchscript",
                                  "shufflenet_v2.torchscript", "llama_static.dynamo", "nms_detector.torchscript",
                                  "vad_control_flow.torchscript"])
def test_real_exports_get_the_same_report_with_templates(monkeypatch, name):
    graph = gp.load(EXPORTERS / f"{name}.onnx").graph
    model = AscendCostModel()
    _check(monkeypatch, model, graph)
    if name not in ("resnet18.torchscript", "mobilenet_v3_small.dynamo"):  # (a symbolic batch: no static outputs)
        assert _templates(model, graph) > 0  # the templates were taken


def test_optimized_graph_with_engine_and_format_annotations(monkeypatch):
    # what the pipeline leaves: every node's engine annotated, formats on tensors; one annotation
    # against the engine the signature gives, one output format set by hand
    graph = gp.optimize(gp.load(EXPORTERS / "shufflenet_v2.torchscript.onnx", input_shapes={"x": [1, 3, 64, 64]})).model.graph
    assert any(A.get_engine(n) for n in graph.nodes)
    nodes = [n for n in graph.nodes if n.op != "Constant" and n.outputs and n.outputs[0].name]
    A.set_engine(nodes[1], "AICPU")
    A.set_format(nodes[2].outputs[0], "NC1HWC0")
    model = AscendCostModel("ascend910b2")
    _check(monkeypatch, model, graph)
    assert _templates(model, graph) > 0


def _twins(ann_engine=None, ann_format=None, second_input_folded=False):
    """Two Relu -> Add chains of one shape: the second chain's nodes match the first's templates
    unless an annotation or a folded input sets them apart."""
    inits = {"w": np.ones((16, 16, 1, 1), np.float16), "k": np.ones((1, 16, 1, 1), np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["r0"]), helper.make_node("Add", ["r0", "k"], ["a0"]),
             helper.make_node("Relu", ["a0"], ["r1"]), helper.make_node("Add", ["r1", "k2" if second_input_folded else "k"], ["a1"]),
             helper.make_node("Transpose", ["a1"], ["t"], perm=[0, 2, 3, 1])]
    if second_input_folded:
        nodes.insert(0, helper.make_node("Identity", ["k"], ["k2"]))
    graph = gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8])}, {"t": (F16, [1, 8, 8, 16])}, inits)).graph
    relu1 = next(n for n in graph.nodes if n.outputs[0].name == "r1")
    if ann_engine:
        A.set_engine(relu1, ann_engine)
    if ann_format:
        A.set_format(relu1.outputs[0], ann_format)
    return graph


@pytest.mark.parametrize("kw", [{}, {"ann_engine": "AICPU"}, {"ann_engine": "AICORE"}, {"ann_format": "ND"},
                                {"ann_format": "NC1HWC0"}, {"second_input_folded": True}])
def test_annotations_and_walk_state_set_templates_apart(monkeypatch, kw):
    graph = _twins(**kw)
    model = AscendCostModel()
    _check(monkeypatch, model, graph)
    assert _templates(model, graph) > 0
    if not kw:  # the second chain took the first one's templates: fewer templates than nodes walked
        assert _templates(model, graph) < len(graph.nodes) - 1


def test_demands_are_rebuilt_with_the_nodes_own_tensors(monkeypatch):
    # two Transposes of one signature read a 5HD tensor: each one's implicit TransData names its own input
    inits = {"w": np.ones((16, 16, 1, 1), np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c0"]), helper.make_node("Conv", ["x", "w"], ["c1"]),
             helper.make_node("Transpose", ["c0"], ["t0"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["c1"], ["t1"], perm=[0, 2, 3, 1])]
    graph = gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8])}, {"t0": (F16, [1, 8, 8, 16]),
                                                                  "t1": (F16, [1, 8, 8, 16])}, inits)).graph
    model = AscendCostModel()
    _, report = model.placement(graph)
    implicit = {i["tensor"]: i for i in report.transdata["implicit_list"]}
    assert implicit["c0"]["reason"].startswith("Transpose") and implicit["c1"]["reason"].startswith("Transpose")
    _check(monkeypatch, model, graph)
    assert _templates(model, graph) > 0


def test_incremental_updates_with_templates_equal_a_fresh_estimate():
    # the incremental estimate keeps the templates (keyed by content) across updates
    from graphpass.cost_model.incremental import IncrementalEstimate

    graph = _twins()
    model = AscendCostModel()
    inc = IncrementalEstimate(model, graph, full_fraction=None)
    relu1 = next(n for n in graph.nodes if n.outputs[0].name == "r1")
    A.set_engine(relu1, "AICPU")
    report = inc.update(graph, [relu1], [])
    assert report.total_us == model.estimate(graph).total_us
    inc.commit()
    A.set_engine(relu1, "AICORE")
    report = inc.update(graph, [relu1], [])
    assert report.total_us == model.estimate(graph).total_us


def test_kernels_of_one_template_alone_in_their_group_and_a_graph_input(monkeypatch):
    # four Sigmoids of one template, each a kernel of its own (c has three readers): the first makes
    # the template; the second reads a graph input stored in 5HD (no L2 saving on it: a graph
    # output stored in 5HD would not do, its producer writes a twin GE's TransData reads, which L2
    # keeps) and must keep its own figures; the third and fourth write a tensor a Transpose reads:
    # the fourth takes the third's
    inits = {"w": np.ones((16, 16, 1, 1), np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s1"]), helper.make_node("Sigmoid", ["y"], ["s0"]),
             helper.make_node("Sigmoid", ["c"], ["s2"]), helper.make_node("Sigmoid", ["c"], ["s3"])]
    nodes += [helper.make_node("Transpose", [f"s{k}"], [f"t{k}"], perm=[0, 2, 3, 1]) for k in (0, 1, 2, 3)]
    shape = [1, 8, 8, 16]
    graph = gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8]), "y": (F16, [1, 16, 8, 8])},
                               {f"t{k}": (F16, shape) for k in (0, 1, 2, 3)}, inits)).graph
    A.set_format(graph.inputs[1], "NC1HWC0")
    model = AscendCostModel()
    _, report = model.placement(graph)
    sig = [r for r in report.nodes if r["op"] == "Sigmoid"]
    assert len(sig) == 4
    assert sig[0]["memory_us"] == sig[2]["memory_us"] == sig[3]["memory_us"] != sig[1]["memory_us"], sig
    _check(monkeypatch, model, graph)
    assert _templates(model, graph) > 0


def _folded_readers(ann=None):
    """Two Mul nodes of one signature whose first runtime input is a tensor GE folds (its format
    is never set by the walk: what the signature path reads of it is its format annotation)."""
    inits = {"w": np.ones((16, 16, 1, 1), np.float16), "k": np.full((1, 16, 1, 1), 2, np.float16)}
    nodes = [helper.make_node("Identity", ["k"], ["ka"]), helper.make_node("Identity", ["k"], ["kb"])]
    for i, kk in enumerate(("ka", "kb")):
        nodes += [helper.make_node("Conv", ["x", "w"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("Mul", [kk, f"r{i}"], [f"m{i}"]),
                  helper.make_node("Transpose", [f"m{i}"], [f"t{i}"], perm=[0, 2, 3, 1])]
    outs = {"t0": (F16, [1, 8, 8, 16]), "t1": (F16, [1, 8, 8, 16])}
    graph = gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8])}, outs, inits)).graph
    if ann:
        kb = next(n for n in graph.nodes if n.outputs[0].name == "kb").outputs[0]
        A.set_format(kb, ann)
    return graph


@pytest.mark.parametrize("ann", [None, "NC1HWC0", "ND", "FRACTAL_NZ"])
def test_a_folded_first_input_takes_templates_told_apart_by_its_format_annotation(monkeypatch, ann):
    graph = _folded_readers(ann)
    model = AscendCostModel()
    _check(monkeypatch, model, graph)
    cx_out: list = []
    model.placement_report(graph, {}, cx_out, {}, False, {})
    muls = [k for k in cx_out[0].templates if k[0] == "Mul"]
    # the second Mul took the first one's template unless the annotation of its folded input differs
    assert len(muls) == (1 if ann in (None, "ND") else 2), muls


def _reduces(axes_input: bool):
    inits = {"w": np.ones((16, 16, 1, 1), np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"])]
    outs = {}
    for k, axes in enumerate(([1], [2, 3], [1], [2, 3])):  # over C (its output ND) or not, twice each
        if axes_input:
            inits[f"ax{k}"] = np.array(axes, np.int64)
            nodes.append(helper.make_node("ReduceMean", ["c", f"ax{k}"], [f"m{k}"], keepdims=1))
        else:
            nodes.append(helper.make_node("ReduceMean", ["c"], [f"m{k}"], axes=axes, keepdims=1))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"o{k}"]))
        outs[f"o{k}"] = (F16, [1, 1, 8, 8] if axes == [1] else [1, 16, 1, 1])
    nodes += [helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 3, 1]),  # an ND reader: a Softmax in ND
              helper.make_node("Softmax", ["ct"], ["s0"], axis=-1),
              helper.make_node("Softmax", ["ct"], ["s1"], axis=-1)]
    outs.update({"s0": (F16, [1, 8, 8, 16]), "s1": (F16, [1, 8, 8, 16])})
    return gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8])}, outs, inits, opset=18 if axes_input else 17)).graph


@pytest.mark.parametrize("axes_input", [False, True])
def test_reduces_take_templates_unless_their_formats_read_an_axes_input(monkeypatch, axes_input):
    # a reduce's output format reads its axes (5HD in, over C: ND out): from an attribute (held by
    # the template key) a template is made; from a constant input in 5HD, never
    graph = _reduces(axes_input)
    model = AscendCostModel()
    _check(monkeypatch, model, graph)
    cx_out: list = []
    model.placement_report(graph, {}, cx_out, {}, False, {})
    ops = [k[0] for k in cx_out[0].templates]
    assert ops.count("Softmax") == 1  # in ND: no axes read
    assert ops.count("ReduceMean") == (0 if axes_input else 2)
    _, report = model.placement(graph)
    fmts = [tuple(r["formats_out"]) for r in report.nodes if r["op"] == "ReduceMean"]
    assert fmts == [("ND",), ("NC1HWC0",), ("ND",), ("NC1HWC0",)], fmts  # over C, over H and W, twice


def _without_gs_readers(monkeypatch, model, graph, **options) -> str:
    with monkeypatch.context() as m:
        m.setattr(AscendCostModel, "_gs_readers", False)
        return _dump(model, graph, **options)


@pytest.mark.parametrize("name", ["resnet18.torchscript", "mobilenet_v3_small.dynamo", "efficientnet_b0.dynamo",
                                  "gpt2.torchscript", "vad_control_flow.torchscript", "nms_detector.torchscript"])
def test_fusion_reads_readers_off_gs_as_off_the_inputs_map(monkeypatch, name):
    # the fusion chain's readers of a tensor: its gs readers' list filtered to the walked nodes
    # gives the report the map of every walked node's inputs gives, to the bit
    graph = gp.load(EXPORTERS / f"{name}.onnx").graph
    model = AscendCostModel()
    for opts in ({}, {"precision_mode": "force_fp16"}):
        assert _dump(model, graph, **opts) == _without_gs_readers(monkeypatch, model, graph, **opts), opts


def test_a_reader_in_a_branch_body_is_not_a_reader_of_the_top_graph(monkeypatch):
    # c is read by the Relu and, inside an If branch, by a Sigmoid: gs lists both as c's readers;
    # the top graph's fusion sees one reader (Conv + Relu fuse), as the inputs map does
    inits = {"w": np.ones((16, 16, 1, 1), np.float16)}
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["c"], ["s"])], "then", [],
                               [helper.make_tensor_value_info("s", F16, [1, 16, 8, 8])])
    else_g = helper.make_graph([helper.make_node("Neg", ["c"], ["n"])], "else", [],
                               [helper.make_tensor_value_info("n", F16, [1, 16, 8, 8])])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = gp.load(make_model(nodes, {"x": (F16, [1, 16, 8, 8]), "cond": (TensorProto.BOOL, [])},
                               {"t": (F16, [1, 8, 8, 16]), "y": (F16, [1, 16, 8, 8])}, inits)).graph
    conv = next(n for n in graph.nodes if n.op == "Conv")
    assert len(conv.outputs[0].outputs) == 3  # Relu, Sigmoid, Neg
    model = AscendCostModel()
    _, report = model.placement(graph)
    relu = next(r for r in report.nodes if r["op"] == "Relu")
    assert relu["bound"] == "fused", relu
    assert _dump(model, graph) == _without_gs_readers(monkeypatch, model, graph)


def test_incremental_rollback_forgets_the_numbered_states():
    # an update numbers its tensors' states (_Walk.sid) as the walk does; after a rollback the
    # next update must read the states back as the graph has them, not as the undone update left them
    from graphpass.cost_model.incremental import IncrementalEstimate

    graph = _twins()
    model = AscendCostModel()
    inc = IncrementalEstimate(model, graph, full_fraction=None)
    fresh = model.estimate(graph).total_us
    relu1 = next(n for n in graph.nodes if n.outputs[0].name == "r1")
    A.set_engine(relu1, "AICPU")
    assert inc.update(graph, [relu1], []).total_us == model.estimate(graph).total_us != fresh
    A.meta(relu1).pop(A.ENGINE)  # (the graph rolled back)
    inc.rollback()
    assert inc.total == fresh
    A.set_format(relu1.outputs[0], "NC1HWC0")
    assert inc.update(graph, [relu1], [relu1.outputs[0]]).total_us == model.estimate(graph).total_us
    inc.commit()
    A.meta(relu1.outputs[0]).pop(A.FORMAT)
    assert inc.update(graph, [relu1], [relu1.outputs[0]]).total_us == model.estimate(graph).total_us == fresh
