import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.passes import eliminate_common_subexpressions
from graphpass.testing import assert_equivalent, make_model, ops


def test_duplicate_chains_merge():
    model = make_model([helper.make_node("Relu", ["x"], ["a1"]), helper.make_node("Relu", ["x"], ["a2"]),
                        helper.make_node("Exp", ["a1"], ["b1"]), helper.make_node("Exp", ["a2"], ["b2"]),
                        helper.make_node("Add", ["b1", "b2"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert result.modified and result.stats["nodes_merged"] == 2
    assert ops(graph) == ["Relu", "Exp", "Add"]
    add = graph.nodes[-1]
    assert add.inputs[0] is add.inputs[1]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_different_attributes_do_not_merge():
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
                        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
                        helper.make_node("Add", ["a", "b"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified


def test_random_ops_and_graph_outputs_never_merge():
    model = make_model([helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=1.0),
                        helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0),
                        helper.make_node("Neg", ["x"], ["y1"]), helper.make_node("Neg", ["x"], ["y2"])],
                       {"x": [3]}, {"r1": [3], "r2": [3], "y1": [3], "y2": [3]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    assert ops(graph).count("RandomUniformLike") == 2 and ops(graph).count("Neg") == 2


def test_equal_constants_merge_then_nodes_merge():
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Add", ["x", "c2"], ["b"]),
                        helper.make_node("Mul", ["a", "b"], ["y"])],
                       {"x": [3]}, {"y": [3]},
                       initializers={"c1": np.array([1, 2, 3], np.float32), "c2": np.array([1, 2, 3], np.float32)})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert result.stats["constants_merged"] == 1 and result.stats["nodes_merged"] == 1
    assert ops(graph) == ["Add", "Mul"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_duplicates_with_list_attributes_merge():
    model = make_model([helper.make_node("Transpose", ["x"], ["a"], perm=[1, 0]),
                        helper.make_node("Transpose", ["x"], ["b"], perm=[1, 0]),
                        helper.make_node("Add", ["a", "b"], ["y"])],
                       {"x": [2, 3]}, {"y": [3, 2]})
    graph = gp.load(model).graph
    assert eliminate_common_subexpressions(graph).stats["nodes_merged"] == 1
    assert ops(graph) == ["Transpose", "Add"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_float_attributes_differing_only_in_the_sign_of_zero_do_not_merge():
    # LeakyRelu(alpha=0.0) of a negative x is -0.0, with alpha=-0.0 it is +0.0: not the same node
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.0),
                        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=-0.0),
                        helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
                       {"x": [3]}, {"y": [6]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    out = assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.array([-1.0, 2.0, -0.0], np.float32)}, exact=True)
    assert np.signbit(out["y"][0]) != np.signbit(out["y"][3])


def test_random_ops_never_merge():
    model = make_model([helper.make_node("RandomUniformLike", ["x"], ["a"]),
                        helper.make_node("RandomUniformLike", ["x"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["y"])],
                       {"x": [64]}, {"y": [64]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    assert ops(graph).count("RandomUniformLike") == 2


def test_nodes_reading_different_tensors_do_not_merge():
    # same op, same attributes, other inputs (or the same inputs in another order): not duplicates
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["z"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["s1"]), helper.make_node("Sub", ["b", "a"], ["s2"]),
                        helper.make_node("Add", ["s1", "s2"], ["y"])],
                       {"x": [3], "z": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert not result.modified and result.stats["nodes_merged"] == 0
    assert ops(graph) == ["Relu", "Relu", "Sub", "Sub", "Add"]
    feeds = {"x": np.array([1.0, -0.0, np.nan], np.float32), "z": np.array([2.0, 0.0, -np.inf], np.float32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)
