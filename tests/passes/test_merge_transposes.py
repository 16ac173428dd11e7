from onnx import helper

import graphpass as gp
from graphpass.passes import merge_transposes
from graphpass.testing import assert_equivalent, make_model, ops


def test_inverse_pair_cancels():
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                        helper.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
                        helper.make_node("Relu", ["u"], ["y"])],
                       {"x": [1, 2, 3, 4]}, {"y": [1, 2, 3, 4]})
    graph = gp.load(model).graph
    result = merge_transposes(graph)
    assert result.modified and result.stats["identity_removed"] == 1
    assert ops(graph) == ["Relu"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_composes_into_one_transpose():
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                        helper.make_node("Transpose", ["t"], ["y"], perm=[0, 2, 1])],
                       {"x": [2, 3, 4]}, {"y": [3, 4, 2]})
    graph = gp.load(model).graph
    merge_transposes(graph)
    assert ops(graph) == ["Transpose"]
    assert list(graph.nodes[0].attrs["perm"]) == [1, 2, 0]
    assert graph.nodes[0].outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_first_transpose_kept_when_read_elsewhere():
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                        helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
                        helper.make_node("Add", ["u", "x"], ["y"]),
                        helper.make_node("Relu", ["t"], ["z"])],
                       {"x": [2, 3]}, {"y": [2, 3], "z": [3, 2]})
    graph = gp.load(model).graph
    merge_transposes(graph)
    assert sorted(ops(graph)) == ["Add", "Relu", "Transpose"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_single_non_identity_transpose_untouched():
    model = make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], {"x": [2, 3]}, {"y": [3, 2]})
    graph = gp.load(model).graph
    assert not merge_transposes(graph).modified


def test_default_perm_reverses_the_axes():
    """A Transpose without ``perm`` reverses the axes; two of them cancel (found by
    benchmarks/mutation.py: no test had a Transpose without perm)."""
    model = make_model([helper.make_node("Transpose", ["x"], ["t"]),
                        helper.make_node("Transpose", ["t"], ["u"], perm=[2, 1, 0]),
                        helper.make_node("Relu", ["u"], ["y"])],
                       {"x": [2, 3, 4]}, {"y": [2, 3, 4]})
    graph = gp.load(model).graph
    result = merge_transposes(graph)
    assert result.modified and result.stats["identity_removed"] == 1
    assert ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)
