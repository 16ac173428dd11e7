import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import fold_constants
from graphpass.testing import assert_equivalent, make_model, ops


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, np.float32)))


def test_folds_constant_subgraph_into_one_initializer():
    model = make_model(
        [
            _const("a", [[1.0, 2.0, 3.0]]),
            _const("b", [[10.0, 20.0, 30.0]]),
            helper.make_node("Add", ["a", "b"], ["ab"]),
            helper.make_node("Mul", ["ab", "ab"], ["c"]),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        {"x": [2, 3]}, {"y": [2, 3]},
    )
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.modified
    assert result.stats["folded"] == 1 and result.stats["constant_nodes"] == 2
    assert ops(graph) == ["Add"]
    c = graph.nodes[0].inputs[1]
    np.testing.assert_array_equal(c.values, [[121.0, 484.0, 1089.0]])
    assert c.name == "c"  # the folded tensor keeps its name
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_does_not_fold_runtime_values():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])],
                       {"x": [4]}, {"y": [4]})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert not result.modified
    assert ops(graph) == ["Relu", "Add"]


def test_size_guard_keeps_big_constant_of_shape():
    # ConstantOfShape -> 2 MiB tensor: folding it would bloat the model, so it stays.
    shape = np.array([512, 1024], np.int64)
    model = make_model(
        [helper.make_node("ConstantOfShape", ["s"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("ReduceSum", ["big", "axes"], ["sum"], keepdims=0),
         helper.make_node("Add", ["z", "sum"], ["z2"]),
         helper.make_node("Add", ["x", "big"], ["y"])],
        {"x": [512, 1024], "z": [512]}, {"y": [512, 1024], "z2": [512]},
        initializers={"s": shape, "axes": np.array([1], np.int64)},
    )
    graph = gp.load(model).graph
    result = fold_constants(graph)
    # by default nothing that grows the file folds: neither the 2 MiB fill nor its 2 KiB sum
    assert result.stats["would_grow"] == 2 and result.stats["folded"] == 0
    assert ops(graph) == ["ConstantOfShape", "ReduceSum", "Add", "Add"]
    # fold_growing: the small reduction of the big tensor is folded (the big one is never stored);
    # it is read by a node, not a graph output (outputs are never folded)
    graph = gp.load(model).graph
    result = fold_constants(graph, fold_growing=True)
    assert result.stats["too_large"] >= 1 and "ConstantOfShape" in ops(graph)
    assert result.stats["folded"] == 1 and "ReduceSum" not in ops(graph)
    add_z = next(n for n in graph.nodes if n.inputs[0].name == "z")
    np.testing.assert_array_equal(add_z.inputs[1].values, np.full(512, 1024.0, np.float32))
    assert_equivalent(model, gp.to_proto(graph))
    # with a larger limit it folds
    graph2 = gp.load(model).graph
    fold_constants(graph2, size_limit=4 << 20, fold_growing=True)
    assert "ConstantOfShape" not in ops(graph2)
    # the limit alone authorizes no growth
    graph3 = gp.load(model).graph
    assert fold_constants(graph3, size_limit=4 << 20).stats["folded"] == 0 and "ConstantOfShape" in ops(graph3)


def test_a_big_weight_only_reshaped_is_folded_past_the_size_limit():
    """Reshape(W) of a 4 MB weight nothing else reads: the folded weight replaces W (the model
    does not grow). Found beside onnxslim on light_inception_v1. A weight read twice stays."""
    w = np.random.default_rng(0).standard_normal((1000, 1024)).astype(np.float32)
    model = make_model([helper.make_node("Reshape", ["w", "s"], ["wr"]), helper.make_node("MatMul", ["x", "wr"], ["y"])],
                       {"x": [2, 1000]}, {"y": [2, 1024]},
                       initializers={"w": w, "s": np.array([1000, 1024], np.int64)})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["too_large"] == 0 and ops(graph) == ["MatMul"]
    # not bit for bit: onnxruntime prepacks a MatMul weight that is an initializer (another
    # summation order over K = 1000)
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-4, atol=1e-4)
    shared = make_model([helper.make_node("Reshape", ["w", "s"], ["wr"]), helper.make_node("MatMul", ["x", "wr"], ["y"]),
                         helper.make_node("Neg", ["w"], ["z"])],
                        {"x": [2, 1000]}, {"y": [2, 1024], "z": [1000, 1024]},
                        initializers={"w": w, "s": np.array([1000, 1024], np.int64)})
    graph = gp.load(shared).graph
    assert fold_constants(graph).stats["would_grow"] >= 1 and "Reshape" in ops(graph)


def test_never_folds_random_ops():
    model = make_model(
        [helper.make_node("RandomNormal", [], ["r"], shape=[3], seed=1.0),
         helper.make_node("Add", ["x", "r"], ["y"])],
        {"x": [3]}, {"y": [3]},
    )
    graph = gp.load(model).graph
    fold_constants(graph)
    assert "RandomNormal" in ops(graph)


def test_folds_shape_of_static_tensor_and_the_chain_after_it():
    model = make_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
         helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"])],
        {"x": [2, 3, 4]}, {"y": [2, 12]},
        initializers={"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64), "minus1": np.array([-1], np.int64)},
    )
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["shapes"] == 1
    assert ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [2, -1])
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_keeps_constant_graph_output():
    model = make_model([_const("c", [1.0, 2.0]), helper.make_node("Identity", ["x"], ["y"])],
                       {"x": [2]}, {"y": [2], "c": [2]})
    graph = gp.load(model).graph
    fold_constants(graph)
    assert "Constant" in ops(graph)
    assert_equivalent(model, gp.to_proto(graph))


def test_folds_inside_loop_body():
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array([1.0], np.float32))),
         helper.make_node("Add", ["one", "one"], ["two"]),
         helper.make_node("Add", ["acc_in", "two"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])],
    )
    model = make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                       {"x": [1]}, {"y": [1]}, initializers={"n": np.array(3, np.int64)})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.modified
    body_ops = sorted(n.op for n in graph.nodes[0].attrs["body"].nodes)
    assert body_ops == ["Add", "Identity"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_shape_known_only_after_the_first_round_is_folded_in_the_next():
    # y1's shape is known only once the first chain is folded and shapes are re-inferred; the
    # second Shape reads y1, so it folds in round two (the loop must not stop after round one)
    model = make_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
         helper.make_node("Slice", ["s", "one1", "three1"], ["rest"]),
         helper.make_node("ReduceProd", ["rest"], ["prod"], keepdims=1),  # onnx's data propagation stops here
         helper.make_node("Concat", ["n1", "prod"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y1"]),
         helper.make_node("Shape", ["y1"], ["s2"]),
         helper.make_node("Gather", ["s2", "one"], ["m"], axis=0),
         helper.make_node("Unsqueeze", ["m", "zero1"], ["m1"]),
         helper.make_node("Concat", ["minus1", "m1"], ["shape2"], axis=0),
         helper.make_node("Reshape", ["y1", "shape2"], ["y"])],
        {"x": [2, 3, 4]}, {"y": [2, 12]},
        initializers={"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "zero1": np.array([0], np.int64),
                      "minus1": np.array([-1], np.int64), "one1": np.array([1], np.int64), "three1": np.array([3], np.int64)},
    )
    graph = gp.load(model).graph
    y1 = next(n for n in graph.nodes if n.op == "Reshape").outputs[0]
    assert y1.shape is None or not all(isinstance(d, int) for d in y1.shape)  # unknown before folding
    result = fold_constants(graph)
    assert result.stats["shapes"] == 2, result.stats
    assert ops(graph) == ["Reshape", "Reshape"]
    np.testing.assert_array_equal(graph.nodes[1].inputs[1].values, [-1, 12])
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_deep_chain_of_nodes_reading_their_producer_twice_folds_quickly():
    # a_k = a_{k-1} + a_{k-1}: each producer is reached twice; walking it again every time would
    # take 2**40 steps
    import time

    nodes = [_const("a0", [1.0])] + [helper.make_node("Add", [f"a{k - 1}", f"a{k - 1}"], [f"a{k}"]) for k in range(1, 41)]
    nodes.append(helper.make_node("Add", ["x", "a40"], ["y"]))
    model = make_model(nodes, {"x": [1]}, {"y": [1]})
    graph = gp.load(model).graph
    t0 = time.perf_counter()
    result = fold_constants(graph)
    assert time.perf_counter() - t0 < 20
    assert result.stats["folded"] == 1 and ops(graph) == ["Add"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [2.0 ** 40])
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_when_the_batch_fails_each_node_is_folded_alone():
    # Cast of a non-numeric string fails when evaluated, so the batch evaluation fails; the
    # node-by-node retry still folds the Add -> Mul chain and leaves the Cast, counted as failed
    nodes = [_const("c1", [1.0]), _const("c2", [2.0]), _const("c3", [4.0]),
             helper.make_node("Add", ["c1", "c2"], ["a"]), helper.make_node("Mul", ["a", "c3"], ["b"]),
             helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Add", ["x", "f"], ["z"])]
    model = make_model(nodes, {"x": [1]}, {"y": [1], "z": [1]}, initializers={"s": np.array(["abc"], dtype=object)})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["failed"] == 1 and result.stats["folded"] == 1
    assert sorted(ops(graph)) == ["Add", "Add", "Cast"]
    add_y = next(n for n in graph.nodes if n.outputs[0].name == "y")
    np.testing.assert_array_equal(add_y.inputs[1].values, [12.0])
    onnx.checker.check_model(gp.to_proto(graph), full_check=True)


def test_a_computed_constant_that_is_a_graph_output_and_read_at_run_time_keeps_its_node():
    # c = a + b is a graph output and Add(x, c) reads it: the graph output keeps its producer
    nodes = [_const("a", [1.0, 2.0]), _const("b", [3.0, 4.0]), helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Add", ["x", "c"], ["y"])]
    model = make_model(nodes, {"x": [2]}, {"y": [2], "c": [2]})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 0
    c = next(t for t in graph.outputs if t.name == "c")
    assert len(c.inputs) == 1 and c.inputs[0].op == "Add"
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_folded_scalar_stays_rank_0():
    # Squeeze(z, axes=z) of a [1] constant is a scalar: Range reads it and refuses a [1] tensor
    # (np.ascontiguousarray made every folded 0-d value 1-d; the ONNX attention functions hit it)
    nodes = [helper.make_node("Constant", [], ["z"], value=helper.make_tensor("v", TensorProto.INT64, [1], [0])),
             helper.make_node("Squeeze", ["z", "z"], ["zero"]),
             helper.make_node("Range", ["zero", "n", "one"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                          initializer=[helper.make_tensor("one", TensorProto.INT64, [], [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    graph = gp.load(model).graph
    assert fold_constants(graph).stats["folded"] == 1
    zero = next(t for t in graph.nodes[-1].inputs if t.name.startswith("zero") or isinstance(t, gs.Constant))
    assert isinstance(zero, gs.Constant) and zero.values.shape == ()
    out = gp.to_proto(graph, emit="device")
    onnx.checker.check_model(out, full_check=True)
    assert_equivalent(model, out, feeds={"n": np.array(5, np.int64)}, exact=True)


def test_a_plain_fold_counts_no_refusal_of_any_kind():
    model = make_model([_const("a", [1.0, 2.0]), helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Add", ["x", "b"], ["y"])],
                       {"x": [2]}, {"y": [2]})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and ops(graph) == ["Add"]
    assert {k: result.stats[k] for k in ("too_large", "failed", "invalid_shape", "over_memory")} == {
        "too_large": 0, "failed": 0, "invalid_shape": 0, "over_memory": 0}


# --- the mutation run's survivors (README "Mutation testing") -------------------------------------

import pytest  # noqa: E402


def test_constant_nodes_of_every_value_attribute_keep_their_dtype_and_value():
    f32 = np.float32
    nodes = [helper.make_node("Constant", [], ["vf"], value_float=-0.0),
             helper.make_node("Constant", [], ["vfs"], value_floats=[np.nan, -np.inf, 1e-45, 3.4e38]),
             helper.make_node("Constant", [], ["vi"], value_int=-(2 ** 40)),
             helper.make_node("Constant", [], ["vis"], value_ints=[0, -1, 2 ** 62]),
             helper.make_node("Add", ["x", "vf"], ["a"]), helper.make_node("Add", ["a", "vfs"], ["y"]),
             helper.make_node("Add", ["n", "vi"], ["b"]), helper.make_node("Add", ["b", "vis"], ["z"])]
    model = make_model(nodes, {"x": [4], "n": (TensorProto.INT64, [3])}, {"y": [4], "z": (TensorProto.INT64, [3])})
    graph = gp.load(model).graph
    assert fold_constants(graph).stats["constant_nodes"] == 4
    assert ops(graph) == ["Add"] * 4
    values = {t.name: t.values for n in graph.nodes for t in n.inputs if isinstance(t, gs.Constant)}
    assert values["vf"].dtype == f32 and values["vf"].shape == () and np.signbit(values["vf"])
    assert values["vfs"].dtype == f32 and values["vfs"].tobytes() == np.array([np.nan, -np.inf, 1e-45, 3.4e38], f32).tobytes()
    assert values["vi"].dtype == np.int64 and values["vi"] == -(2 ** 40)
    assert values["vis"].dtype == np.int64 and values["vis"].tolist() == [0, -1, 2 ** 62]
    feeds = {"x": np.array([-0.0, 1, np.inf, -1e-45], f32), "n": np.array([1, 2, 3], np.int64)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


@pytest.mark.parametrize("start, end", [(0, -5), (0, 0), (0, -1), (1, 10), (-2, None), (-5, 2), (None, -3), (2, 1)])
def test_shape_with_start_and_end_folds_to_what_onnxruntime_gives(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    model = make_model([helper.make_node("Shape", ["x"], ["s"], **attrs), helper.make_node("Concat", ["s", "k"], ["y"], axis=0)],
                       {"x": [2, 3, 4], "k": (TensorProto.INT64, [1])}, {"y": (TensorProto.INT64, ["m"])}, opset=15)
    graph = gp.load(model).graph
    assert fold_constants(graph).stats["shapes"] == 1
    assert ops(graph) == ["Concat"]
    feeds = {"x": np.zeros((2, 3, 4), np.float32), "k": np.array([7], np.int64)}
    ref = assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)
    np.testing.assert_array_equal(graph.nodes[0].inputs[0].values, ref["y"][:-1])


def _graph_without_shapes(a, b):
    # built with onnx-graphsurgeon by hand: the intermediate c has no shape and no dtype
    a, b = gs.Constant("a", a), gs.Constant("b", b)
    c, x, y = gs.Variable("c"), gs.Variable("x", np.float32, [2]), gs.Variable("y", np.float32, [2])
    return gs.Graph(nodes=[gs.Node("Add", "ab", inputs=[a, b], outputs=[c]), gs.Node("Add", "xc", inputs=[x, c], outputs=[y])],
                    inputs=[x], outputs=[y], opset=17)


def test_a_tensor_of_unknown_shape_and_dtype_is_folded_and_sized_after_it_is_computed():
    a, b = np.array([1.5, -0.0], np.float32), np.array([2.0, -0.0], np.float32)
    graph = _graph_without_shapes(a, b)
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and ops(graph) == ["Add"]
    c = graph.nodes[0].inputs[1]
    assert isinstance(c, gs.Constant) and c.values.tobytes() == (a + b).tobytes()  # -0.0 + -0.0 is -0.0
    # its 8 bytes over a 4-byte limit, known only once computed: folded all the same, since the
    # 16 bytes of operands it frees are more (the size policy: a fold that does not grow the file)
    graph = _graph_without_shapes(a, b)
    result = fold_constants(graph, size_limit=4)
    assert result.stats["too_large"] == 0 and result.stats["folded"] == 1 and ops(graph) == ["Add"]


def test_a_value_that_would_be_an_invalid_shape_operand_is_not_folded():
    # Cast(NaN) to int64 is INT64_MIN: as Reshape's shape it is invalid (Case 6); the data input
    # of the same Reshape is no shape operand
    nodes = [_const("c", [np.nan, 4.0]), helper.make_node("Cast", ["c"], ["s"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "s"], ["y"])]
    model = make_model(nodes, {"x": [2, 4]}, {"y": (TensorProto.FLOAT, ["a", "b"])})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["invalid_shape"] == 1 and result.stats["folded"] == 0
    assert ops(graph) == ["Cast", "Reshape"]
    onnx.checker.check_model(gp.to_proto(graph), full_check=True)


def test_a_shape_that_is_a_graph_output_keeps_its_node():
    model = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])],
                       {"x": [2, 3]}, {"y": [2, 3], "s": (TensorProto.INT64, [2])})
    graph = gp.load(model).graph
    assert not fold_constants(graph).modified
    assert ops(graph) == ["Shape", "Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_random_like_ops_of_constants_are_never_folded():
    model = make_model([_const("c", [1.0, 2.0, 3.0]), helper.make_node("RandomUniformLike", ["c"], ["r"], seed=1.0),
                        helper.make_node("Add", ["x", "r"], ["y"])], {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 0 and ops(graph) == ["RandomUniformLike", "Add"]


def test_a_computed_tensor_reshaped_past_the_size_limit_is_not_folded():
    # Reshape(W + 1) where W is read elsewhere too is no weight only re-laid-out: its value is
    # new and W stays, the model would grow; Transpose(W) of a weight nothing else reads is one,
    # and folds past the limit
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)  # 8 KiB
    computed = make_model([helper.make_node("Add", ["w", "one"], ["w1"]), helper.make_node("Reshape", ["w1", "s"], ["wr"]),
                           helper.make_node("MatMul", ["x", "wr"], ["y"]), helper.make_node("MatMul", ["x", "w"], ["z"])],
                          {"x": [2, 64]}, {"y": [2, 32], "z": [2, 32]},
                          initializers={"w": w, "one": np.array(1.0, np.float32), "s": np.array([64, 32], np.int64)})
    graph = gp.load(computed).graph
    stats = fold_constants(graph, size_limit=1024).stats
    assert stats["folded"] == 0 and stats["too_large"] + stats["would_grow"] == 1, stats
    assert ops(graph) == ["Add", "Reshape", "MatMul", "MatMul"]
    moved = make_model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])],
                       {"x": [2, 32]}, {"y": [2, 64]}, initializers={"w": w})
    graph = gp.load(moved).graph
    result = fold_constants(graph, size_limit=1024)
    assert result.stats["too_large"] == 0 and result.stats["folded"] == 1 and ops(graph) == ["MatMul"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, w.T)


def test_a_bfloat16_result_is_left_alone_without_a_failure():
    # numpy has no bfloat16: such a result is never asked of onnxruntime (nor counted as failed)
    model = make_model([_const("c", [1.5, 2.0]), helper.make_node("Cast", ["c"], ["b"], to=TensorProto.BFLOAT16),
                        helper.make_node("Add", ["b", "x"], ["y"])],
                       {"x": (TensorProto.BFLOAT16, [2])}, {"y": (TensorProto.BFLOAT16, [2])})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["failed"] == 0 and result.stats["folded"] == 0 and ops(graph) == ["Cast", "Add"]


def test_the_last_rounds_folds_are_followed_by_a_shape_reinference():
    # Unsqueeze(x, Abs(a)): its rank is unknown until the axes are a constant; the fold makes
    # them one, and the shapes after it are inferred again before the pass returns
    nodes = [helper.make_node("Abs", ["a"], ["axes"]), helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    model = make_model(nodes, {"x": [2, 6]}, {"y": (TensorProto.FLOAT, ["a", "b", "c"])},
                       initializers={"a": np.array([-1], np.int64)})
    graph = gp.load(model).graph
    assert graph.nodes[1].outputs[0].shape is None
    assert fold_constants(graph).stats["folded"] == 1
    assert graph.nodes[0].op == "Unsqueeze" and graph.nodes[0].outputs[0].shape == [2, 1, 6]
    assert_equivalent(model, gp.to_proto(graph), exact=True)



def test_a_one_element_range_bound_that_is_not_a_scalar_stays_computed():
    # Split(Shape(x)) gives [1] tensors; Range takes them at run time, but onnxruntime refuses a
    # non-scalar Range bound that is an initializer when it loads the model. The ONNX function of
    # AffineGrid does this once its If (on a constant) is inlined.
    model = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Split", ["s"], ["a", "b"], num_outputs=2),
                        helper.make_node("Range", ["z", "a", "o"], ["r"]), helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                        helper.make_node("ReduceSum", ["x"], ["xs"], keepdims=0), helper.make_node("Add", ["rf", "xs"], ["y"])],
                       {"x": [3, 4]}, {"y": [None]}, initializers={"z": np.array(0, np.int64), "o": np.array(1, np.int64)},
                       opset=20)
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["invalid_shape"] >= 1
    range_bound = next(n for n in graph.nodes if n.op == "Range").inputs[1]
    assert not (isinstance(range_bound, gs.Constant) and range_bound.values.ndim != 0)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.full((3, 4), -0.0, np.float32)}, exact=True)


def _lstm_with_computed_r(r_node):
    rng = np.random.default_rng(0)
    h = 16
    return make_model([r_node, helper.make_node("LSTM", ["x", "W", "R"], ["", "y"], hidden_size=h)],
                      {"x": [3, 2, h]}, {"y": [1, 2, h]},
                      initializers={"W": rng.standard_normal((1, 4 * h, h)).astype(np.float32),
                                    "R0": rng.standard_normal((1, 4 * h, h)).astype(np.float32)})


def test_an_lstm_recurrence_weight_computed_at_run_time_stays_computed():
    # onnxruntime prepacks LSTM's R when it is an initializer and then rounds differently (1e-8)
    # than on the same values computed at run time: folding it would not be bit for bit (a
    # scripted torch LSTM in a Loop body slices and concatenates its weights so)
    model = _lstm_with_computed_r(helper.make_node("Neg", ["R0"], ["R"]))
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and result.stats["prepacked"] == 1
    assert ops(graph) == ["Identity", "LSTM"]  # the Neg is folded; LSTM reads the constant through an Identity
    r = graph.nodes[-1].inputs[2]
    assert not isinstance(r, gs.Constant) and isinstance(r.inputs[0].inputs[0], gs.Constant)
    assert not fold_constants(graph).modified  # and that form is final
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((3, 2, 16)).astype(np.float32)
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": x}, exact=True)


def test_inside_a_loop_body_outer_constants_fold_with_the_body_s_own():
    # body: acc_out = acc_in + (w * k) + Shape-derived value; w an outer initializer, s an outer
    # Constant node, k the body's own constant: all of it folds inside the body
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", TensorProto.FLOAT, [], [2.0])),
         helper.make_node("Mul", ["w", "k"], ["wk"]), helper.make_node("Add", ["wk", "s"], ["wks"]),
         helper.make_node("Add", ["acc_in", "wks"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])])
    model = make_model([helper.make_node("Constant", [], ["s"], value=helper.make_tensor("sv", TensorProto.FLOAT, [3], [-0.0, 1, 2])),
                        helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                       {"x": [3], "M": (TensorProto.INT64, [])}, {"y": [3]},
                       initializers={"w": np.array([0.5, -0.0, np.inf], np.float32)})
    graph = gp.load(model).graph
    assert fold_constants(graph).modified
    loop = next(n for n in graph.nodes if n.op == "Loop")
    assert [n.op for n in loop.attrs["body"].nodes] == ["Identity", "Add"]
    out = gp.to_proto(graph)
    for m in (0, 1, 3):
        assert_equivalent(model, out, feeds={"x": np.array([np.nan, -0.0, -np.inf], np.float32),
                                             "M": np.array(m, np.int64)}, exact=True)


# -- the size policy (issue 20): a fold never grows the file unless fold_growing ------------------


def test_a_weight_split_in_three_folds_because_all_parts_together_free_it():
    """Each Slice alone would add a third of the weight (the weight stays for the other two);
    the three together replace it: decided together as one component."""
    w = np.arange(6 * 64, dtype=np.float32).reshape(6, 64)
    nodes, inits = [], {"w": w, "ax": np.array([0], np.int64)}
    for k in range(3):
        inits[f"s{k}"], inits[f"e{k}"] = np.array([2 * k], np.int64), np.array([2 * k + 2], np.int64)
        nodes += [helper.make_node("Slice", ["w", f"s{k}", f"e{k}", "ax"], [f"p{k}"]),
                  helper.make_node("Add", ["x", f"p{k}"], [f"y{k}"])]
    model = make_model(nodes, {"x": [2, 64]}, {f"y{k}": [2, 64] for k in range(3)}, initializers=inits)
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 3 and result.stats["would_grow"] == 0 and ops(graph) == ["Add"] * 3
    assert all(n.inputs[1].values.shape == (2, 64) for n in graph.nodes)
    assert_equivalent(model, gp.to_proto(graph), exact=True)
    # two parts only (the third read at run time from a graph input): the weight stays, nothing folds
    model2 = make_model(nodes[:4] + [helper.make_node("Slice", ["w", "s2", "e", "ax"], ["p2"]),
                                     helper.make_node("Add", ["x", "p2"], ["y2"])],
                        {"x": [2, 64], "e": (TensorProto.INT64, [1])}, {f"y{k}": [2, 64] for k in range(3)},
                        initializers=inits)
    graph = gp.load(model2).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 0 and result.stats["would_grow"] == 2 and ops(graph).count("Slice") == 3


def test_shape_vectors_still_fold_when_their_inputs_are_shared():
    """Concat of two shared int64 constants into a 4-element shape: 32 new bytes, nothing freed,
    one node removed: within the 64-byte allowance (rank <= 8 shape vectors always fold)."""
    a, b = np.array([2, 3], np.int64), np.array([4, 1], np.int64)
    model = make_model([helper.make_node("Concat", ["a", "b"], ["shape"], axis=0),
                        helper.make_node("Reshape", ["x", "shape"], ["y"]),
                        helper.make_node("Add", ["a", "b"], ["z"])],
                       {"x": [24]}, {"y": [2, 3, 4, 1], "z": (TensorProto.INT64, [2])},
                       initializers={"a": a, "b": b})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and ops(graph) == ["Reshape", "Add"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [2, 3, 4, 1])
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_transposed_weight_over_the_size_limit_folds_the_file_does_not_grow():
    w = np.random.default_rng(0).standard_normal((768, 768)).astype(np.float32)  # 2.25 MiB
    model = make_model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                        helper.make_node("Add", ["x", "wt"], ["y"])],
                       {"x": [768, 768]}, {"y": [768, 768]}, initializers={"w": w})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and result.stats["too_large"] == 0 and ops(graph) == ["Add"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, w.T)
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_growing_result_is_refused_but_a_non_growing_sibling_folds():
    """w is read by a Transpose (kept: same size) and a Tile (x4: grows). The component grows as
    a whole; tried one by one, the Transpose alone frees nothing (w stays for the Tile) and
    grows too: neither folds. With the Tile's input a graph input, the Transpose frees w."""
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("Add", ["x", "wt"], ["y"]),
             helper.make_node("Tile", ["w", "r"], ["wr"]), helper.make_node("Add", ["x4", "wr"], ["z"])]
    model = make_model(nodes, {"x": [64, 64], "x4": [256, 64]}, {"y": [64, 64], "z": [256, 64]},
                       initializers={"w": w, "r": np.array([4, 1], np.int64)})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 0 and result.stats["would_grow"] == 2
    graph = gp.load(model).graph
    result = fold_constants(graph, fold_growing=True, size_limit=1 << 20)
    assert result.stats["folded"] == 2 and ops(graph) == ["Add", "Add"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_component_that_grows_is_retried_tensor_by_tensor():
    """Reshape(w1, r) and Tile(w2, r) share the shape constant r: one component, which grows
    (the Tile). One by one the Reshape still folds (it frees w1); the Tile does not."""
    w1 = np.arange(64 * 64, dtype=np.float32).reshape(4096)
    w2 = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) * 2
    r = np.array([64, 64], np.int64)
    model = make_model([helper.make_node("Reshape", ["w1", "r"], ["a"]), helper.make_node("Add", ["x", "a"], ["y"]),
                        helper.make_node("Tile", ["w2", "r"], ["b"]), helper.make_node("Add", ["x2", "b"], ["z"])],
                       {"x": [64, 64], "x2": [4096, 4096]}, {"y": [64, 64], "z": [4096, 4096]},
                       initializers={"w1": w1, "w2": w2, "r": r})
    graph = gp.load(model).graph
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and result.stats["would_grow"] == 1
    assert ops(graph) == ["Add", "Tile", "Add"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, w1.reshape(64, 64))


# mutation survivors of _fold_size (issue 20): the byte count at its boundary, a component joined
# through a chain of fold nodes, the freed weight's own item size

def _cast_chain(n, src, dst, chain=1):
    """Cast(w[n] of src) to dst, then (chain=2) Neg of it, added to a runtime x."""
    nodes = [helper.make_node("Cast", ["w"], ["c"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))]
    last = "c"
    if chain == 2:
        nodes.append(helper.make_node("Neg", ["c"], ["m"]))
        last = "m"
    nodes.append(helper.make_node("Add", ["x", last], ["y"]))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    w = (np.arange(n) % 100 - 50).astype(src)
    return make_model(nodes, {"x": (elem, [n])}, {"y": (elem, [n])}, initializers={"w": w})


def _cast_chain_growth(n, src, dst, chain) -> int:
    """What the size policy charges folding ``_cast_chain``'s result: the stored bytes, minus the
    least bytes w took and, per removed node, the least bytes it took up to NODE_ALLOWANCE."""
    from graphpass.ir.size import freed_bytes, node_bytes_least
    from graphpass.passes.cleanup._fold_size import NODE_ALLOWANCE

    graph = gp.load(_cast_chain(n, src, dst, chain)).graph
    w = graph.nodes[0].inputs[0]
    removed = graph.nodes[:chain]
    return n * np.dtype(dst).itemsize - freed_bytes(w) - sum(min(NODE_ALLOWANCE, node_bytes_least(m)) for m in removed)


def test_the_size_policy_folds_at_zero_growth_and_refuses_one_byte_more():
    """Folding Cast(w int8[n]) to int16 stores 2n bytes and frees w and the Cast node: the largest
    n whose growth is <= 0 folds, n + 1 (one byte more) does not; a chain Cast -> Neg frees two
    nodes (one component); float32 -> float64 frees w at its own item size. The model-wide room is
    left out (no source size), so this is the per-fold rule alone."""
    from graphpass.ir.serialize import SOURCE_BYTES

    for src, dst, chain in ((np.int8, np.int16, 1), (np.int8, np.int16, 2), (np.float32, np.float64, 1)):
        n = next(k for k in range(1, 4096) if _cast_chain_growth(k + 1, src, dst, chain) > 0)
        assert _cast_chain_growth(n, src, dst, chain) <= 0 < _cast_chain_growth(n + 1, src, dst, chain)
        if src is np.int8:
            assert _cast_chain_growth(n + 1, src, dst, chain) - _cast_chain_growth(n, src, dst, chain) == 1
        for size, folds in ((n, True), (n + 1, False)):
            model = _cast_chain(size, src, dst, chain)
            m = gp.load(model)
            del m.meta[SOURCE_BYTES]
            stats = fold_constants(m.graph).stats
            assert (stats["folded"], stats["would_grow"]) == ((1, 0) if folds else (0, 1)), (size, src, dst, chain, stats)
            assert ops(m.graph) == (["Add"] if folds else ["Cast", "Neg", "Add"][:chain] + ["Add"]), (size, chain)
            assert_equivalent(model, gp.to_proto(m.graph), exact=True)


@pytest.mark.parametrize("elem", [TensorProto.UINT4, TensorProto.INT4])
def test_a_4bit_weight_whose_values_were_read_folds_packed(elem):
    """attack14 (left on main): a uint4/int4 weight a user (or a pass) read through ``.values`` is
    an unpacked array; gs's tensor export wrote its unpacked bytes for onnxruntime ('Raw data size
    does not match tensor's size. Expected 2 bytes, but got 4'): fold_constants raised."""
    vals = [1, 2, 3, 7] if elem == TensorProto.INT4 else [1, 2, 3, 15]
    w = helper.make_tensor("w", elem, [4], vals)
    graph = helper.make_graph([helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                               helper.make_node("Add", ["x", "wf"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    loaded = gp.load(model)
    w_const = next(t for t in loaded.graph.tensors().values() if t.name == "w")
    assert w_const.values.shape == (4,)  # read: now an unpacked array
    res = fold_constants(loaded.graph)
    assert res.modified and ops(loaded.graph) == ["Add"]
    out = gp.to_proto(loaded.graph)
    onnx.checker.check_model(out, full_check=True)
    folded = onnx.numpy_helper.to_array(next(i for i in out.graph.initializer if i.name != "x"))
    np.testing.assert_array_equal(folded, np.array(vals, np.float32))
    assert_equivalent(model, out, feeds={"x": np.array([0.5, -0.0, np.nan, np.inf], np.float32)}, exact=True)


# -- float arithmetic folded with numpy (no onnxruntime session): the same bits -----------------

from graphpass.check import verify as _verify  # noqa: E402  (fold_constants imports it when it runs a session)
from graphpass.passes.cleanup import fold_constants as _fc  # noqa: E402

_EDGE32 = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                    np.finfo(np.float32).tiny, np.float32(1e-45), -np.float32(1e-45), 3.4e-39, 7.0, 1e-8],
                   np.float32)


def _arith_nodes(a: np.ndarray, b: np.ndarray, op_types: tuple[str, ...]) -> tuple[list[gs.Node], list[gs.Tensor]]:
    """A chain ``((a op0 b) op1 b) ...`` of gs nodes over two constants; every output wanted."""
    ca, cb = gs.Constant("a", a), gs.Constant("b", b)
    nodes, wanted, x = [], [], ca
    for k, op in enumerate(op_types):
        y = gs.Variable(f"y{k}", dtype=a.dtype)
        nodes.append(gs.Node(op, f"n{k}", inputs=[x, cb], outputs=[y]))
        wanted.append(y)
        x = y
    return nodes, wanted


def _by_onnxruntime(nodes, wanted, opset=17):
    opsets = [helper.make_opsetid("", opset)]
    real = _fc._evaluate_numpy
    try:
        _fc._evaluate_numpy = lambda *args: None
        return _fc._evaluate(nodes, wanted, opsets, 8)
    finally:
        _fc._evaluate_numpy = real


def _bits(v: np.ndarray) -> bytes:
    return np.ascontiguousarray(v).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_numpy_arithmetic_gives_onnxruntime_s_bits(op, dtype):
    # every pair of edge values (signed zeros, infinities, dtype max, subnormals) that makes no NaN,
    # in both operand orders, then a chain of all four ops, and broadcasting a [1] operand
    edge = _EDGE32.astype(dtype)
    a, b = np.repeat(edge, edge.size), np.tile(edge, edge.size)
    with np.errstate(all="ignore"):
        keep = ~np.isnan(getattr(np, {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide"}[op])(a, b))
    a, b = a[keep], b[keep]
    compared = 0
    for nodes, wanted in (_arith_nodes(a, b, (op,)), _arith_nodes(b, a, (op,)),
                          _arith_nodes(a[:1].reshape(1, 1), a.reshape(-1, 1)[: a.size].T, (op,))):
        mine = _fc._evaluate_numpy(nodes, wanted, [helper.make_opsetid("", 17)])
        if mine is None:  # the chain made a NaN somewhere (inf - inf): onnxruntime's, by design
            continue
        ort = _by_onnxruntime(nodes, wanted)
        assert mine.keys() == ort.keys()
        for k in mine:
            assert mine[k].dtype == ort[k].dtype and mine[k].shape == ort[k].shape
            assert _bits(mine[k]) == _bits(ort[k]), (op, k)
        compared += 1
    assert compared >= 2  # both operand orders (no NaN made: the pairs were chosen so)
    nodes, wanted = _arith_nodes(np.array([1.5, -0.0, 3e-39], dtype), np.array([2.0, 7.0, 0.5], dtype),
                                 ("Add", "Mul", "Sub", "Div"))
    mine, ort = _fc._evaluate_numpy(nodes, wanted, [helper.make_opsetid("", 17)]), _by_onnxruntime(nodes, wanted)
    assert mine is not None and all(_bits(mine[k]) == _bits(ort[k]) and mine[k].dtype == ort[k].dtype for k in ort)


def test_numpy_arithmetic_of_empty_and_rank_0_tensors_is_onnxruntime_s():
    for a, b in ((np.zeros((0, 3), np.float32), np.ones((1, 3), np.float32)),
                 (np.array(2.5, np.float32), np.array(-0.0, np.float32))):
        nodes, wanted = _arith_nodes(a, b, ("Mul",))
        mine, ort = _fc._evaluate_numpy(nodes, wanted, [helper.make_opsetid("", 17)]), _by_onnxruntime(nodes, wanted)
        assert isinstance(mine["y0"], np.ndarray) and mine["y0"].shape == ort["y0"].shape
        assert _bits(mine["y0"]) == _bits(ort["y0"])


def test_numpy_arithmetic_leaves_to_onnxruntime_what_it_does_not_mirror():
    f32 = np.array([1.0, 2.0], np.float32)
    opset17 = [helper.make_opsetid("", 17)]
    nan_in = _arith_nodes(np.array([np.nan, 1.0], np.float32), f32, ("Add",))
    nan_made = _arith_nodes(np.array([np.inf], np.float32), np.array([np.inf], np.float32), ("Sub",))
    ints = _arith_nodes(np.array([7, -7], np.int64), np.array([2, 2], np.int64), ("Div",))
    halfs = _arith_nodes(f32.astype(np.float16), f32.astype(np.float16), ("Add",))
    relu = ([gs.Node("Relu", inputs=[gs.Constant("r", f32)], outputs=[gs.Variable("ry", np.float32)])], None)
    relu = (relu[0], relu[0][0].outputs)
    mixed = ([gs.Node("Add", inputs=[gs.Constant("m1", f32), gs.Constant("m2", f32.astype(np.float64))],
                      outputs=[gs.Variable("my")])], None)
    mixed = (mixed[0], mixed[0][0].outputs)
    unbroadcastable = _arith_nodes(f32, np.ones(3, np.float32), ("Add",))
    exported = _arith_nodes(f32, f32, ("Mul",))
    exported[0][0].inputs[0]._export_dtype = np.float16  # written (and read by onnxruntime) as float16
    for nodes, wanted in (nan_in, nan_made, ints, halfs, relu, mixed, unbroadcastable, exported):
        assert _fc._evaluate_numpy(nodes, wanted, opset17) is None
    # opset 6: Add had no numpy broadcasting
    nodes, wanted = _arith_nodes(f32, f32, ("Add",))
    assert _fc._evaluate_numpy(nodes, wanted, [helper.make_opsetid("", 6)]) is None
    assert _fc._evaluate_numpy(nodes, wanted, opset17) is not None


def test_a_cnn_s_bias_adds_fold_without_an_onnxruntime_session(monkeypatch):
    # fired: the float Adds of constants fold with numpy (a session would raise here), the result
    # is onnxruntime's bit for bit, -0.0 and a subnormal included
    nodes = [_const("c1", [1.0, -0.0, 1e-45]), _const("c2", [2.0, -0.0, 1e-45]), _const("c3", [0.5, 3.0, 2.0]),
             helper.make_node("Add", ["c1", "c2"], ["a"]), helper.make_node("Mul", ["a", "c3"], ["b"]),
             helper.make_node("Add", ["x", "b"], ["y"])]
    model = make_model(nodes, {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph

    def no_session(*args, **kwargs):
        raise AssertionError("an onnxruntime session was made")

    monkeypatch.setattr(_verify, "session", no_session)
    result = fold_constants(graph)
    assert result.stats["folded"] == 1 and result.stats["failed"] == 0
    assert ops(graph) == ["Add"]
    b = graph.nodes[0].inputs[1]
    assert b.name == "b" and b.dtype == np.float32
    expected = np.array([1.5, -0.0, 0.0], np.float32)
    expected[2] = np.float32(1e-45) * np.float32(4)  # (1 + 1 subnormal steps) * 2: exact
    assert _bits(b.values) == _bits(expected)
    monkeypatch.undo()
    proto = gp.to_proto(graph)
    onnx.checker.check_model(proto, full_check=True)
    assert_equivalent(model, proto, exact=True)
    # did not fire: a NaN constant is folded by onnxruntime (its NaN, bit for bit)
    nodes[0] = _const("c1", [np.nan, 1.0, 1.0])
    model = make_model(nodes, {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    calls = []
    real = _verify.session
    monkeypatch.setattr(_verify, "session", lambda m: calls.append(1) or real(m))
    assert fold_constants(graph).stats["folded"] == 1 and calls == [1]
    assert_equivalent(model, gp.to_proto(graph), exact=True)
