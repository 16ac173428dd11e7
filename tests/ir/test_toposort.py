"""graphpass.ir.graph.toposort: the sorted check (asked after every pass that does not keep the
order, at load and at save) against its definition, on every order of small graphs; Kahn's
stable order; cycles and self-reads named; bodies reading outer tensors."""

import itertools
import random

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from graphpass.errors import BadModelError
from graphpass.ir.graph import _is_sorted, node_dependencies, subgraph_holders, toposort


def _sorted_by_definition(nodes):
    """No node reads (inputs, or what its bodies capture) a tensor a node at or after it writes."""
    writer = {}
    for i, n in enumerate(nodes):
        for t in n.outputs:
            writer[id(t)] = i
    return all(writer.get(id(t), -1) < i for i, n in enumerate(nodes) for t in node_dependencies(n))


def _check(nodes):
    producer_of = {id(t): i for i, n in enumerate(nodes) for t in n.outputs}
    g = gs.Graph(nodes=nodes)
    return _is_sorted(nodes, producer_of, subgraph_holders(g))


def _diamond_with_body():
    x = gs.Variable("x", np.float32, [2])
    a, b, c, d, y = (gs.Variable(n, np.float32, [2]) for n in "abcdy")
    cond = gs.Variable("cond", np.bool_, [])
    body_out = gs.Variable("body_out", np.float32, [2])
    body = gs.Graph(nodes=[gs.Node("Neg", inputs=[c], outputs=[body_out])], outputs=[body_out])  # captures c
    other = gs.Variable("other_out", np.float32, [2])
    else_body = gs.Graph(nodes=[gs.Node("Identity", inputs=[a], outputs=[other])], outputs=[other])
    nodes = [
        gs.Node("Relu", inputs=[x], outputs=[a]),
        gs.Node("Neg", inputs=[a], outputs=[b]),
        gs.Node("Abs", inputs=[a], outputs=[c]),
        gs.Node("If", inputs=[cond], outputs=[d], attrs={"then_branch": body, "else_branch": else_body}),
        gs.Node("Add", inputs=[b, d], outputs=[y]),
    ]
    return nodes


def test_the_sorted_check_agrees_with_its_definition_on_every_order():
    nodes = _diamond_with_body()
    seen = set()
    for order in itertools.permutations(range(len(nodes))):
        ordered = [nodes[i] for i in order]
        expected = _sorted_by_definition(ordered)
        seen.add(expected)
        assert _check(ordered) == expected, [n.op for n in ordered]
    assert seen == {True, False}


def test_toposort_sorts_stably_and_leaves_a_sorted_graph_alone():
    nodes = _diamond_with_body()
    rng = random.Random(0)
    for _ in range(20):
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        g = gs.Graph(nodes=shuffled)
        toposort(g)
        assert _sorted_by_definition(g.nodes) and sorted(map(id, g.nodes)) == sorted(map(id, nodes))
    g = gs.Graph(nodes=nodes[:])
    before = g.nodes
    toposort(g)
    assert g.nodes is before  # sorted already: the list is not replaced


def test_a_body_reading_a_later_tensor_is_not_sorted():
    nodes = _diamond_with_body()
    late = [nodes[0], nodes[1], nodes[3], nodes[2], nodes[4]]  # If (its body reads c) before Abs writes c
    assert not _check(late)
    g = gs.Graph(nodes=late)
    toposort(g)
    assert [n.op for n in g.nodes].index("Abs") < [n.op for n in g.nodes].index("If")


def test_a_self_read_and_a_cycle_are_named():
    a = gs.Variable("a", np.float32, [1])
    g = gs.Graph(nodes=[gs.Node("Neg", name="self", inputs=[a], outputs=[a])])
    assert not _check(g.nodes)
    with pytest.raises(BadModelError, match="reads its own output"):
        toposort(g)
    b, c = gs.Variable("b", np.float32, [1]), gs.Variable("c", np.float32, [1])
    g = gs.Graph(nodes=[gs.Node("Neg", name="n1", inputs=[b], outputs=[c]), gs.Node("Neg", name="n2", inputs=[c],
                                                                                     outputs=[b])])
    with pytest.raises(BadModelError, match="cycle"):
        toposort(g)


def test_a_tensor_written_twice_counts_its_last_writer():
    """Not SSA (a broken graph, or one a pass is in the middle of): the check reads the last
    writer's position, as Kahn's order does."""
    x, t, y = gs.Variable("x", np.float32, [1]), gs.Variable("t", np.float32, [1]), gs.Variable("y", np.float32, [1])
    first = gs.Node("Neg", inputs=[x], outputs=[t])
    reader = gs.Node("Abs", inputs=[t], outputs=[y])
    second = gs.Node("Relu", inputs=[x], outputs=[t])
    nodes = [first, reader, second]
    assert _check(nodes) == _sorted_by_definition(nodes) is False
