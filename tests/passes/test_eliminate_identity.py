import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import eliminate_identity
from graphpass.testing import assert_equivalent, make_model, ops, ort_run


def test_internal_identity_removed():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
                        helper.make_node("Neg", ["b"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = eliminate_identity(graph)
    assert result.modified and result.stats["identity"] == 1
    assert ops(graph) == ["Relu", "Neg"]
    assert graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_identity_at_graph_output_renames_producer_output():
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    eliminate_identity(graph)
    assert ops(graph) == ["Relu"]
    assert graph.nodes[0].outputs[0].name == "y"
    assert [t.name for t in graph.outputs] == ["y"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_identity_from_graph_input_to_output_is_kept():
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
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
    graph = gp.load(model).graph
    result = eliminate_identity(graph)
    assert result.stats["dropout"] == 1
    assert ops(graph).count("Dropout") == 1
    kept = next(n for n in graph.nodes if n.op == "Dropout")
    assert kept.inputs[2].name == "train"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_dropout_with_used_mask_is_kept():
    model = make_model([helper.make_node("Dropout", ["x"], ["d", "mask"])], {"x": [3]},
                       {"d": [3], "mask": (TensorProto.BOOL, [3])}, opset=13)
    graph = gp.load(model).graph
    assert not eliminate_identity(graph).modified


def test_neutral_elements_are_removed():
    inits = {"one": np.ones((1, 3, 1), np.float32), "zero": np.zeros((), np.float32), "one_s": np.array(1.0, np.float32),
             "neg_zero": np.array(-0.0, np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "one"], ["a"]),
             helper.make_node("Add", ["neg_zero", "a"], ["b"]), helper.make_node("Div", ["b", "one_s"], ["c"]),
             helper.make_node("Sub", ["c", "zero"], ["y"])]
    model = make_model(nodes, {"x": [2, 3, 4]}, {"y": [2, 3, 4]}, initializers=inits)
    graph = gp.load(model).graph
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
    graph = gp.load(model).graph
    assert not eliminate_identity(graph).modified
    assert ops(graph) == ["Mul", "Mul", "Sub"]


SPECIAL = np.array([-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 1.5, -2.0],
                   np.float32)


def _bits_equal(a, b):
    return a.dtype == b.dtype and np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


@pytest.mark.parametrize("op, value, removed, const_first", [
    ("Add", 0.0, False, False), ("Add", 0.0, False, True),  # -0.0 + 0.0 is +0.0: not an identity
    ("Add", -0.0, True, False), ("Add", -0.0, True, True),  # x + -0.0 is x for every x
    ("Sub", 0.0, True, False),                              # x - 0.0 is x + -0.0
    ("Sub", -0.0, False, False),                            # x - -0.0 is x + 0.0: -0.0 becomes +0.0
    ("Mul", 1.0, True, False), ("Mul", 1.0, True, True),
    ("Div", 1.0, True, False),
])
def test_float_neutral_elements_follow_the_sign_of_zero(op, value, removed, const_first):
    ins = ["c", "r"] if const_first else ["r", "c"]
    nodes = [helper.make_node("Neg", ["x"], ["r"]), helper.make_node(op, ins, ["y"])]
    model = make_model(nodes, {"x": [12]}, {"y": [12]}, initializers={"c": np.array(value, np.float32)})
    graph = gp.load(model).graph
    eliminate_identity(graph)
    assert (op in ops(graph)) != removed
    after = gp.to_proto(graph)
    feeds = {"x": SPECIAL}
    ref, got = ort_run(model, feeds)["y"], ort_run(after, feeds)["y"]
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)  # NaN payloads aside, bit for bit
    assert _bits_equal(got[~nan], ref[~nan])


@pytest.mark.parametrize("op, value", [("Add", 0), ("Sub", 0), ("Mul", 1), ("Div", 1)])
@pytest.mark.parametrize("dtype, elem", [(np.int32, onnx.TensorProto.INT32), (np.int64, onnx.TensorProto.INT64)])
def test_integer_neutral_elements_are_all_removed(op, value, dtype, elem):
    nodes = [helper.make_node("Neg", ["x"], ["r"]), helper.make_node(op, ["r", "c"], ["y"])]
    model = make_model(nodes, {"x": (elem, [5])}, {"y": (elem, [5])}, initializers={"c": np.array(value, dtype)})
    graph = gp.load(model).graph
    assert eliminate_identity(graph).stats["neutral"] == 1
    feeds = {"x": np.array([0, -1, 7, np.iinfo(dtype).max, np.iinfo(dtype).min + 1], dtype)}
    assert _bits_equal(ort_run(gp.to_proto(graph), feeds)["y"], ort_run(model, feeds)["y"])


@pytest.mark.parametrize("mask_use", ["read", "output"])
def test_dropout_whose_mask_is_used_is_kept_even_when_its_output_could_be_bypassed(mask_use):
    # d is internal (Neg reads it), so only the used mask keeps the Dropout
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]), helper.make_node("Neg", ["d"], ["y"])]
    outputs = {"y": [3]}
    if mask_use == "read":
        nodes.append(helper.make_node("Not", ["mask"], ["m"]))
        outputs["m"] = (TensorProto.BOOL, [3])
    else:
        outputs["mask"] = (TensorProto.BOOL, [3])
    model = make_model(nodes, {"x": [3]}, outputs, opset=13)
    graph = gp.load(model).graph
    assert not eliminate_identity(graph).modified
    assert ops(graph).count("Dropout") == 1
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_dropout_with_a_named_but_unused_mask_is_removed():
    model = make_model([helper.make_node("Dropout", ["x"], ["d", "mask"]), helper.make_node("Neg", ["d"], ["y"])],
                       {"x": [3]}, {"y": [3]}, opset=13)
    graph = gp.load(model).graph
    result = eliminate_identity(graph)
    assert result.stats["dropout"] == 1 and ops(graph) == ["Neg"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_an_op_of_two_runtime_operands_is_not_a_neutral_element():
    for op in ("Add", "Sub", "Mul", "Div"):
        model = make_model([helper.make_node(op, ["x", "z"], ["y"])], {"x": [3], "z": [3]}, {"y": [3]})
        graph = gp.load(model).graph
        assert not eliminate_identity(graph).modified and ops(graph) == [op]


def test_identity_of_a_one_element_constant_read_by_range_stays():
    # Range takes a [1] tensor computed at run time but onnxruntime refuses it as an initializer
    # when it loads the model: Range(0, Identity(one_1d), 1) must keep its Identity (the ONNX
    # function of AffineGrid, once its If on a constant is inlined, reads its bound so)
    model = make_model([helper.make_node("Identity", ["one_1d"], ["d"]), helper.make_node("Range", ["z", "d", "o"], ["r"]),
                        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT), helper.make_node("Add", ["rf", "x"], ["y"])],
                       {"x": [1]}, {"y": [1]}, opset=20,
                       initializers={"one_1d": np.array([1], np.int64), "z": np.array(0, np.int64), "o": np.array(1, np.int64)})
    from graphpass.passes.framework import PassContext

    graph = gp.load(model).graph
    ctx = PassContext()
    result = eliminate_identity(graph, ctx)
    assert not result.modified and "Identity" in ops(graph)
    assert any("Range" in e.reason for e in ctx.explanations)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.array([-0.0], np.float32)}, exact=True)


def test_identity_of_an_lstm_recurrence_weight_stays():
    # onnxruntime prepacks LSTM's R when it is an initializer and then rounds differently (1e-8)
    # than on the same values computed at run time (an Identity output): not bit for bit
    from graphpass.passes.framework import PassContext

    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Identity", ["R0"], ["R"]),
                        helper.make_node("LSTM", ["x", "W", "R"], ["", "y"], hidden_size=16)],
                       {"x": [3, 2, 16]}, {"y": [1, 2, 16]},
                       initializers={"W": rng.standard_normal((1, 64, 16)).astype(np.float32),
                                     "R0": rng.standard_normal((1, 64, 16)).astype(np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not eliminate_identity(graph, ctx).modified
    assert any("LSTM" in e.reason for e in ctx.explanations)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((3, 2, 16)).astype(np.float32)
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": x}, exact=True)


def test_identity_of_a_constant_node_of_one_element_read_by_range_stays():
    # (attack branch) the same bound written by a Constant node: onnxruntime makes that node an
    # initializer at load and refuses it there too (simplify_shapes writes such a node)
    from graphpass.passes.framework import PassContext

    one = onnx.numpy_helper.from_array(np.array([1], np.int64), "one_v")
    model = make_model([helper.make_node("Constant", [], ["one_1d"], value=one),
                        helper.make_node("Identity", ["one_1d"], ["d"]), helper.make_node("Range", ["z", "d", "o"], ["r"]),
                        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT), helper.make_node("Add", ["rf", "x"], ["y"])],
                       {"x": [1]}, {"y": [1]}, opset=20,
                       initializers={"z": np.array(0, np.int64), "o": np.array(1, np.int64)})
    graph = gp.load(model).graph
    ctx = PassContext()
    eliminate_identity(graph, ctx)
    assert "Identity" in ops(graph)
    assert any("Range" in e.reason for e in ctx.explanations)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.array([-0.0], np.float32)}, exact=True)


@pytest.mark.parametrize("op, unit, kept", [("And", True, False), ("Or", False, True)])
def test_and_true_and_or_false_on_a_symbolic_shape_are_removed_exactly(op, unit, kept):
    """What the dynamo exporter writes for masks (``new_ones & ge``): the neutral bool goes, on any
    batch; the absorbing one (and false, or true) stays."""
    for const, fires in ((unit, True), (kept, False)):
        for shape in ([], [1], [1, 1]):  # never wider than x (rank 2): x's shape is the output's
            model = make_model([helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node(op, ["c", "g"], ["y"])],
                               {"a": ["n", 3], "b": ["n", 3]}, {"y": (TensorProto.BOOL, ["n", 3])},
                               initializers={"c": np.full(shape, const, bool)})
            graph = gp.load(model).graph
            assert eliminate_identity(graph).modified == fires
            assert ops(graph) == (["Greater"] if fires else ["Greater", op])
            after = gp.to_proto(graph)
            for n in (0, 1, 4):
                a = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
                a.ravel()[::2] = np.nan
                assert_equivalent(model, after, feeds={"a": a, "b": np.zeros((n, 3), np.float32)}, exact=True)


def test_a_neutral_constant_that_would_broadcast_a_symbolic_x_stays():
    # x [n] and true of shape [1, 1]: the output is [1, n], not x
    model = make_model([helper.make_node("Not", ["x"], ["nx"]), helper.make_node("And", ["c", "nx"], ["y"])],
                       {"x": (TensorProto.BOOL, ["n"])}, {"y": (TensorProto.BOOL, [1, "n"])},
                       initializers={"c": np.ones((1, 1), bool)})
    graph = gp.load(model).graph
    assert not eliminate_identity(graph).modified and ops(graph) == ["Not", "And"]


def test_times_one_of_shape_1_on_a_symbolic_batch_is_removed_with_special_values():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "one"], ["y"])],
                       {"x": ["batch", 4]}, {"y": ["batch", 4]}, initializers={"one": np.ones([1], np.float32)})
    graph = gp.load(model).graph
    assert eliminate_identity(graph).stats["neutral"] == 1 and ops(graph) == ["Relu"]
    after = gp.to_proto(graph)
    x = np.array([[np.nan, np.inf, -np.inf, -0.0], [1e-45, 3.4e38, -2.0, 0.0]], np.float32)
    for batch in (x[:0], x[:1], x):
        assert_equivalent(model, after, feeds={"x": batch}, exact=True)


def test_a_neutral_constant_of_x_rank_that_broadcasts_a_static_x_stays():
    """Mutation survivor (issue 20's all-1-dim rule, line 75 `and` -> `or`): a constant of x's
    rank whose dims are not all 1 (ones [3, 4] on x [1, 4]) broadcasts x to [3, 4]; removing it
    would change the shape its reader sees (here an internal tensor, read by a Neg)."""
    for op, unit in (("Mul", np.float32(1)), ("Add", np.float32(-0.0))):
        model = make_model([helper.make_node(op, ["x", "c"], ["m"]), helper.make_node("Neg", ["m"], ["y"])],
                           {"x": [1, 4]}, {"y": [3, 4]}, initializers={"c": np.full((3, 4), unit, np.float32)})
        graph = gp.load(model).graph
        assert not eliminate_identity(graph).modified and ops(graph) == [op, "Neg"]
        assert_equivalent(model, gp.to_proto(graph), exact=True)
    model = make_model([helper.make_node("And", ["x", "c"], ["m"]), helper.make_node("Not", ["m"], ["y"])],
                       {"x": (TensorProto.BOOL, [1, 4])}, {"y": (TensorProto.BOOL, [3, 4])},
                       initializers={"c": np.ones((3, 4), bool)})
    graph = gp.load(model).graph
    assert not eliminate_identity(graph).modified and ops(graph) == ["And", "Not"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)
