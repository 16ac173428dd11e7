"""The import notes a node that writes a tensor an earlier node (or itself) reads
(fast_import.Made.unsorted): without the note every graph it imported is in topological order,
so the loader skips toposort's walk for a model without bodies; with it (and for bodies) the
graph is sorted as before: out-of-order nodes come out sorted, a cycle or a node reading its own
output is refused as before."""

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from _files import FILES, loaded  # noqa: E402 - tests/ir/_files.py
from graphpass.errors import BadModelError
from graphpass.ir import fast_import, serialize
from graphpass.ir.graph import _is_sorted, iter_graphs, subgraph_holders


def _sorted(g):
    producer_of = {id(t): i for i, n in enumerate(g.nodes) for t in n.outputs}
    return _is_sorted(g.nodes, producer_of, subgraph_holders(g))


def test_no_note_means_every_graph_is_sorted_on_the_corpus():
    seen = noted = 0
    for path, m in loaded(FILES):
        made = fast_import.Made()
        try:
            graph = fast_import.import_onnx(m, made)
        except Exception:  # noqa: BLE001 - a model the import refuses
            continue
        seen += 1
        if not made.unsorted:
            assert all(_sorted(g) for g in iter_graphs(graph)), path
        else:
            noted += 1
    assert seen > 100


def _model(order, value_info=True):
    nodes = {"a": h.make_node("Relu", ["x"], ["a"], name="a"), "b": h.make_node("Neg", ["a"], ["b"], name="b"),
             "c": h.make_node("Abs", ["b"], ["y"], name="c")}
    vis = [h.make_tensor_value_info(n, T.FLOAT, [2]) for n in ("a", "b")] if value_info else []
    g = h.make_graph([nodes[k] for k in order], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])], value_info=vis)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("value_info", [True, False])
@pytest.mark.parametrize("order", ["abc", "bac", "cba", "acb"])
def test_out_of_order_nodes_are_noted_and_sorted(order, value_info):
    m = _model(order, value_info)
    made = fast_import.Made()
    fast_import.import_onnx(m, made)
    assert made.unsorted == (order != "abc")
    graph = serialize.load(m.SerializeToString())
    assert [n.name for n in graph.nodes] == ["a", "b", "c"]


def test_a_cycle_and_a_node_reading_its_own_output_are_refused_as_before():
    g = h.make_graph([h.make_node("Add", ["x", "b"], ["a"], name="p"), h.make_node("Neg", ["a"], ["b"], name="q"),
                      h.make_node("Abs", ["a"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    made = fast_import.Made()
    fast_import.import_onnx(m, made)
    assert made.unsorted
    graph = fast_import.import_onnx(m)
    from graphpass.ir.graph import toposort

    with pytest.raises(BadModelError, match="cycle"):
        toposort(graph)
    own = onnx.ModelProto()
    own.CopyFrom(m)
    del own.graph.node[:]
    own.graph.node.extend([h.make_node("Add", ["x", "a"], ["a"], name="self"), h.make_node("Abs", ["a"], ["y"])])
    made = fast_import.Made()
    graph = fast_import.import_onnx(own, made)
    assert made.unsorted
    with pytest.raises(BadModelError, match="reads its own output"):
        toposort(graph)
