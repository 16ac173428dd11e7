"""graphpass.ir.lean: gs's per-node lists with __slots__ behave exactly as gs's own."""

import copy
import sys

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx_graphsurgeon.util import misc

from graphpass.ir import lean


def _script(make):
    """Every list operation gs's lists have, on a small graph built with list class ``make``;
    the resulting wiring (names on each side) and the values the operations returned."""
    saved = misc.SynchronizedList
    misc.SynchronizedList = make
    try:
        a, b, c, d = (gs.Variable(n, dtype=np.float32) for n in "abcd")
        w = gs.Constant("w", np.ones(2, np.float32))
        n1 = gs.Node("Add", inputs=[a, w], outputs=[b])
        n2 = gs.Node("Relu", inputs=[b], outputs=[c])
        n3 = gs.Node("Mul", inputs=[], outputs=[])
        assert type(n1.inputs) is make and type(a.outputs) is make
        got = []
        n3.inputs.append(c)
        n3.inputs.extend([w, a])
        n3.inputs.insert(1, b)
        got.append(n3.inputs.pop())
        got.append(n3.inputs.pop(0))
        n3.inputs.remove(w)
        n3.outputs.append(d)
        n3.inputs[0] = a
        del n1.inputs[1]
        n3.inputs += [c]
        got.append([t.name for t in n3.inputs + [w]])
        got.append(type(copy.copy(n2.inputs)).__name__ + type(copy.deepcopy(n2.outputs)).__name__)
        n2.outputs.clear()
        nodes, tensors = [n1, n2, n3], [a, b, c, d, w]
        wiring = ([[t.name for t in n.inputs] + ["|"] + [t.name for t in n.outputs] for n in nodes],
                  [[n.op for n in t.inputs] + ["|"] + [n.op for n in t.outputs] for t in tensors])
        with pytest.raises(ValueError):
            n3.inputs.remove(d)  # not there: list's own error, nothing changed
        return wiring, got
    finally:
        misc.SynchronizedList = saved


def test_the_lean_list_wires_a_graph_as_gs_does():
    assert lean.installed()  # importing graphpass.ir installed it
    assert _script(lean._ORIGINAL) == _script(lean.SyncList)


def test_the_lean_list_holds_no_instance_dict_and_is_smaller():
    a = gs.Variable("a")
    node = gs.Node("Relu", inputs=[a], outputs=[gs.Variable("b")])
    assert type(node.inputs) is lean.SyncList and not hasattr(node.inputs, "__dict__")
    old = lean._ORIGINAL(node, "outputs", [])
    lean_size = sys.getsizeof(node.inputs)
    assert sys.getsizeof(old) + sys.getsizeof(old.__dict__) > lean_size + 64


def test_install_keeps_a_gs_list_it_does_not_mirror(monkeypatch):
    class Other(list):
        def __init__(self, parent_obj, field_name, initial):
            super().__init__(initial)

        def sort_by_name(self):
            pass

    monkeypatch.setattr(lean, "_ORIGINAL", Other)
    monkeypatch.setattr(misc, "SynchronizedList", Other)
    assert lean.install() is False and misc.SynchronizedList is Other


def test_the_inferred_copy_is_not_kept_through_the_import(monkeypatch):
    """from_proto copied inference's value_info into the model and then kept inference's whole
    copy of the graph alive while gs built the IR beside it (+160 MB of peak at 100k nodes)."""
    import onnx
    from onnx import helper

    from graphpass.ir import serialize
    from graphpass.testing import make_model

    model = make_model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                       {"x": [2, 3]}, {"y": [2, 3]})
    held = []
    real = serialize.gs.import_onnx

    def import_onnx(proto):
        caller = sys._getframe(1).f_locals
        held.extend(v for v in caller.values() if isinstance(v, onnx.ModelProto) and v is not proto)
        return real(proto)

    monkeypatch.setattr(serialize.gs, "import_onnx", import_onnx)
    graph = serialize.from_proto(model)
    assert held == []
    assert graph.nodes[0].outputs[0].shape == [2, 3]  # the inferred shapes did arrive


def test_unlinking_a_node_finds_it_by_identity_not_by_structure(monkeypatch):
    """Issue 22: a tensor read by many nodes (a constant shared after CSE) made every edit of one
    reader compare it structurally (gs's Node.__eq__) with the readers before it; and of two
    structurally equal readers, list.remove took the first, not the one edited."""
    import onnx_graphsurgeon as gs

    from graphpass.ir import lean

    assert lean.installed()
    shared = gs.Variable("x", dtype=None)
    readers = [gs.Node("Relu", inputs=[shared], outputs=[gs.Variable(f"y{i}")]) for i in range(200)]
    twin = gs.Node("Relu", inputs=[shared], outputs=readers[0].outputs)  # equal to readers[0] by structure
    calls = []
    real = gs.Node.__eq__
    monkeypatch.setattr(gs.Node, "__eq__", lambda a, b: calls.append(1) or real(a, b))
    readers[-1].inputs.clear()
    twin.inputs.clear()
    assert calls == []
    assert readers[-1] not in list(shared.outputs) and twin not in [n for n in shared.outputs if n is twin]
    assert any(n is readers[0] for n in shared.outputs)  # the equal twin's removal left readers[0] in place
    assert len(shared.outputs) == 199


def _identity_chain():
    from onnx import helper

    from graphpass.testing import make_model

    return make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
                       helper.make_node("Relu", ["b"], ["y"])], {"x": [4]}, {"y": [4]})


def test_a_big_run_hands_what_it_removed_to_reference_counting(monkeypatch):
    """A pipeline over a big graph frees the nodes and tensors it removed by reference counting
    (lean.release), not by a full collection of the caller's heap: with the collector off, the
    removed Identity and its output are gone after the run; the output is the same."""
    import gc
    import weakref

    import graphpass as gp
    from graphpass.passes.framework import PassManager
    from graphpass.passes.framework import manager as M

    monkeypatch.setattr(M, "_RELEASE_NODES", 0)  # this small graph counts as big
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    model = gp.load(_identity_chain())
    ident = next(n for n in model.graph.nodes if n.op == "Identity")
    gone = [weakref.ref(ident), weakref.ref(ident.outputs[0])]
    del ident
    was = gc.isenabled()
    gc.disable()
    try:
        result = PassManager(["eliminate_identity"])(model)
        assert result.modified and [n.op for n in model.graph.nodes] == ["Relu", "Relu"]
        assert [r() for r in gone] == [None, None]
        assert calls == []  # no closing full collection
    finally:
        if was:
            gc.enable()
    relu2 = model.graph.nodes[1]
    assert relu2.inputs[0].name == "a" and type(relu2.inputs) is lean.SyncList


def test_release_leaves_a_removed_object_someone_holds_readable():
    """An object released (removed from the graph, connected to nothing) keeps working for a
    reader that still holds it: its inputs and outputs are empty plain lists."""
    import graphpass as gp
    from graphpass.ir.journal import all_graphs

    model = gp.load(_identity_chain())
    graph = model.graph
    before = lean.members(all_graphs(graph))
    ident = next(n for n in graph.nodes if n.op == "Identity")
    kept = graph.nodes[0]  # still in the graph: untouched
    out = ident.outputs[0]
    graph.nodes[2].inputs[0] = ident.inputs[0]
    ident.inputs.clear()
    ident.outputs.clear()
    graph.nodes.remove(ident)
    assert lean.release(before, all_graphs(graph)) == 2  # the Identity and its output
    assert ident.inputs == [] and ident.outputs == [] and out.inputs == [] and out.outputs == []
    assert type(kept.inputs) is lean.SyncList and kept.outputs[0].outputs[0] is graph.nodes[1]
