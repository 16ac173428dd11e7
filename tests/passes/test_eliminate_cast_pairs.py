import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import eliminate_cast_pairs
from graphpass.testing import assert_equivalent, make_model, ops

F16, F32, I32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def test_widening_round_trip_removed():
    model = make_model([helper.make_node("Cast", ["x"], ["a"], to=F32), helper.make_node("Cast", ["a"], ["b"], to=F16),
                        helper.make_node("Neg", ["b"], ["y"])],
                       {"x": (F16, [4])}, {"y": (F16, [4])})
    graph = gp.load(model).graph
    result = eliminate_cast_pairs(graph)
    assert result.modified and result.stats["casts_removed"] == 2
    assert ops(graph) == ["Neg"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_narrowing_round_trip_is_not_a_noop_and_is_kept():
    model = make_model([helper.make_node("Cast", ["x"], ["a"], to=F16), helper.make_node("Cast", ["a"], ["y"], to=F32)],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    assert not eliminate_cast_pairs(graph).modified
    assert ops(graph) == ["Cast", "Cast"]
    # and the pair really does change values: removing it would have been wrong
    from graphpass.testing import ort_run
    x = np.array([0.1, 1e-8, 70000.0, 3.14159], np.float32)
    assert not np.array_equal(ort_run(model, {"x": x})["y"], x)


def test_exact_then_other_becomes_one_cast():
    model = make_model([helper.make_node("Cast", ["x"], ["a"], to=I64), helper.make_node("Cast", ["a"], ["y"], to=F32)],
                       {"x": (I32, [4])}, {"y": [4]})
    graph = gp.load(model).graph
    eliminate_cast_pairs(graph)
    assert ops(graph) == ["Cast"]
    assert graph.nodes[0].attrs["to"] == F32 and graph.nodes[0].inputs[0] is graph.inputs[0]
    feeds = {"x": np.array([1, -7, 2**24 + 1, 5], np.int32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


def test_cast_to_own_type_removed():
    model = make_model([helper.make_node("Cast", ["x"], ["a"], to=F32), helper.make_node("Neg", ["a"], ["y"])],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    eliminate_cast_pairs(graph)
    assert ops(graph) == ["Neg"]


def test_pair_merged_while_the_first_cast_is_read_elsewhere():
    """fp16 -> fp32 -> fp16 writing a graph output, the fp32 tensor also read by a Relu: the
    second Cast reads x directly, the first stays (found by benchmarks/mutation.py: the merge
    was counted by no test, so a pass that changed the graph could claim it did not)."""
    model = make_model([helper.make_node("Cast", ["x"], ["t"], to=TensorProto.FLOAT),
                        helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT16),
                        helper.make_node("Relu", ["t"], ["z"])],
                       {"x": (F16, [3])}, {"y": (F16, [3]), "z": [3]})
    graph = gp.load(model).graph
    result = eliminate_cast_pairs(graph)
    assert result.modified and result.stats["pairs_merged"] == 1
    second = next(n for n in graph.nodes if n.outputs[0].name == "y")
    assert second.inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_pair_that_is_not_a_round_trip_says_why():
    from graphpass.passes.framework import PassContext

    model = make_model([helper.make_node("Cast", ["x"], ["a"], to=F16), helper.make_node("Cast", ["a"], ["y"], to=F32)],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model)
    ctx = PassContext()
    result = eliminate_cast_pairs(graph, ctx)
    assert not result.modified and result.stats["rules"]["pair"] == {"matched": 1, "refused": 1, "rewritten": 0,
                                                                      "removed": 0, "created": 0}
    assert [(e.pass_name, e.reason) for e in ctx.explanations] == [
        ("eliminate_cast_pairs", "Cast FLOAT -> FLOAT16 is not exact (it rounds or wraps): the pair is not a round trip")]


def _explained(graph):
    from graphpass.passes.framework import PassContext

    ctx = PassContext()
    result = eliminate_cast_pairs(graph, ctx)
    return result, [e.reason for e in ctx.explanations]


def test_a_pair_whose_input_type_is_unknown_is_refused_with_reason():
    # an input of unknown type (a graph built in memory): whether A -> B is exact is unknown
    import onnx_graphsurgeon as gs

    x, a, y = gs.Variable("x"), gs.Variable("a", dtype=np.float64), gs.Variable("y", dtype=np.float32)
    graph = gs.Graph(nodes=[gs.Node("Cast", inputs=[x], outputs=[a], attrs={"to": TensorProto.DOUBLE}),
                            gs.Node("Cast", inputs=[a], outputs=[y], attrs={"to": TensorProto.FLOAT})],
                     inputs=[x], outputs=[y], opset=17)
    result, reasons = _explained(graph)
    assert not result.modified and ops(graph) == ["Cast", "Cast"]
    assert reasons == ["the first Cast's input type is unknown"]


def test_a_cast_without_to_is_refused_not_crashed_on():
    import onnx_graphsurgeon as gs

    x, a, y = gs.Variable("x", dtype=np.float16), gs.Variable("a", dtype=np.float32), gs.Variable("y", dtype=np.float16)
    graph = gs.Graph(nodes=[gs.Node("Cast", inputs=[x], outputs=[a], attrs={"to": TensorProto.FLOAT}),
                            gs.Node("Cast", inputs=[a], outputs=[y])],
                     inputs=[x], outputs=[y], opset=17)
    result, reasons = _explained(graph)
    assert not result.modified and ops(graph) == ["Cast", "Cast"]
    assert reasons == ["a Cast without 'to'"]
