import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import eliminate_identity
from graphpass.testing import assert_equivalent, make_model, ops


def test_internal_identity_removed():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
                        helper.make_node("Neg", ["b"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model)
    result = eliminate_identity(graph)
    assert result.modified and result.stats["identity"] == 1
    assert ops(graph) == ["Relu", "Neg"]
    assert graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_identity_at_graph_output_renames_producer_output():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model)
    eliminate_identity(graph)
    assert ops(graph) == ["Relu"]
    assert graph.nodes[0].outputs[0].name == "y"
    assert [t.name for t in graph.outputs] == ["y"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_identity_from_graph_input_to_output_is_kept():
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model)
    result = eliminate_identity(graph)
    assert not result.modified and result.stats["kept_at_output"] == 1
    assert ops(graph) == ["Identity"]


def test_inference_dropout_removed_training_dropout_kept():
    model = make_model(
        [helper.make_node("Dropout", ["x"], ["d"]), helper.make_node("Neg", ["d"], ["y"]),
         helper.make_node("Dropout", ["x", "ratio", "train"], ["d2"]), helper.make_node("Neg", ["d2"], ["y2"])],
        {"x": [3]}, {"y": [3], "y2": [3]},
        initializers={"ratio": np.array(0.0, np.float32), "train": np.array(True)},
        opset=13,
    )
    graph = gp.load(model)
    result = eliminate_identity(graph)
    assert result.stats["dropout"] == 1
    assert ops(graph).count("Dropout") == 1
    kept = next(n for n in graph.nodes if n.op == "Dropout")
    assert kept.inputs[2].name == "train"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_dropout_with_used_mask_is_kept():
    model = make_model([helper.make_node("Dropout", ["x"], ["d", "mask"])], {"x": [3]},
                       {"d": [3], "mask": (TensorProto.BOOL, [3])}, opset=13)
    graph = gp.load(model)
    assert not eliminate_identity(graph).modified


def test_neutral_elements_are_removed():
    inits = {"one": np.ones((1, 3, 1), np.float32), "zero": np.zeros((), np.float32), "one_s": np.array(1.0, np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "one"], ["a"]),
             helper.make_node("Add", ["zero", "a"], ["b"]), helper.make_node("Div", ["b", "one_s"], ["c"]),
             helper.make_node("Sub", ["c", "zero"], ["y"])]
    model = make_model(nodes, {"x": [2, 3, 4]}, {"y": [2, 3, 4]}, initializers=inits)
    graph = gp.load(model)
    res = eliminate_identity(graph)
    assert res.stats["neutral"] == 4 and ops(graph) == ["Relu"]
    assert graph.nodes[0].outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_neutral_element_that_broadcasts_or_is_not_neutral_is_kept():
    inits = {"one": np.ones((2, 3, 4), np.float32), "two": np.full((), 2.0, np.float32), "zero": np.zeros((), np.float32)}
    nodes = [helper.make_node("Mul", ["x", "one"], ["a"]),      # broadcasts x [3, 4] to [2, 3, 4]
             helper.make_node("Mul", ["a", "two"], ["b"]),      # not a neutral element
             helper.make_node("Sub", ["zero", "b"], ["y"])]     # 0 - b is a negation
    model = make_model(nodes, {"x": [3, 4]}, {"y": [2, 3, 4]}, initializers=inits)
    graph = gp.load(model)
    assert not eliminate_identity(graph).modified
    assert ops(graph) == ["Mul", "Mul", "Sub"]
