"""The IR journal (graphpass.ir.journal): an undo log instead of a snapshot.

A rollback must give back the exact model: the exported bytes before the edits and after the
rollback are equal, and so is the wiring gs keeps on both sides (a tensor's consumers in order).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper
from onnx_graphsurgeon.util.misc import SynchronizedList

from graphpass.errors import PassError
from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.graph import iter_graphs, toposort
from graphpass.ir.journal import Journal, active
from graphpass.ir.model import as_model, model_of
from graphpass.passes.framework import CostVeto, Pass, PassContext, PassKind, PassManager, PassResult
from graphpass.passes.framework.instruments import PassInstrument
from graphpass.cost_model import CostModel, CostReport

ROOT = Path(__file__).resolve().parents[2]


def _bytes(graph: gs.Graph) -> bytes:
    return model_io.to_proto(graph, emit="device").SerializeToString()


def _wiring(graph: gs.Graph) -> list:
    """Every node's and tensor's neighbours, by identity and in order (what the export omits)."""
    out = []
    for g in iter_graphs(graph):
        out.append((id(g), [id(n) for n in g.nodes], [id(t) for t in g.inputs], [id(t) for t in g.outputs]))
        for n in g.nodes:
            out.append((id(n), n.op, n.name, [id(t) for t in n.inputs], [id(t) for t in n.outputs]))
            for t in list(n.inputs) + list(n.outputs):
                out.append((id(t), type(t).__name__, t.name, [id(x) for x in t.inputs], [id(x) for x in t.outputs]))
    return out


def _if_model() -> gs.Graph:
    """x -> Relu -> If(cond){then: a+1, else: a*2} -> Neg -> y, annotated, with a weight."""
    then_g = helper.make_graph([helper.make_node("Add", ["a", "one"], ["t_out"], name="then_add")], "then", [],
                              [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    else_g = helper.make_graph([helper.make_node("Mul", ["a", "two"], ["e_out"], name="else_mul")], "else", [],
                              [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["cond"], ["b"], name="if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["b", "w"], ["c"], name="add"),
             helper.make_node("Neg", ["c"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")])
    m = as_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    relu = next(n for n in m.graph.nodes if n.op == "Relu")
    A.set(relu, A.ENGINE, "AICORE")
    return m.graph


def _edit_everything(graph: gs.Graph) -> None:
    """Every kind of edit a pass makes: create, remove, rewire, rename, retype, reshape, attrs,
    annotations, subgraphs, graph inputs/outputs, model facts, to_constant, cleanup, toposort."""
    relu, if_, add, neg = graph.nodes
    # create: Abs between Relu and If's readers, at the end of the list (toposort moves it)
    a = relu.outputs[0]
    a2 = gs.Variable("a2", dtype=np.float32, shape=[2, 3])
    graph.nodes.append(gs.Node("Abs", "abs", inputs=[a], outputs=[a2]))
    # rename, retype and reshape a tensor; change a node's op, name, domain and attrs
    add.outputs[0].name = "c_renamed"
    add.outputs[0].shape = [2, "n"]
    neg.op, neg.name = "Sqrt", "sqrt"
    neg.attrs = {"alpha": 1.0}
    neg.attrs["beta"] = 2.0  # in place, after the node was touched
    # rewire: Add reads the new tensor; the weight becomes a variable
    add.inputs[1] = a2
    w = if_.outputs[0]
    w.to_constant(np.zeros((2, 3), np.float32))
    # annotations
    A.set(relu, A.ENGINE, "AICPU")
    A.set(a2, A.FORMAT, "NC1HWC0")
    A.set(add.outputs[0], A.FORMAT, "ND")
    # subgraph: the then-branch's Add becomes Sub and gains a node
    then_g = if_.attrs["then_branch"]
    then_g.nodes[0].op = "Sub"
    then_g.nodes.insert(0, gs.Node("Identity", "then_id", inputs=[a], outputs=[gs.Variable("tid", np.float32, [2, 3])]))
    # remove a node (outputs cleared, then cleanup), graph outputs and inputs
    if_.outputs.clear()
    if_.inputs.clear()
    graph.outputs = [add.outputs[0]]
    graph.inputs.pop()
    graph.cleanup(remove_unused_graph_inputs=True)
    toposort(graph)
    # model-level facts
    model = model_of(graph)
    model.opset_imports["com.example"] = 1
    model.metadata_props["k"] = "v"
    graph.name = "renamed"


def test_rollback_restores_bytes_and_wiring():
    graph = _if_model()
    before, wiring = _bytes(graph), _wiring(graph)
    with Journal(graph) as j:
        _edit_everything(graph)
    assert _bytes(graph) != before  # the edits changed the model
    touched = {n.name for n in j.touched_nodes()}
    assert {"abs", "add", "sqrt", "if", "relu"} <= touched
    j.rollback()
    assert _bytes(graph) == before
    assert _wiring(graph) == wiring


def _class_attributes():
    return (gs.Node.__dict__["__setattr__"], gs.Tensor.__dict__["__setattr__"], gs.Graph.__dict__["__setattr__"],
            SynchronizedList.__dict__["append"], "sort" in SynchronizedList.__dict__,
            "__delattr__" in gs.Tensor.__dict__, gs.Variable.__dict__["__init__"], gs.Constant.__dict__["values"])


def test_hooks_only_while_recording():
    originals = _class_attributes()
    graph = _if_model()
    with Journal(graph):
        assert active() and gs.Node.__dict__["__setattr__"] is not originals[0]
        with Journal(graph) as inner:  # nested journals: both record
            graph.nodes[0].op = "Abs"
        inner.rollback()
        assert graph.nodes[0].op == "Relu" and active()
    assert not active()
    assert _class_attributes() == originals


def test_created_objects_need_no_undo_and_untouched_ones_are_not_saved():
    graph = _if_model()
    with Journal(graph) as j:
        t = gs.Variable("fresh", np.float32, [1])
        gs.Node("Relu", "fresh_node", inputs=[t], outputs=[gs.Variable("fresh_out", np.float32, [1])])
    assert j.edits == 0  # a node made of new tensors touches nothing of the graph
    assert j.touched_nodes() and {n.name for n in j.touched_nodes()} == {"fresh_node"}


def test_touched_set_follows_a_changed_tensor_to_its_readers():
    graph = _if_model()
    add = next(n for n in graph.nodes if n.op == "Add")
    with Journal(graph) as j:
        add.outputs[0].shape = [4, 3]  # the Neg that reads it is touched, the Relu is not
    names = {n.name for n in j.touched_nodes()}
    assert "neg" in names and "relu" not in names
    j.rollback()
    assert add.outputs[0].shape == [2, 3]


def test_a_lazy_weight_read_is_not_a_change():
    graph = _if_model()
    w = next(t for n in graph.nodes for t in n.inputs if isinstance(t, gs.Constant) and t.name == "w")
    with Journal(graph) as j:
        np.asarray(w.values)
    assert not j.touched_nodes()


# -- through the pass manager ---------------------------------------------------------------

class _EditEverything(Pass):
    name = "edit_everything"
    summary = "every kind of edit (test)"
    kind = PassKind.FUSION

    def run(self, graph, ctx):
        _edit_everything(graph)
        return PassResult(True)


class _RaiseMidway(Pass):
    name = "raise_midway"
    summary = "edits, then raises (test)"
    kind = PassKind.CLEANUP
    scored = False

    def run(self, graph, ctx):
        _edit_everything(graph)
        raise RuntimeError("boom")


class _Rising(CostModel):
    """Every estimate is higher than the one before: every scored application is vetoed."""

    target = "test"

    def __init__(self):
        self.calls = 0

    def estimate(self, graph, **kw):
        self.calls += 1
        return CostReport("test", float(self.calls))


def test_vetoed_pass_leaves_the_model_byte_identical():
    graph = _if_model()
    before, wiring = _bytes(graph), _wiring(graph)
    res = PassManager([_EditEverything], instruments=[CostVeto(_Rising(), check_rollback=True)])(graph)
    assert res.records[0].rolled_back and not res.modified
    assert _bytes(graph) == before and _wiring(graph) == wiring
    assert not active()


def test_a_pass_that_raises_is_rolled_back():
    graph = _if_model()
    before, wiring = _bytes(graph), _wiring(graph)
    with pytest.raises(PassError, match="boom"):
        PassManager([_RaiseMidway], instruments=[CostVeto("none")])(graph)
    assert _bytes(graph) == before and _wiring(graph) == wiring
    assert not active()


# -- every pass of the default pipeline on real models ---------------------------------------

class _UndoEach(PassInstrument):
    """Innermost: undoes every application that changed the graph, checks the bytes, and runs
    the pass again so the next pass sees the graph the pipeline makes."""

    def __init__(self):
        self.checked: list[str] = []

    def before(self, pass_, graph, ctx, record):
        self._bytes, self._wiring = _bytes(graph), _wiring(graph)
        self._journal = Journal(graph)
        self._journal.start()

    def after(self, pass_, graph, ctx, result, record):
        self._journal.stop()
        if not result.modified:
            return
        self._journal.rollback()
        assert _bytes(graph) == self._bytes, f"rollback of {pass_.name} changed the exported model"
        assert _wiring(graph) == self._wiring, f"rollback of {pass_.name} changed the wiring"
        self.checked.append(pass_.name)
        again = pass_.apply_to(model_of(graph), graph, ctx)
        if again.modified and not pass_.preserves_order:
            toposort(graph)


#: a sample of the exporter corpus (every file goes through the pipeline with the rollback check
#: in tests/exporters): external data, control flow (Loop, If), vetoed applications, transformers
_SAMPLE = ("bert.dynamo.onnx", "gpt2.torchscript.onnx", "lraspp_mobilenet_v3.dynamo.onnx",
           "nms_detector.torchscript.onnx", "vad_control_flow.torchscript.onnx", "vad_control_flow.dynamo.onnx",
           "whisper.dynamo.onnx", "efficientnet_b0.torchscript.onnx")


def _corpus_paths() -> list[str]:
    exporters = ROOT / "tests" / "data" / "exporters"
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    paths = [str(ROOT / "examples" / "models" / "shufflenet_v2_x0_5.onnx")]
    paths += [str(exporters / f) for f in _SAMPLE if (exporters / f).exists()]
    paths += [os.path.join(light, f) for f in ("light_bvlc_alexnet.onnx", "light_squeezenet.onnx")
              if os.path.exists(os.path.join(light, f))]
    return paths


@pytest.mark.parametrize("path", _corpus_paths(), ids=lambda p: Path(p).name)
def test_every_default_pass_rolls_back_exactly_on_real_models(path):
    from graphpass.api import pass_instances
    from graphpass.passes import pipelines

    model = as_model(path)
    names = pipelines.build("default", None, set(), set())
    undo = _UndoEach()
    ctx = PassContext()
    PassManager(pass_instances(names), instruments=[CostVeto(check_rollback=True), undo])(model, ctx)
    assert undo.checked  # some pass changed every one of these models


def test_the_veto_exports_nothing(monkeypatch):
    """No export inside the pipeline for the veto: rollback replays the journal (it used to
    snapshot the graph by an export before every scored pass and re-import it on a veto)."""
    from graphpass.ir import serialize

    graph = _if_model()
    before = _bytes(graph)
    calls = []
    real = serialize._export
    monkeypatch.setattr(serialize, "_export", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = PassManager([_EditEverything], instruments=[CostVeto(_Rising(), check_rollback=False)])(graph)
    assert res.records[0].rolled_back
    assert calls == []
    monkeypatch.undo()
    assert _bytes(graph) == before


class _Interrupted(_RaiseMidway):
    name = "interrupted"

    def run(self, graph, ctx):
        _edit_everything(graph)
        raise KeyboardInterrupt


def test_objects_built_while_recording_are_built_as_graphsurgeon_builds_them():
    # the journal builds gs's own Node, Variable and Constant without its setattr hooks: the
    # same attributes in the same order, the same list class, the other side's lists kept in step
    from graphpass.ir import journal as J

    assert len(J._FAST_INITS) == 3  # the installed gs is the one the fast constructors mirror
    x = gs.Variable("x", np.float32, [2])
    w = gs.Constant("w", np.ones(2, np.float32))

    def build():
        y = gs.Variable("y", dtype=np.float32, shape=[2])
        n = gs.Node("Add", "add", attrs={"a": 1}, inputs=[x, w], outputs=[y], domain="")
        return n, y, gs.Constant("c", np.zeros(3, np.int64), export_dtype=np.int32), gs.Variable.empty(), gs.Node("Relu")

    plain = build()
    for n in plain[0], plain[4]:
        n.inputs.clear()
        n.outputs.clear()
    j = Journal(gs.Graph())
    with j:
        made = build()
    for a, b in zip(plain, made):
        assert type(a) is type(b) and list(a.__dict__) == list(b.__dict__)
        for k, v in a.__dict__.items():
            u = b.__dict__[k]
            assert type(u) is type(v)
            if isinstance(v, list):
                assert [id(t) for t in u] == [id(t) for t in v] or k in ("inputs", "outputs")
            elif not isinstance(v, np.ndarray):
                assert u == v, k
    node, y = made[0], made[1]
    assert list(node.inputs) == [x, w] and x.outputs[-1] is node and w.outputs[-1] is node and y.inputs[0] is node
    assert node.inputs.parent_obj is node and y.outputs.parent_obj is y
    j.rollback()  # the tensors the new node read are given back their readers as they were
    assert list(x.outputs) == [] and list(w.outputs) == []


def test_an_interrupted_pass_is_rolled_back_and_leaves_no_hook():
    graph = _if_model()
    before = _bytes(graph)
    with pytest.raises(KeyboardInterrupt):
        PassManager([_Interrupted], instruments=[CostVeto("none")])(graph)
    assert not active() and _bytes(graph) == before


# -- the graphs a journal saves, given by the pass manager -----------------------------------

class _Nothing(Pass):
    name = "change_nothing"
    summary = "changes nothing (test)"
    kind = PassKind.FUSION

    def run(self, graph, ctx):
        return PassResult(False)


def test_a_journal_given_its_graphs_walks_none_and_still_undoes_a_body_edit(monkeypatch):
    import graphpass.ir.journal as J

    graph = _if_model()
    before, wiring = _bytes(graph), _wiring(graph)
    graphs = J.all_graphs(graph)
    assert len(graphs) == 3  # the main graph and the If's two branches
    monkeypatch.setattr(J, "iter_graphs", lambda g: pytest.fail("the journal walked the graph"))
    with J.known_graphs(graph, graphs):
        with Journal(graph) as j:
            _edit_everything(graph)  # edits the then-branch's node list in place
    assert J._KNOWN == {}
    j.rollback()
    assert _bytes(graph) == before and _wiring(graph) == wiring


def test_the_manager_gives_every_applications_journal_the_graphs_of_its_version(monkeypatch):
    import graphpass.ir.journal as J

    walks = []
    real = J.all_graphs
    monkeypatch.setattr(J, "all_graphs", lambda g: walks.append(g) or real(g))  # Journal.start's own walk
    graph = _if_model()
    before, wiring = _bytes(graph), _wiring(graph)
    res = PassManager([_Nothing, _Nothing(), _EditEverything],
                      instruments=[CostVeto(_Rising(), check_rollback=True)])(graph)
    assert [r.rolled_back for r in res.records] == [False, False, True]  # vetoed: the branch edit undone
    assert walks == []  # three journals, no walk of theirs: the manager's list (one walk) served them
    assert _bytes(graph) == before and _wiring(graph) == wiring and J._KNOWN == {}


# -- annotation_edits: what the cost veto may skip an estimate for -----------------------------

def test_annotation_edits_lists_node_annotations_changed_and_nothing_else():
    graph = _if_model()
    relu, if_, add, neg = graph.nodes
    with Journal(graph) as j:
        A.set(relu, A.ENGINE, "AICPU")
        A.set_engine(neg, "AICORE")  # a node with no annotation before
        A.set_engine(add, A.get_engine(add) or "x")  # a touch that changes nothing ...
        A.meta(add).pop(A.ENGINE)  # ... (set and removed again)
    edits = {n.name: (before, now) for n, before, now in j.annotation_edits()}
    assert edits == {"relu": ({A.ENGINE: "AICORE"}, {A.ENGINE: "AICPU"}), "neg": (None, {A.ENGINE: "AICORE"})}


def test_annotation_edits_is_none_when_nothing_changed():
    graph = _if_model()
    relu = graph.nodes[0]
    with Journal(graph) as j:
        A.set(relu, A.ENGINE, "AICORE")  # the value it had
    assert j.annotation_edits() is None


@pytest.mark.parametrize("edit", [
    lambda g: setattr(g.nodes[3], "op", "Abs"),
    lambda g: g.nodes[3].attrs.__setitem__("alpha", 1.0) if g.nodes[3].inputs.append(g.nodes[3].inputs[0]) else None,
    lambda g: g.nodes[2].inputs.__setitem__(1, g.nodes[0].outputs[0]),
    lambda g: setattr(g.nodes[0].outputs[0], "shape", [3, 2]),
    lambda g: A.set_format(g.nodes[0].outputs[0], "NC1HWC0"),
    lambda g: g.nodes.append(gs.Node("Abs", "abs", inputs=[g.nodes[0].outputs[0]],
                                     outputs=[gs.Variable("abs_out", np.float32, [2, 3])])),
    lambda g: g.nodes.pop(),
    lambda g: g.outputs.append(g.nodes[0].outputs[0]),
    lambda g: A.set(g, "k", "v"),
    lambda g: model_of(g).metadata_props.__setitem__("k", "v"),
    lambda g: g.nodes[1].attrs["then_branch"].nodes[0].__setattr__("op", "Sub"),
    lambda g: setattr(g, "name", "renamed"),
], ids=["op", "attrs-in-place-after-a-touch", "rewire", "shape", "tensor-annotation", "create", "remove",
        "graph-output", "graph-annotation", "model-metadata", "subgraph-op", "graph-name"])
def test_annotation_edits_is_none_for_any_other_edit(edit):
    graph = _if_model()
    with Journal(graph) as j:
        A.set(graph.nodes[0], A.ENGINE, "AICPU")
        edit(graph)
    assert j.annotation_edits() is None


def test_constant_swaps_lists_inputs_that_read_another_constant():
    graph = _if_model()
    add = graph.nodes[2]
    w = add.inputs[1]
    w2 = gs.Constant("w2", np.arange(6, dtype=np.float32).reshape(2, 3))
    with Journal(graph) as j:
        add.inputs[1] = w2
    assert j.constant_swaps() == [(add, 1, w, w2)]
    assert j.annotation_edits() is None


@pytest.mark.parametrize("edit", [
    lambda g, c: g.nodes[2].inputs.__setitem__(0, g.nodes[0].outputs[0]),  # a variable rewired
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), setattr(g.nodes[2], "op", "Sub")),
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), A.set_engine(g.nodes[2], "AICPU")),
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), g.nodes[2].inputs.append(c)),
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), setattr(c, "name", "w3")),  # made in the journal? no: edited
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), A.set_format(c, "ND")),
    lambda g, c: (g.nodes[2].inputs.__setitem__(1, c), g.nodes.pop()),
], ids=["variable", "op", "annotation", "added-input", "renamed", "tensor-annotation", "node-removed"])
def test_constant_swaps_is_none_for_any_other_edit(edit):
    graph = _if_model()
    c = gs.Constant("w2", np.arange(6, dtype=np.float32).reshape(2, 3))  # made before the journal
    with Journal(graph) as j:
        edit(graph, c)
    assert j.constant_swaps() is None


def test_a_constant_made_by_the_pass_is_no_swap():
    graph = _if_model()
    with Journal(graph) as j:
        graph.nodes[2].inputs[1] = gs.Constant("w2", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert j.constant_swaps() is None  # (an object the pass made and kept: the estimate may not know it)


# -- flat_graph: iter_graphs without a walk while no body can have appeared ---------------------

def _flat_model() -> gs.Graph:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return as_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph


def _count_walks(monkeypatch) -> list:
    from graphpass.ir import graph as graph_mod

    walks = []
    real = graph_mod.subgraph_holders
    monkeypatch.setattr(graph_mod, "subgraph_holders", lambda g: walks.append(g) or real(g))
    return walks


def test_iter_graphs_does_not_walk_a_flat_graph_until_a_body_is_made(monkeypatch):
    from graphpass.ir.journal import flat_graph

    graph = _flat_model()
    walks = _count_walks(monkeypatch)
    with Journal(graph), flat_graph(graph):
        walks.clear()  # (the journal's start walked it once)
        assert list(iter_graphs(graph)) == [graph] and walks == []
        body = gs.Graph(nodes=[], inputs=[], outputs=[], name="body")  # made under the log: counted
        graph.nodes.append(gs.Node("If", "if", attrs={"then_branch": body, "else_branch": body},
                                   inputs=[graph.inputs[0]], outputs=[gs.Variable("z")]))
        assert body in list(iter_graphs(graph)) and walks
    walks.clear()
    assert body in list(iter_graphs(graph)) and walks  # (the block is over: walked as always)


def test_flat_graph_does_nothing_without_a_journal(monkeypatch):
    from graphpass.ir.journal import flat_graph

    graph = _flat_model()
    walks = _count_walks(monkeypatch)
    with flat_graph(graph):  # nothing counts the bodies made: not trusted
        body = gs.Graph(nodes=[], inputs=[], outputs=[], name="body")
        graph.nodes.append(gs.Node("Loop", "loop", attrs={"body": body}, inputs=[], outputs=[gs.Variable("z")]))
        assert body in list(iter_graphs(graph)) and walks


class _MakesAnIf(Pass):
    """Adds an If with fresh branches, then counts the graphs iter_graphs yields (the manager ran
    it under flat_graph: the graph held no subgraph when it started)."""

    name = "makes_an_if"
    summary = "an If made, then the graphs walked"
    kind = PassKind.CLEANUP
    seen = 0

    def run(self, graph, ctx):
        if any(n.op == "If" for n in graph.nodes):
            return PassResult(False)
        out = graph.outputs[0]
        branch = gs.Graph(nodes=[], inputs=[], outputs=[graph.nodes[0].outputs[0]], name="branch")
        cond = gs.Constant("cond", np.array(True))
        z = gs.Variable("z", np.float32, [2, 3])
        graph.nodes.append(gs.Node("If", "if", attrs={"then_branch": branch, "else_branch": branch},
                                   inputs=[cond], outputs=[z]))
        graph.outputs = [out, z]
        type(self).seen = len(list(iter_graphs(graph)))
        return PassResult(True)


@pytest.mark.parametrize("veto", [True, False])
def test_a_body_made_by_a_pass_is_walked_in_the_same_application(veto):
    graph = _flat_model()
    PassManager([_MakesAnIf], instruments=[CostVeto()] if veto else [])(graph, PassContext(target="none"))
    assert _MakesAnIf.seen == 3  # the graph and its two branches (one object, yielded for each)


def test_iter_graphs_walks_a_sequence_map_body():
    body = gs.Graph(nodes=[], inputs=[], outputs=[], name="body")
    graph = _flat_model()
    graph.nodes.append(gs.Node("SequenceMap", "map", attrs={"body": body}, inputs=[], outputs=[gs.Variable("s")]))
    assert body in list(iter_graphs(graph))


class _CountsWalks(Pass):
    # stands for one of graphpass's own passes: the manager uses flat_graph for those only
    __module__ = "graphpass.passes.cleanup.counts_walks_stand_in"
    name = "counts_walks"
    summary = "walks the graphs once"
    kind = PassKind.CLEANUP
    walks: list = []

    def run(self, graph, ctx):
        from graphpass.ir import graph as graph_mod

        real = graph_mod.subgraph_holders
        graph_mod.subgraph_holders = lambda g: type(self).walks.append(g) or real(g)
        try:
            list(iter_graphs(graph))
        finally:
            graph_mod.subgraph_holders = real
        return PassResult(False)


def test_a_graph_with_local_functions_but_no_subgraph_is_not_walked():
    graph = _flat_model()
    fn = gs.Function("f", domain="custom", nodes=[], inputs=[], outputs=[])
    graph.functions.append(fn)
    _CountsWalks.walks = []
    PassManager([_CountsWalks], instruments=[CostVeto()])(graph, PassContext(target="none"))
    assert _CountsWalks.walks == []


def test_replace_uses_many_rewires_as_setitem_does_and_rolls_back():
    """graph.replace_uses_many under an undo log: the wiring is the one ``inputs[i] = new`` gives,
    edit by edit (a node reading the old tensor twice, two olds in one node, an old replaced by a
    tensor others read), readers' lists included, and the undo log puts it all back."""
    from graphpass.ir.graph import replace_uses_many

    def build():
        x = gs.Variable("x", np.float32, [2])
        a, b, c = (gs.Constant(n, np.full(2, v, np.float32)) for n, v in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
        outs = [gs.Variable(f"o{i}", np.float32, [2]) for i in range(4)]
        nodes = [gs.Node("Add", "n0", inputs=[a, a], outputs=[outs[0]]),
                 gs.Node("Sum", "n1", inputs=[x, a, b, a, c], outputs=[outs[1]]),
                 gs.Node("Mul", "n2", inputs=[c, b], outputs=[outs[2]]),
                 gs.Node("Relu", "n3", inputs=[x], outputs=[outs[3]])]
        g = gs.Graph(nodes=nodes, inputs=[x], outputs=outs, opset=17)
        return g, {t.name: t for n in nodes for t in n.inputs}

    def by_setitem(pairs):  # what the bulk edit must equal
        mapping = {id(o): n for o, n in pairs}
        for consumer in {id(r): r for o, _ in pairs for r in o.outputs}.values():
            for i, t in enumerate(list(consumer.inputs)):
                if id(t) in mapping:
                    consumer.inputs[i] = mapping[id(t)]

    def names(g):
        return [(n.name, [t.name for t in n.inputs]) for n in g.nodes] + [
            (t.name, [n.name for n in t.outputs]) for t in {id(t): t for n in g.nodes for t in n.inputs}.values()]

    g1, t1 = build()
    g2, t2 = build()
    before = _wiring(g1)
    with Journal(g1) as j:
        replace_uses_many([(t1["a"], t1["c"]), (t1["b"], t1["x"])])
    by_setitem([(t2["a"], t2["c"]), (t2["b"], t2["x"])])
    assert names(g1) == names(g2)
    assert [n.name for n in t1["c"].outputs] == ["n1", "n2", "n0", "n0", "n1", "n1"]
    assert not t1["a"].outputs and not t1["b"].outputs
    j.rollback()
    assert _wiring(g1) == before
    replace_uses_many([(t1["a"], t1["c"]), (t1["b"], t1["x"])])  # no undo log recording: the same edits
    assert names(g1) == names(g2)


def test_clear_and_one_pair_rewiring_under_one_undo_log_edit_as_without_and_roll_back():
    """The hooked clear of a lean list under one undo log saves and unlinks each element in one
    loop, and replace_uses_many of one pair skips its tables: the readers' lists are the ones the
    plain edits give (a node reading one tensor twice, a tensor read by more than nine nodes: the
    search by id past its first places, a node not first among its readers), and the rollback
    gives everything back."""
    from graphpass.ir.graph import replace_uses_many

    def build():
        x = gs.Variable("x", np.float32, [2])
        c = gs.Constant("c", np.ones(2, np.float32))
        nodes = [gs.Node("Add", f"r{i}", inputs=[x, c], outputs=[gs.Variable(f"o{i}", np.float32, [2])]) for i in range(12)]
        nodes.append(gs.Node("Mul", "twice", inputs=[c, x, c], outputs=[gs.Variable("m", np.float32, [2])]))
        g = gs.Graph(nodes=nodes, inputs=[x], outputs=[n.outputs[0] for n in nodes], opset=17)
        return g, nodes, x, c

    def lists(x, c, nodes):
        return [[n.name for n in x.outputs], [n.name for n in c.outputs], [[t.name for t in n.inputs] for n in nodes]]

    results = []
    for journal in (True, False):
        g, nodes, x, c = build()
        before = _wiring(g)
        j = Journal(g)
        if journal:
            j.start()
        for k in (10, 3, 12, 0):  # past the ninth place, in the middle, the one reading c twice, the first
            nodes[k].inputs.clear()
        y = gs.Variable("y", np.float32, [2])
        replace_uses_many([(c, y)])  # one pair: every remaining reader of c reads y
        results.append(lists(x, c, nodes) + [[n.name for n in y.outputs]])
        if journal:
            j.stop()
            j.rollback()
            assert _wiring(g) == before
    assert results[0] == results[1]
    assert results[0][1] == [] and results[0][3] == [f"r{i}" for i in (1, 2, 4, 5, 6, 7, 8, 9, 11)]
