import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes import fuse_matmul_add
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(2)


def test_2d_matmul_add_becomes_gemm_for_each_broadcast():
    for c_shape, first in (((7,), False), ((1, 7), True), ((4, 1), False), ((4, 7), True)):
        add = helper.make_node("Add", ["c", "mm"] if first else ["mm", "c"], ["y"])
        model = make_model([helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), add], {"x": [4, 5]}, {"y": [4, 7]},
                           initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32),
                                         "c": RNG.standard_normal(c_shape).astype(np.float32)})
        graph = gp.load(model).graph
        assert fuse_matmul_add(graph).stats["fired"] == 1
        assert ops(graph) == ["Gemm"] and graph.nodes[0].outputs[0].name == "y"
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)


def test_batched_matmul_is_refused_with_reason():
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "c"], ["y"])],
                       {"x": [2, 4, 5]}, {"y": [2, 4, 7]},
                       initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32), "c": np.zeros(7, np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_matmul_add(graph, ctx).modified
    assert "ranks 3 and 2" in ctx.explanations[0].reason


def test_addend_that_would_change_the_output_shape_is_refused():
    # [1,4,7] broadcasts the [4,7] product up to rank 3; [2,4,7] and [4,2] do not fit at all
    for c_shape in ((1, 4, 7), (2, 4, 7)):
        model = make_model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "c"], ["y"])],
                           {"x": [4, 5]}, {"y": list(c_shape)},
                           initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32),
                                         "c": RNG.standard_normal(c_shape).astype(np.float32)})
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not fuse_matmul_add(graph, ctx).modified
        assert "does not broadcast to [4, 7]" in ctx.explanations[0].reason


def test_integer_matmul_add_is_refused_with_reason():
    from onnx import TensorProto

    model = make_model([helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])],
                       {"a": (TensorProto.INT32, [3, 4])}, {"y": (TensorProto.INT32, [3, 5])},
                       initializers={"b": np.arange(20, dtype=np.int32).reshape(4, 5), "c": np.arange(5, dtype=np.int32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_matmul_add(graph, ctx).modified and ops(graph) == ["MatMul", "Add"]
    assert "float types only" in ctx.explanations[0].reason


def test_symbolic_or_unknown_operand_shapes_are_refused_with_reason():
    # a batch dim "N" on x: whether the addend broadcasts without growing the output is unknown
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "c"], ["y"])],
                       {"x": ["N", 5]}, {"y": ["N", 7]},
                       initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32),
                                     "c": RNG.standard_normal(7).astype(np.float32)})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_matmul_add(graph, ctx).modified and ops(graph) == ["MatMul", "Add"]
    assert ctx.explanations[0].reason == "a MatMul or Add operand has an unknown or symbolic shape"
