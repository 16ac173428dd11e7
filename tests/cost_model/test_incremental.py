"""The cost veto's incremental estimate (cost_model/incremental.py, issue 22): after every edit
its total equals a fresh estimate's (==, not approx), and after a rollback it describes the
restored graph. Pipelines over real models run with GRAPHPASS_CHECK_INCREMENTAL (the suite sets
it: every update is checked against a fresh estimate); tiny graphs check the propagation cases
one by one; random edits with random rollbacks check the rest."""

import glob
import os
import random
import sys
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs
import pytest

import graphpass as gp
from graphpass.cost_model.incremental import FULL_FRACTION
from graphpass.cost_model.target import Target
from graphpass.ir import annotations as A
from graphpass.ir.journal import Journal
from graphpass.passes.framework import instruments as I

from conftest import LIGHT_DIR

ROOT = Path(__file__).resolve().parents[2]
EXPORTERS = ROOT / "tests" / "data" / "exporters"

TARGET = Target.load()


# -- tiny graphs ------------------------------------------------------------------------------

def _conv_graph(blocks: int = 3, c: int = 16, hw: int = 8, residual: bool = True) -> gs.Graph:
    """x -> (Conv -> Relu [-> Add of the block's input]) x blocks -> y (every tensor shaped)."""
    rng = np.random.default_rng(0)
    x = gs.Variable("x", np.float32, [1, c, hw, hw])
    nodes, cur = [], x
    for b in range(blocks):
        w = gs.Constant(f"w{b}", rng.standard_normal((c, c, 3, 3)).astype(np.float32))
        conv = gs.Variable(f"conv{b}", np.float32, [1, c, hw, hw])
        relu = gs.Variable(f"relu{b}", np.float32, [1, c, hw, hw])
        nodes.append(gs.Node("Conv", f"Conv{b}", {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, [cur, w], [conv]))
        nodes.append(gs.Node("Relu", f"Relu{b}", inputs=[conv], outputs=[relu]))
        out = relu
        if residual and b % 2:
            add = gs.Variable(f"add{b}", np.float32, [1, c, hw, hw])
            nodes.append(gs.Node("Add", f"Add{b}", inputs=[relu, cur], outputs=[add]))
            out = add
        cur = out
    y = gs.Variable("y", np.float32, [1, c, hw, hw])
    nodes.append(gs.Node("Identity", "out", inputs=[cur], outputs=[y]))
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)


def _fresh(graph: gs.Graph) -> float:
    return TARGET.estimate(graph).total_us


def _edit(inc, graph, fn):
    """Apply ``fn(graph)`` under a journal and update ``inc``; returns (report, journal)."""
    j = Journal(graph)
    j.start()
    fn(graph)
    report = inc.update(graph, j.touched_nodes(), j.touched_tensors(), j.changed_tensors())
    j.stop()
    return report, j


def _check(inc, graph, report):
    fresh, placement = _fresh(graph), TARGET.placement(graph)[0]
    assert report.total_us == fresh  # equal, not close
    assert inc.engines == placement


def _start(graph):
    inc = TARGET.incremental_estimate(graph, _full_fraction=0)
    assert inc.report.total_us == _fresh(graph)
    return inc


def _node(graph, name):
    return next(n for n in graph.nodes if n.name == name)


def _rewire(reader, old, new):
    for i, x in enumerate(reader.inputs):
        if x is old:
            reader.inputs[i] = new


def _insert_after(graph, node, op, name, attrs=None):
    """A new single-input node after ``node``'s first output, taking over its readers."""
    t = node.outputs[0]
    new_t = gs.Variable(f"{name}_out", t.dtype, list(t.shape))
    readers = list(t.outputs)
    for r in readers:
        _rewire(r, t, new_t)
    new = gs.Node(op, name, attrs or {}, inputs=[t], outputs=[new_t])
    graph.nodes.insert(graph.nodes.index(node) + 1, new)
    return new


def _remove(graph, node):
    """Remove a single-input single-output node, its readers reading its input."""
    src, out = node.inputs[0], node.outputs[0]
    for r in list(out.outputs):
        _rewire(r, out, src)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes.remove(node)


def test_a_format_change_flows_downstream():
    # the Relu's output annotated 5HD: its readers see it (an implicit TransData where they take ND)
    graph = _conv_graph()
    inc = _start(graph)
    before = inc.report.total_us
    report, _ = _edit(inc, graph, lambda g: A.set_format(_node(g, "Relu0").outputs[0], "FRACTAL_NZ"))
    _check(inc, graph, report)
    assert report.total_us != before and inc.updates == 1 and inc.full_estimates == 1


def test_an_engine_annotation_changes_the_crossings_and_placement():
    graph = _conv_graph()
    inc = _start(graph)
    report, _ = _edit(inc, graph, lambda g: A.set_engine(_node(g, "Relu1"), "AICPU"))
    _check(inc, graph, report)
    assert inc.engines[id(_node(graph, "Relu1"))][0] == "AICPU" and report.crossings and inc.updates == 1


def test_a_fusion_chain_that_now_extends_and_one_that_breaks():
    graph = _conv_graph(residual=False)
    inc = _start(graph)
    # a second reader of Conv0's output: the chain Conv0 -> Relu0 breaks
    def add_reader(g):
        conv = _node(g, "Conv0").outputs[0]
        neg = gs.Node("Neg", "Neg0", inputs=[conv], outputs=[gs.Variable("neg0", np.float32, list(conv.shape))])
        g.nodes.insert(g.nodes.index(_node(g, "Relu0")) + 1, neg)
    report, _ = _edit(inc, graph, add_reader)
    _check(inc, graph, report)
    assert inc.head_of[id(_node(graph, "Relu0"))] == id(_node(graph, "Relu0"))  # no longer fused
    # ... and removed again: the chain extends over Relu0 again
    def drop_reader(g):
        neg = _node(g, "Neg0")
        neg.inputs.clear()
        neg.outputs.clear()
        g.nodes.remove(neg)
    report, _ = _edit(inc, graph, drop_reader)
    _check(inc, graph, report)
    assert inc.head_of[id(_node(graph, "Relu0"))] == id(_node(graph, "Conv0"))
    assert inc.updates == 2 and inc.full_estimates == 1


def test_a_removed_node_whose_reader_had_an_implicit_transdata():
    # Conv (5HD) -> Transpose (ND): an implicit TransData; removing a Relu in between changes
    # which tensor carries it, and removing the Transpose removes it
    graph = _conv_graph(residual=False)
    relu = _node(graph, "Relu2")
    _insert_after(graph, relu, "Transpose", "T", {"perm": [0, 1, 3, 2]})
    inc = _start(graph)
    assert inc.conv_us  # an implicit TransData before the Transpose
    report, _ = _edit(inc, graph, lambda g: _remove(g, _node(g, "Relu2")))
    _check(inc, graph, report)
    report, _ = _edit(inc, graph, lambda g: _remove(g, _node(g, "T")))
    _check(inc, graph, report)
    assert inc.updates == 2


def test_after_a_rollback_the_cache_is_the_pre_pass_one():
    graph = _conv_graph(blocks=4)
    inc = _start(graph)
    total, engines = inc.report.total_us, dict(inc.engines)
    report, j = _edit(inc, graph, lambda g: (_remove(g, _node(g, "Relu1")), A.set_engine(_node(g, "Conv2"), "AICPU")))
    _check(inc, graph, report)
    assert report.total_us != total
    j.rollback()
    inc.rollback()
    assert inc.report.total_us == total == _fresh(graph) and inc.engines == engines
    # and it goes on from there: a later edit is updated from the restored cache
    report, _ = _edit(inc, graph, lambda g: setattr(_node(g, "Relu3"), "op", "Sigmoid"))
    _check(inc, graph, report)
    assert inc.updates == 2


def test_a_rollback_after_a_full_estimate_restores_the_state_before_it():
    graph = _conv_graph()
    inc = TARGET.incremental_estimate(graph)  # the default: an edit of most of the graph is estimated in full
    total = inc.report.total_us
    report, j = _edit(inc, graph, lambda g: [A.set_engine(n, "AICPU") for n in g.nodes])
    assert inc.fallbacks == {"the edit touched a large part of the graph": 1} and report.total_us == _fresh(graph)
    j.rollback()
    inc.rollback()
    assert inc.report.total_us == total == _fresh(graph)


def test_global_changes_are_estimated_in_full():
    graph = _conv_graph()
    inc = _start(graph)
    def new_output(g):
        g.outputs.append(_node(g, "Relu0").outputs[0])
    report, _ = _edit(inc, graph, new_output)
    assert report.total_us == _fresh(graph) and inc.fallbacks == {"graph inputs or outputs changed": 1}


_EDITS = ("op", "insert", "remove", "format", "engine", "reader", "shape")


def _random_edit(graph, rng):
    kind = rng.choice(_EDITS)
    nodes = [n for n in graph.nodes if n.name != "out"]
    if kind == "op":
        n = rng.choice([n for n in nodes if n.op in ("Relu", "Sigmoid", "Tanh")] or nodes)
        if n.op in ("Relu", "Sigmoid", "Tanh"):
            n.op = rng.choice(["Relu", "Sigmoid", "Tanh"])
    elif kind == "insert":
        n = rng.choice(nodes)
        _insert_after(graph, n, rng.choice(["Relu", "Identity", "Abs"]), f"new{rng.random():.9f}")
    elif kind == "remove":
        cands = [n for n in nodes if n.op in ("Relu", "Identity", "Abs", "Sigmoid", "Tanh") and len(n.inputs) == 1]
        if cands:
            _remove(graph, rng.choice(cands))
    elif kind == "format":
        t = rng.choice(rng.choice(nodes).outputs)
        A.set_format(t, rng.choice(["NC1HWC0", "ND", "FRACTAL_NZ", "NCHW"]))
    elif kind == "engine":
        A.set_engine(rng.choice(nodes), rng.choice(["AICORE", "AICPU", "HOST"]))
    elif kind == "reader":
        n = rng.choice(nodes)
        t = n.outputs[0]
        new = gs.Node("Neg", f"reader{rng.random():.9f}", inputs=[t],
                      outputs=[gs.Variable(f"r{rng.random():.9f}", t.dtype, list(t.shape))])
        graph.nodes.insert(graph.nodes.index(n) + 1, new)
    else:  # a dtype the producer now declares
        n = rng.choice([n for n in nodes if n.op in ("Relu", "Abs", "Identity")] or nodes)
        n.outputs[0].dtype = rng.choice([np.float32, np.float16])


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_and_rollbacks_keep_the_estimate_exact(seed):
    rng = random.Random(seed)
    graph = _conv_graph(blocks=40, residual=True)
    inc = _start(graph)
    for _ in range(30):
        report, j = _edit(inc, graph, lambda g: _random_edit(g, rng))
        _check(inc, graph, report)
        if rng.random() < 0.3:
            j.rollback()
            inc.rollback()
            assert inc.report.total_us == _fresh(graph) and inc.engines == TARGET.placement(graph)[0]
        else:
            inc.commit()
    assert inc.updates == 30 and inc.full_estimates == 1  # nothing global changed
    assert inc.refuse_full.total() <= 3  # the fusion groups formed again locally


# -- pipelines over real models, every update checked -------------------------------------------

@pytest.fixture
def veto_stats(monkeypatch):
    seen = []
    orig = I.CostVeto.exit

    def exit_(self, manager, graph, ctx):
        orig(self, manager, graph, ctx)
        if self.incremental_stats is not None:
            seen.append(self.incremental_stats)

    monkeypatch.setattr(I.CostVeto, "exit", exit_)
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "1")
    return seen


_CORPUS = ["resnet18.torchscript", "gpt2.dynamo", "style_transfer.torchscript", "llama.torchscript",
           "shufflenet_v2.torchscript", "whisper.dynamo"]
_FALLBACK = ["nms_detector.torchscript", "vad_control_flow.dynamo"]  # a host-scheduled region; control flow


@pytest.mark.parametrize("name", _CORPUS + _FALLBACK)
def test_pipeline_over_the_exporter_corpus(name, veto_stats):
    res = gp.optimize(str(EXPORTERS / f"{name}.onnx"))
    assert res.report.cost_after_us == _fresh(res.model.graph)
    stats = veto_stats[-1]
    if name in _FALLBACK:
        assert stats["incremental"] == 0 and "graph with subgraphs or a host-scheduled region" in stats["fallbacks"]
    else:
        assert stats["incremental"] > 0


@pytest.mark.parametrize("name", ["light_inception_v2", "light_shufflenet", "light_squeezenet"])
def test_pipeline_over_onnx_light_models(name, veto_stats):
    gp.optimize(os.path.join(LIGHT_DIR, f"{name}.onnx"))
    assert veto_stats[-1]["incremental"] > 0


@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_pipeline_over_synthetic_models(family, tmp_path, veto_stats):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scaling
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path, _ = scaling.write_model(family, 2000, tmp_path)
    gp.optimize(str(path))
    assert veto_stats[-1]["incremental"] > 0


def test_without_the_check_a_large_edit_is_estimated_in_full(monkeypatch, veto_stats):
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "0")
    gp.optimize(str(EXPORTERS / "resnet18.torchscript.onnx"))
    stats = veto_stats[-1]
    assert stats["fallbacks"].get("the edit touched a large part of the graph", 0) > 0
    assert 0 < FULL_FRACTION < 1


# -- the cost veto: updates, a rollback, the pass manager's run ---------------------------------

class _OneNodeOnAicpu(gp.Pass):
    """Puts one Relu on AI CPU: the estimate rises (two crossings, an AI CPU op), so it is rolled back."""

    name = "one_node_on_aicpu"
    summary = "one Relu annotated AI CPU (dearer: vetoed)"
    kind = gp.PassKind.PLACEMENT
    scored = True

    def run(self, graph, ctx):
        A.set_engine(_node(graph, "Relu20"), "AICPU")
        return gp.PassResult(True, {})


class _DropOneIdentity(gp.Pass):
    """Removes an inserted Identity (cheaper: kept)."""

    name = "drop_one_identity"
    summary = "an inserted Identity removed"
    kind = gp.PassKind.CLEANUP
    scored = True

    def run(self, graph, ctx):
        ident = [n for n in graph.nodes if n.name.startswith("ident")]
        if not ident:
            return gp.PassResult(False, {})
        _remove(graph, ident[0])
        return gp.PassResult(True, {})


class _DropAnotherIdentity(_DropOneIdentity):
    name = "drop_another_identity"


def test_the_veto_rolls_back_and_keeps_updates_incrementally(monkeypatch):
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "0")  # the production path (a check is below)
    graph = _conv_graph(blocks=40)
    _insert_after(graph, _node(graph, "Relu30"), "Identity", "ident1")
    _insert_after(graph, _node(graph, "Relu10"), "Identity", "ident2")
    veto = I.CostVeto()
    ctx = gp.PassContext(target=TARGET)
    passes = [_DropOneIdentity(), _OneNodeOnAicpu(), _DropAnotherIdentity()]
    res = gp.PassManager(passes, instruments=[veto], max_rounds=1)(graph, ctx)
    first, rolled, kept = res.records
    assert first.modified and rolled.rolled_back and not rolled.modified and kept.modified
    assert A.get_engine(_node(graph, "Relu20")) is None and not any(n.name.startswith("ident") for n in graph.nodes)
    stats = veto.incremental_stats
    # the input estimated plainly; the first small edit builds the state (a full estimate); the
    # vetoed one and the last are updates (the rollback put the replaced entries back)
    assert stats["full"] == 2 and stats["incremental"] == 2 and stats["refuse_full"] == {}
    assert stats["fallbacks"] == {"state built after a plain full estimate": 1}
    assert veto.final_cost == kept.cost_after_us == _fresh(graph) < first.cost_before_us
    assert rolled.cost_after_us > rolled.cost_before_us == first.cost_after_us
