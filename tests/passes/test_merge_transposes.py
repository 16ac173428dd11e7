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


def test_a_transpose_without_perm_on_an_unknown_rank_is_refused_with_reason():
    from onnx import TensorProto

    from graphpass.passes.framework import PassContext

    model = make_model([helper.make_node("Transpose", ["x"], ["t"]),
                        helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
                        helper.make_node("Relu", ["u"], ["y"])],
                       {"x": (TensorProto.FLOAT, None)}, {"y": (TensorProto.FLOAT, None)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not merge_transposes(graph, ctx).modified and ops(graph) == ["Transpose", "Transpose", "Relu"]
    assert [e.reason for e in ctx.explanations] == [
        "a permutation is unknown (no perm and an unknown rank) or the ranks differ"]


def test_an_inverse_pair_writing_a_graph_output_leaves_one_identity_transpose():
    # the graph output keeps its producer (its name never changes)
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                        helper.make_node("Transpose", ["t"], ["y"], perm=[1, 0])],
                       {"x": [2, 3]}, {"y": [2, 3]})
    graph = gp.load(model).graph
    result = merge_transposes(graph)
    assert result.stats["merged"] == 1 and result.stats["identity_removed"] == 0
    assert ops(graph) == ["Transpose"] and list(graph.nodes[0].attrs["perm"]) == [0, 1]
    assert graph.nodes[0].outputs[0].name == "y" and graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_composed_non_identity_pair_read_inside_keeps_one_transpose():
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                        helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
                        helper.make_node("Relu", ["u"], ["y"])],
                       {"x": [2, 3, 4]}, {"y": [3, 4, 2]})
    graph = gp.load(model).graph
    result = merge_transposes(graph)
    assert result.stats["merged"] == 1 and result.stats["identity_removed"] == 0
    assert ops(graph) == ["Transpose", "Relu"] and list(graph.nodes[0].attrs["perm"]) == [1, 2, 0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_single_identity_transpose_is_removed_unless_it_writes_a_graph_output():
    for perm in ([0, 1, 2], None):  # None: no perm on a rank-1 input is the identity too
        shape = [2, 3, 4] if perm else [5]
        attrs = {"perm": perm} if perm else {}
        model = make_model([helper.make_node("Transpose", ["x"], ["t"], **attrs),
                            helper.make_node("Relu", ["t"], ["y"])], {"x": shape}, {"y": shape})
        graph = gp.load(model).graph
        result = merge_transposes(graph)
        assert result.stats["identity_removed"] == 1 and ops(graph) == ["Relu"]
        assert graph.nodes[0].inputs[0] is graph.inputs[0]
        assert_equivalent(model, gp.to_proto(graph), exact=True)
    model = make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1])], {"x": [2, 3]}, {"y": [2, 3]})
    graph = gp.load(model).graph
    assert not merge_transposes(graph).modified and ops(graph) == ["Transpose"]
