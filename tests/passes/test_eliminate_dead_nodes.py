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
