import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.infra import PassContext
from graphpass.passes import hoist_loop_invariants
from graphpass.testing import assert_equivalent, make_model, ops

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _body(nodes, carried="acc", extra_outputs=()):
    return helper.make_graph(
        nodes + [helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info(f"{carried}_in", F, [4])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info(f"{carried}_out", F, [4])]
        + [helper.make_tensor_value_info(n, F, [4]) for n in extra_outputs],
    )


def _loop_model(body, trips=3, dynamic_trips=False, scan_outputs=()):
    inputs = {"x": [4], "w": [4]}
    inits = {}
    if dynamic_trips:
        inputs["n"] = (I64, [])
    else:
        inits["n"] = np.array(trips, np.int64)
    outs = ["y"] + list(scan_outputs)
    return make_model([helper.make_node("Loop", ["n", "", "x"], outs, body=body, name="loop")], inputs,
                      {"y": [4], **{s: [trips, 4] for s in scan_outputs}}, initializers=inits)


def _invariant_body():
    # s = exp(w) * 2 is invariant (outer value, constant); acc_out = acc_in + s is not
    return _body([helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", F, [], [2.0])),
                  helper.make_node("Exp", ["w"], ["e"], name="exp"),
                  helper.make_node("Mul", ["e", "two"], ["s"], name="scale"),
                  helper.make_node("Add", ["acc_in", "s"], ["acc_out"], name="accumulate")])


def test_invariant_chain_leaves_the_body():
    model = _loop_model(_invariant_body())
    graph = gp.load(model)
    result = hoist_loop_invariants(graph)
    assert result.stats["hoisted"] >= 2
    assert ops(graph)[-1] == "Loop" and {"Exp", "Mul"} <= set(ops(graph))
    body_ops = sorted(n.op for n in graph.nodes[-1].attrs["body"].nodes)
    assert body_ops == ["Add", "Identity"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_loop_carried_and_random_values_stay():
    body = _body([helper.make_node("RandomUniformLike", ["w"], ["r"], seed=1.0),
                  helper.make_node("Mul", ["acc_in", "w"], ["m"]),
                  helper.make_node("Add", ["m", "r"], ["acc_out"])])
    graph = gp.load(_loop_model(body))
    assert not hoist_loop_invariants(graph).modified


def test_nested_loops_hoist_through_both_levels():
    inner = _body([helper.make_node("Neg", ["w"], ["nw"], name="neg"), helper.make_node("Add", ["acc_in", "nw"], ["acc_out"])],
                  carried="acc")
    outer = _body([helper.make_node("Loop", ["n2", "", "acc_in"], ["acc_out"], body=inner, name="inner")], carried="acc")
    model = make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=outer, name="outer")], {"x": [4], "w": [4]},
                       {"y": [4]}, initializers={"n": np.array(3, np.int64), "n2": np.array(2, np.int64)})
    graph = gp.load(model)
    hoist_loop_invariants(graph)
    assert "Neg" in ops(graph)  # out of both loops
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_dynamic_trip_count_keeps_what_could_fail():
    body = _body([helper.make_node("Gather", ["w", "idx"], ["g"], axis=0, name="gather"),
                  helper.make_node("Exp", ["w"], ["e"], name="exp"),
                  helper.make_node("Add", ["acc_in", "e"], ["a"]),
                  helper.make_node("Add", ["a", "g"], ["acc_out"])])
    model = _loop_model(body, dynamic_trips=True)
    model.graph.initializer.append(__import__("onnx").numpy_helper.from_array(np.array([0, 1, 2, 3], np.int64), "idx"))
    graph = gp.load(model)
    ctx = PassContext()
    hoist_loop_invariants(graph, ctx)
    assert "Exp" in ops(graph) and "Gather" not in ops(graph)  # Exp cannot fail; Gather could
    assert "trip count is not provably >= 1" in ctx.explanations[0].reason
    feeds = {"x": np.ones(4, np.float32), "w": np.arange(4, dtype=np.float32), "n": np.array(3, np.int64)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


def test_body_outputs_and_scan_outputs_stay():
    body = _body([helper.make_node("Exp", ["w"], ["e"]), helper.make_node("Add", ["acc_in", "e"], ["acc_out"])],
                 extra_outputs=("e",))
    model = _loop_model(body, scan_outputs=("es",))
    graph = gp.load(model)
    assert not hoist_loop_invariants(graph).modified  # e is a scan output: the body must produce it
    assert_equivalent(model, gp.to_proto(graph), exact=True)
