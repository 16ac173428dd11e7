import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import eliminate_dead_nodes
from graphpass.testing import assert_equivalent, make_model, ops


def test_removes_unused_chain_and_keeps_outputs():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"]),
         helper.make_node("Sigmoid", ["x"], ["dead1"]),
         helper.make_node("Tanh", ["dead1"], ["dead2"])],
        {"x": [3]}, {"y": [3]},
    )
    graph = gp.load(model).graph
    result = eliminate_dead_nodes(graph)
    assert result.modified and result.stats["removed"] == 2
    assert ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_nothing_dead_means_no_change():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    assert not eliminate_dead_nodes(graph).modified


def test_keeps_unused_graph_inputs_unless_asked():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [3], "unused": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    eliminate_dead_nodes(graph)
    assert [t.name for t in graph.inputs] == ["x", "unused"]
    result = eliminate_dead_nodes(graph, remove_unused_inputs=True)
    assert result.stats["inputs_removed"] == 1
    assert [t.name for t in graph.inputs] == ["x"]


def _loop_reading(outer: str, dead_in_body: bool):
    nodes = [helper.make_node("Add", ["acc_in", outer], ["acc_out"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if dead_in_body:
        nodes.append(helper.make_node("Neg", ["acc_in"], ["unused_in_body"]))
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2])],
    )


def test_outer_producer_used_only_by_a_loop_body_is_live():
    model = make_model(
        [helper.make_node("Exp", ["x"], ["outer"]),
         helper.make_node("Loop", ["n", "", "x"], ["y"], body=_loop_reading("outer", dead_in_body=True))],
        {"x": [2]}, {"y": [2]}, initializers={"n": np.array(2, np.int64)},
    )
    graph = gp.load(model).graph
    result = eliminate_dead_nodes(graph)
    assert result.stats["removed"] == 1  # only the Neg inside the body
    assert ops(graph) == ["Exp", "Loop"]
    assert sorted(n.op for n in graph.nodes[1].attrs["body"].nodes) == ["Add", "Identity"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def _random_dag(seed: int, n: int = 12):
    """A DAG of n unary/binary nodes over one input, a few graph outputs, some dead branches."""
    import random

    import onnx_graphsurgeon as gs

    rng = random.Random(seed)
    x = gs.Variable("x", np.float32, [2])
    tensors = [x]
    nodes = []
    for i in range(n):
        ins = rng.sample(tensors, k=min(len(tensors), rng.choice((1, 2))))
        out = gs.Variable(f"t{i}", np.float32, [2])
        nodes.append(gs.Node("Add" if len(ins) == 2 else "Neg", name=f"n{i}", inputs=ins, outputs=[out]))
        tensors.append(out)
    outputs = rng.sample(tensors[1:], k=rng.choice((1, 2)))
    return gs.Graph(nodes=nodes, inputs=[x], outputs=outputs), rng


def test_the_sweep_finds_what_the_search_finds_or_defers_to_it():
    """The reverse sweep's dead nodes are the search's on every sorted graph; on a shuffled one it
    either agrees or says it cannot tell (never a live node called dead)."""
    from graphpass.passes.cleanup.eliminate_dead_nodes import _dead_by_search, _dead_by_sweep

    deferred = 0
    for seed in range(200):
        graph, rng = _random_dag(seed)
        truth = {id(n) for n in _dead_by_search(graph)}
        assert {id(n) for n in _dead_by_sweep(graph)} == truth, seed
        shuffled = graph.nodes[:]
        rng.shuffle(shuffled)
        graph.nodes = shuffled
        swept = _dead_by_sweep(graph)
        if swept is None:
            deferred += 1
        else:
            assert {id(n) for n in swept} == truth, seed
        assert {id(n) for n in _dead_by_search(graph)} == truth
    assert deferred  # some shuffles put a live reader before its writer


def test_an_unnamed_output_is_left_to_the_search():
    import onnx_graphsurgeon as gs

    from graphpass.passes.cleanup.eliminate_dead_nodes import _dead_by_sweep

    x, y, empty = gs.Variable("x", np.float32, [2]), gs.Variable("y", np.float32, [2]), gs.Variable.empty()
    graph = gs.Graph(nodes=[gs.Node("Neg", inputs=[x], outputs=[empty]), gs.Node("Abs", inputs=[x], outputs=[y])],
                     inputs=[x], outputs=[y])
    assert _dead_by_sweep(graph) is None
    assert eliminate_dead_nodes(graph).stats["removed"] == 1 and ops(graph) == ["Abs"]


def test_out_of_order_nodes_are_cleaned_by_the_search():
    """A live node listed before the node it reads (a graph a pass left unsorted): nothing live goes."""
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"]),
         helper.make_node("Sigmoid", ["x"], ["dead"])],
        {"x": [3]}, {"y": [3]},
    )
    graph = gp.load(model).graph
    graph.nodes = [graph.nodes[1], graph.nodes[2], graph.nodes[0]]  # Neg before the Relu it reads
    result = eliminate_dead_nodes(graph)
    assert result.stats["removed"] == 1 and sorted(ops(graph)) == ["Neg", "Relu"]
