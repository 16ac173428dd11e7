"""Hostile review of the cost veto's "unchanged estimate" skip (issue 22, session 11).

``CostVeto._unchanged_estimate`` keeps the estimate after an application that, by the journal,
only wrote the engines the kept estimate chose or swapped a Constant input for an equal one.
Each test here builds a graph and a pass where that claim could be wrong and checks the kept
estimate against a fresh one (``check_incremental=True`` raises when they differ) or the
journal's answer against what changed.
"""

import time

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper

import graphpass as gp
from graphpass.ir import annotations as A
from graphpass.ir.journal import Journal
from graphpass.passes.framework import CostVeto, Pass, PassContext, PassKind, PassManager, PassResult
from graphpass.passes.framework import cost_veto as I
from graphpass.testing import make_model

TARGET = "ascend910a"


def _table_model(size=100):
    """Two shape tables t1, t2 (int64, ``size`` elements; the estimate folds tables of at most 64)
    read by Gather -> Reshape -> Softmax; the Reshape outputs' shapes left symbolic, so the
    estimate sizes them only from the folded Gather value. t1 stays lazy (as imported), t2 is
    loaded (as a pass that read its ``values`` leaves it)."""
    table = np.arange(size, dtype=np.int64)
    table[2], table[3] = 1024, 64
    nodes = [helper.make_node("Gather", ["t1", "i"], ["s1"]), helper.make_node("Reshape", ["x", "s1"], ["r1"]),
             helper.make_node("Softmax", ["r1"], ["y1"]),
             helper.make_node("Gather", ["t2", "i"], ["s2"]), helper.make_node("Reshape", ["x", "s2"], ["r2"]),
             helper.make_node("Softmax", ["r2"], ["y2"])]
    model = make_model(nodes, {"x": [64, 1024]}, {"y1": None, "y2": None},
                       initializers={"t1": table, "t2": table.copy(), "i": np.array([2, 3], np.int64)})
    graph = gp.load(model).graph
    ts = graph.tensors()
    for name in ("r1", "y1", "r2", "y2"):
        ts[name].shape = [f"{name}_a", f"{name}_b"]
    assert type(ts["t1"]._values) is gs.ir.tensor.LazyValues
    ts["t2"].values  # noqa: B018 - loads it
    assert isinstance(ts["t2"]._values, np.ndarray)
    return graph, ts


class _SwapsTable(Pass):
    """Scored; the first Gather reads t2 (equal values, but loaded) instead of t1 (lazy)."""

    name = "swaps_table"
    summary = "a lazy Constant input replaced by an equal loaded one"
    kind = PassKind.FUSION
    scored = True

    def run(self, graph, ctx):
        ts = graph.tensors()
        first = next(n for n in graph.nodes if n.op == "Gather")
        if first.inputs[0] is ts["t2"]:
            return PassResult(False)
        first.inputs[0] = ts["t2"]
        return PassResult(True)


def _run(graph, passes, **veto_kw):
    veto = CostVeto(**veto_kw)
    res = PassManager(passes, instruments=[veto])(graph, PassContext(target=TARGET))
    return veto, res


# -- finding 1: the estimate read a loaded table and not a lazy one (fixed in the cost model) ----

@pytest.mark.parametrize("size", [8, 100])
def test_a_lazy_and_a_loaded_table_get_the_same_estimate(size):
    """ascend._fold_value used to fold a Constant's values whenever they were in memory, and a
    lazy one only when int32/int64 of at most 64 elements: a lazy 100-element table and its loaded
    copy gave different estimates (the Reshape after the Gather sized or not). It reads small
    integer tables now, on disk or in memory alike (8 elements: folded both ways; 100: neither)."""
    target = gp.Target.resolve(TARGET)
    graph, ts = _table_model(size)
    lazy = target.estimate(graph)
    ts["t1"].values  # noqa: B018 - loads it
    assert isinstance(ts["t1"]._values, np.ndarray)
    loaded = target.estimate(graph)
    assert loaded.total_us == lazy.total_us and loaded.assumed_dims == lazy.assumed_dims
    graph2, ts2 = _table_model(size)
    target.estimate(graph2)
    assert type(ts2["t1"]._values) is gs.ir.tensor.LazyValues  # the estimate did not load it for good
    folded = not any(d.startswith("r1_") for d in lazy.assumed_dims)
    assert folded == (size <= 64)
    assert I._same_constant(ts2["t1"], ts2["t2"])


@pytest.mark.parametrize("size", [8, 100])
def test_swapping_a_lazy_table_for_a_loaded_equal_one_keeps_the_estimate(size):
    graph, ts = _table_model(size)
    before = gp.Target.resolve(TARGET).estimate(graph).total_us
    veto, res = _run(graph, [_SwapsTable], check_incremental=True)  # raises when kept != fresh
    rec = res.records[0]
    assert rec.modified and not rec.rolled_back
    assert rec.cost_before_us == rec.cost_after_us == before
    # (the final cost is of the graph after the manager's shape refresh, which sizes r1 too)
    assert veto.final_cost == gp.Target.resolve(TARGET).estimate(graph).total_us


# -- finding 2: an engines-only application that loaded a weight -------------------------------

class _LoadsAndWritesEngines(Pass):
    """Scored; reads t1's values (gs's getter keeps the array: the weight is loaded) and writes
    the engines the kept estimate chose (place_and_sink's edit)."""

    name = "loads_and_writes_engines"
    summary = "engine annotations, and a weight read"
    kind = PassKind.PLACEMENT
    scored = True

    def run(self, graph, ctx):
        engines = ctx.placement[0]
        changed = 0
        graph.tensors()["t1"].values  # noqa: B018 - a read, not an edit (the journal says so)
        for n in graph.nodes:
            kept = engines.get(id(n))
            if kept is not None and A.get_engine(n) != kept[0]:
                A.set_engine(n, kept[0])
                changed += 1
        return PassResult(changed > 0)


@pytest.mark.parametrize("size", [8, 100])
def test_an_engines_only_application_that_loaded_a_weight_keeps_a_true_estimate(size):
    graph, ts = _table_model(size)
    veto, res = _run(graph, [_LoadsAndWritesEngines], check_incremental=True)  # raises when kept != fresh
    rec = res.records[0]
    assert rec.modified and not rec.rolled_back and rec.cost_after_us == rec.cost_before_us
    assert veto.final_cost == gp.Target.resolve(TARGET).estimate(graph).total_us


# -- finding 3 (not fixed: the documented blind spot of the journal) ----------------------------

class _EditsAttrsThenAnnotates(Pass):
    """Scored; edits a node's attrs dict in place (no hook sees it) before the first touch, then
    writes the engine the kept estimate chose on the same node. Before the skip, the annotation
    made the node touched and the incremental update walked it again (new attrs included)."""

    name = "edits_attrs_then_annotates"
    summary = "attrs edited in place, then an engine annotation"
    kind = PassKind.PLACEMENT
    scored = True

    def run(self, graph, ctx):
        node = graph.nodes[0]
        if A.get_engine(node) is not None:
            return PassResult(False)
        node.attrs["transB"] = 1  # a cost attribute: the Gemm's N is 4096 now, not 256
        A.set_engine(node, ctx.placement[0][id(node)][0])
        return PassResult(True)


@pytest.mark.xfail(strict=True, reason="the journal cannot see an in-place attrs edit made before the node's first touch "
                          "(documented in graphpass/ir/journal.py); the annotation-only skip then keeps a "
                          "stale estimate where the incremental update used to walk the node again")
def test_an_attrs_edit_the_journal_cannot_see_with_an_annotation():
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"])], {"x": [1024, 4096]}, {"y": [1024, 256]},
                       initializers={"w": np.ones((4096, 256), np.float32)})
    graph = gp.load(model).graph
    _run(graph, [_EditsAttrsThenAnnotates], check_incremental=True)


# -- finding 4: a weight loaded by an application, for the incremental update -------------------

class _LoadsAndEditsElsewhere(Pass):
    """Scored; loads t1 and makes an unrelated edit. The journal does not list t1 as changed (a
    load is not an edit): the estimate must not depend on the load (it did: the Gather folded a
    loaded table and not a lazy one, and the incremental update missed it)."""

    name = "loads_and_edits_elsewhere"
    summary = "a weight read and an unrelated edit"
    kind = PassKind.FUSION
    scored = True

    def run(self, graph, ctx):
        node = next(n for n in graph.nodes if n.op == "Softmax")
        if node.name == "renamed":
            return PassResult(False)
        graph.tensors()["t1"].values  # noqa: B018
        node.name = "renamed"
        return PassResult(True)


def test_a_weight_loaded_by_a_pass_is_seen_by_the_incremental_update():
    graph, _ = _table_model()
    veto, res = _run(graph, [_LoadsAndEditsElsewhere], check_incremental=True)  # raised: update != fresh
    assert res.records[0].modified or res.records[0].rolled_back


class _OnlyLoads(Pass):
    """Unscored; loads t1 and reports no change (a pass that read a weight and found nothing to do)."""

    name = "only_loads"
    summary = "a weight read"
    kind = PassKind.CLEANUP

    def run(self, graph, ctx):
        graph.tensors()["t1"].values  # noqa: B018
        return PassResult(False)


def test_a_weight_loaded_by_an_application_that_changed_nothing_is_followed():
    """A load is no change to the estimate: the kept state stays true, checked against a fresh
    estimate at the next scored application."""
    graph, _ = _table_model()
    veto, res = _run(graph, [_OnlyLoads, _LoadsAndEditsElsewhere], check_incremental=True)
    assert veto.final_cost == gp.Target.resolve(TARGET).estimate(graph).total_us


# -- attacks that found nothing (kept as guards) ------------------------------------------------

def test_a_skipped_swap_then_an_incremental_update_and_a_rollback_stay_true():
    """An equal swap (skipped: the incremental state keeps the old Constant in its entry), then a
    scored edit of the same node updated incrementally, then one that is vetoed and rolled back:
    each checked against a fresh estimate; the final cost is a fresh estimate's."""
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Add", ["a", "c2"], ["b"]),
                        helper.make_node("Relu", ["b"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]},
                       initializers={"c1": c, "c2": c.copy()})

    class Swap(Pass):
        name, summary, kind, scored = "swap_equal", "swap", PassKind.FUSION, True

        def run(self, graph, ctx):
            first, second = graph.nodes[:2]
            if second.inputs[1] is first.inputs[1]:
                return PassResult(False)
            second.inputs[1] = first.inputs[1]
            return PassResult(True)

    class ToSub(Pass):  # the second Add becomes a Sub: same price, estimated incrementally
        name, summary, kind, scored = "to_sub", "op", PassKind.FUSION, True

        def run(self, graph, ctx):
            n = graph.nodes[1]
            if n.op != "Add":
                return PassResult(False)
            n.op = "Sub"
            return PassResult(True)

    class Worse(Pass):  # Relu on AI CPU: dearer, vetoed
        name, summary, kind, scored = "worse", "engine", PassKind.PLACEMENT, True

        def run(self, graph, ctx):
            n = graph.nodes[2]
            if A.get_engine(n) == "AICPU":
                return PassResult(False)
            A.set_engine(n, "AICPU")
            return PassResult(True)

    graph = gp.load(model).graph
    veto, res = _run(graph, [Swap, ToSub, Worse], check_incremental=True)
    assert [r.modified for r in res.records[:3]] == [True, True, False]
    assert res.records[2].rolled_back
    assert graph.nodes[1].inputs[1] is graph.nodes[0].inputs[1]
    assert veto.final_cost == gp.Target.resolve(TARGET).estimate(graph).total_us


def test_the_journal_sees_a_constant_made_during_the_pass():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = make_model([helper.make_node("Add", ["x", "c1"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]},
                       initializers={"c1": c})
    graph = gp.load(model).graph
    with Journal(graph) as j:
        graph.nodes[0].inputs[1] = gs.Constant("c9", c.copy())
    assert j.constant_swaps() is None and j.annotation_edits() is None


def test_the_journal_sees_a_graph_output_swapped_between_constants():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = make_model([helper.make_node("Add", ["x", "c1"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]},
                       initializers={"c1": c})
    graph = gp.load(model).graph
    c1, c2 = graph.tensors()["c1"], gs.Constant("c2", c.copy())
    graph.outputs.append(c1)
    with Journal(graph) as j:
        graph.outputs[1] = c2
    assert j.constant_swaps() is None


def test_the_journal_sees_a_swap_in_a_subgraph_and_an_edit_beside_it():
    """A Constant swapped inside an If branch is a swap; with an attribute set beside it, not."""
    c = np.arange(4, dtype=np.float32)
    then_g = helper.make_graph([helper.make_node("Add", ["x", "k1"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", 1, [4])],
                               initializer=[numpy_helper.from_array(c, "k1")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", 1, [4])])
    model = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                       {"x": [4]}, {"y": [4]},
                       initializers={"cond": np.array(True)})
    graph = gp.load(model).graph
    body = graph.nodes[0].attrs["then_branch"]
    add = body.nodes[0]
    k2 = gs.Constant("k2", c.copy())
    with Journal(graph) as j:
        add.inputs[1] = k2
    swaps = j.constant_swaps()
    assert swaps is not None and swaps[0][0] is add and swaps[0][3] is k2
    j.rollback()
    with Journal(graph) as j:
        add.inputs[1] = k2
        graph.nodes[0].name = "renamed"
    assert j.constant_swaps() is None


def test_same_constant_does_not_load_large_lazy_weights():
    """CSE merges equal weights without loading them for good; the check after it should not
    load both again where the estimate reads neither (it took ~0.8 s for a 64 MB int8 pair)."""
    a = np.random.default_rng(0).integers(-128, 127, size=(1 << 20,), dtype=np.int8)
    ca = gs.Constant("a", gs.ir.tensor.LazyValues(numpy_helper.from_array(a, "a")))
    cb = gs.Constant("b", gs.ir.tensor.LazyValues(numpy_helper.from_array(a.copy(), "b")))
    loads = []
    real = gs.ir.tensor.LazyValues.load

    def counting(self):
        loads.append(self)
        return real(self)

    gs.ir.tensor.LazyValues.load = counting
    try:
        t0 = time.perf_counter()
        assert I._same_constant(ca, cb)
        assert time.perf_counter() - t0 < 0.5
    finally:
        gs.ir.tensor.LazyValues.load = real
    assert loads == []
    small = gs.Constant("s", gs.ir.tensor.LazyValues(numpy_helper.from_array(np.array([1, 2], np.int64), "s")))
    other = gs.Constant("o", np.array([1, 3], np.int64))
    assert not I._same_constant(small, other)  # read by the estimate: compared


# -- finding 5: values assigned to a lazy weight, taken for a load ------------------------------

def test_the_journal_sees_values_assigned_to_a_lazy_weight():
    """``c.values = a`` on a lazy weight, ``a`` of its shape: the old check took any array of the
    lazy form's shape for a load (no tensor changed, no node touched, nothing but the annotations
    or swaps). A load stays a read."""
    model = make_model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]},
                       initializers={"c": np.ones((2, 3), np.float32)})
    graph = gp.load(model).graph
    c = graph.tensors()["c"]
    assert type(c._values) is gs.ir.tensor.LazyValues
    with Journal(graph) as j:
        c.values = np.full((2, 3), 5, np.float32)
    assert j.changed_tensors() == [c] and j.touched_nodes() == [graph.nodes[0]]
    j.rollback()
    assert type(c._values) is gs.ir.tensor.LazyValues
    with Journal(graph) as j:  # saved first (its readers touched), then loaded: a read
        c.outputs[0].name = "add"
        c.values  # noqa: B018
    assert j.changed_tensors() == [] and isinstance(c._values, np.ndarray)
    j.rollback()
    assert type(c._values) is gs.ir.tensor.LazyValues


class _AssignsAndWritesEngines(Pass):
    """Scored; gives the lazy shape table t (8 elements: the estimate folds it) other values of its
    shape and writes the engines the kept estimate chose."""

    name = "assigns_and_writes_engines"
    summary = "a weight's values assigned, and engine annotations"
    kind = PassKind.PLACEMENT
    scored = True

    def run(self, graph, ctx):
        engines = ctx.placement[0]
        t = graph.tensors()["t"]
        if not isinstance(t._values, gs.ir.tensor.LazyValues):
            return PassResult(False)
        values = np.zeros(8, np.int64)
        values[2], values[3] = 4096, 16
        t.values = values
        for n in graph.nodes:
            kept = engines.get(id(n))
            if kept is not None and A.get_engine(n) != kept[0]:
                A.set_engine(n, kept[0])
        return PassResult(True)


def test_an_engines_only_application_that_assigned_a_weight_is_estimated(monkeypatch):
    said = []
    real = CostVeto._unchanged_estimate
    monkeypatch.setattr(CostVeto, "_unchanged_estimate", lambda self, j: said.append(real(self, j)) or said[-1])
    table = np.zeros(8, np.int64)
    table[2], table[3] = 1024, 64
    nodes = [helper.make_node("Gather", ["t", "i"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"])]
    model = make_model(nodes, {"x": [64, 1024]}, {"y": None}, initializers={"t": table, "i": np.array([2, 3], np.int64)})
    graph = gp.load(model).graph
    for name in ("r", "y"):
        graph.tensors()[name].shape = [f"{name}_a", f"{name}_b"]
    veto, res = _run(graph, [_AssignsAndWritesEngines], check_incremental=True)  # raises when kept != fresh
    assert res.records[0].modified
    assert said[0] is False  # the assigned values are an edit: estimated, not kept
    assert veto.final_cost == gp.Target.resolve(TARGET).estimate(graph).total_us


def test_a_lazy_and_a_loaded_float_weight_stay_alike():
    """Only integer values can size a shape: a lazy float weight and its loaded copy (CSE's common
    merge) still keep the estimate, and loading a float weight is not a reason to estimate."""
    w = np.arange(100, dtype=np.float32)
    lazy = gs.Constant("a", gs.ir.tensor.LazyValues(numpy_helper.from_array(w, "a")))
    assert I._same_constant(lazy, gs.Constant("b", w.copy()))
