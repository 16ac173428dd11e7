"""simplify_shapes: shape arithmetic folded where the dims it reads are known (partial shapes)."""

import collections
import copy
import glob
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import eliminate_dead_nodes, simplify_shapes
from graphpass.passes.framework import PassContext
from graphpass.errors import BadModelError
from graphpass.testing import assert_equivalent, check_full, make_model, ops, ort_run

I64 = np.int64
INT64_MAX = np.iinfo(np.int64).max


def _simplify(model):
    """The model after simplify_shapes (and dead-node removal): (graph, stats, refusal reasons)."""
    graph = gp.load(model).graph
    ctx = PassContext()
    result = simplify_shapes(graph, ctx)
    eliminate_dead_nodes(graph)
    return graph, result, [e.reason for e in ctx.explanations if e.pass_name == "simplify_shapes"]


def _data(shape, seed=0):
    """Values that break things: NaN, +-inf, -0.0, a subnormal, float max."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32).ravel()
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo(np.float32).max], np.float32)
    x[: min(x.size, special.size)] = special[: x.size]
    return x.reshape(shape)


def _same(model, graph, shapes, name="x"):
    """Bitwise-equal outputs in onnxruntime (optimizations off) on inputs of every shape in
    ``shapes`` on which the original runs (Reshape(x, [N, C, -1]) fails for N = 0, before and after)."""
    after = gp.to_proto(graph)
    check_full(after)
    ran = 0
    for shape in shapes:
        feeds = {name: _data(shape)}
        try:
            ort_run(model, feeds)
        except BadModelError:
            continue
        assert_equivalent(model, after, feeds=feeds, exact=True)
        ran += 1
    assert ran >= 2, "the test must run the model on at least two shapes"


def _gather_concat(data, dims, tail, *, src="x"):
    """The exporters' chain: Shape(src) -> Gather(d) -> Unsqueeze -> Concat(..., tail) -> Reshape(data)."""
    nodes = [helper.make_node("Shape", [src], ["s"])]
    parts = []
    for d in dims:
        nodes += [helper.make_node("Gather", ["s", f"i{d}"], [f"g{d}"], axis=0),
                  helper.make_node("Unsqueeze", [f"g{d}", "ax0"], [f"u{d}"])]
        parts.append(f"u{d}")
    nodes += [helper.make_node("Concat", parts + ["tail"], ["t"], axis=0),
              helper.make_node("Reshape", [data, "t"], ["y"])]
    inits = {f"i{d}": np.array(d, I64) for d in dims}
    inits.update(ax0=np.array([0], I64), tail=np.array(tail, I64))
    return nodes, inits


# -- case 1: known shape arithmetic folds ------------------------------------------------------

def test_gathered_static_dims_fold_although_the_batch_is_symbolic():
    # OCR-style: the gathered dims (C, H) are static, the batch N is not; Reshape(relu, [N, C, H, -1])
    nodes, inits = _gather_concat("r", [0, 1, 2], [-1])
    model = make_model([helper.make_node("Relu", ["x"], ["r"])] + nodes, {"x": ["N", 3, 4, 5]}, {"y": ["N", 3, 4, 5]},
                       initializers=inits)
    graph, result, _ = _simplify(model)
    assert result.modified and result.stats["folded"] == 2 and result.stats["reshape_targets"] == 1
    assert ops(graph) == ["Relu", "Reshape"]
    # N is dim 0 of x, and of Relu(x) too: a 0 ("copy the input's dim") says so on every input
    np.testing.assert_array_equal(graph.nodes[1].inputs[1].values, [0, 3, 4, -1])
    _same(model, graph, [(0, 3, 4, 5), (1, 3, 4, 5), (7, 3, 4, 5)])


def test_one_unknown_entry_becomes_minus_one_when_the_others_are_known_nonzero():
    # the batch comes from another tensor (z): not provably x's dim 0, so it is the one -1
    nodes, inits = _gather_concat("x", [0, 1], [20], src="z")
    model = make_model([helper.make_node("Identity", ["zz"], ["z"])] + nodes,
                       {"x": ["N", 3, 4, 5], "zz": ["B", 3]}, {"y": ["B", 3, 20]}, initializers=inits)
    graph, result, reasons = _simplify(model)
    assert result.stats["reshape_targets"] == 1 and reasons == []
    assert ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [-1, 3, 20])
    after = gp.to_proto(graph)
    for n in (0, 1, 7):
        feeds = {"x": _data((n, 3, 4, 5)), "zz": _data((n, 3))}
        assert_equivalent(model, after, feeds=feeds, exact=True)


def test_a_fully_known_vector_becomes_one_constant():
    # Shape(x)[1:] of x [N, 3, 8]: [3, 8], whatever N is
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Slice", ["s", "st", "en"], ["sl"]),
                        helper.make_node("ConstantOfShape", ["sl"], ["y"])],
                       {"x": ["N", 3, 8]}, {"y": [3, 8]},
                       initializers={"st": np.array([1], I64), "en": np.array([INT64_MAX], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["ConstantOfShape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[0].values, [3, 8])
    _same(model, graph, [(0, 3, 8), (1, 3, 8), (7, 3, 8)])


@pytest.mark.parametrize("opset", [15, 18, 21])
def test_shape_start_end_attributes(opset):
    # opset 15+: Shape(x, start=-2) of [N, 6, 2] is [6, 2]; Shape(x, end=1) is [N], not known
    model = make_model([helper.make_node("Shape", ["x"], ["s"], start=-2),
                        helper.make_node("ConstantOfShape", ["s"], ["y"]),
                        helper.make_node("Shape", ["x"], ["n"], end=1),
                        helper.make_node("ConstantOfShape", ["n"], ["y2"])],
                       {"x": ["N", 6, 2]}, {"y": [6, 2], "y2": ["N"]}, opset=opset)
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["ConstantOfShape", "Shape", "ConstantOfShape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[0].values, [6, 2])
    _same(model, graph, [(0, 6, 2), (1, 6, 2), (7, 6, 2)])


def test_negative_gather_and_slice_indices_and_negative_steps():
    # s = Shape(x) = [N, 3, 5, 7]; Gather(-1) = 7; Slice(s, -2, -4, -1) = [5, 3]
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Gather", ["s", "m1"], ["g"], axis=0),
                        helper.make_node("Unsqueeze", ["g", "ax0"], ["u"]),
                        helper.make_node("Slice", ["s", "st", "en", "axs", "stp"], ["sl"]),
                        helper.make_node("Concat", ["mone", "sl", "u"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"])],
                       {"x": ["N", 3, 5, 7]}, {"y": ["N", 5, 3, 7]},
                       initializers={"m1": np.array(-1, I64), "ax0": np.array([0], I64), "st": np.array([-2], I64),
                                     "en": np.array([-4], I64), "axs": np.array([0], I64), "stp": np.array([-1], I64),
                                     "mone": np.array([-1], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1
    assert ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [-1, 5, 3, 7])
    _same(model, graph, [(0, 3, 5, 7), (1, 3, 5, 7), (7, 3, 5, 7)])


@pytest.mark.parametrize("opset", [11, 12, 13, 14, 17, 21])
def test_the_exporter_chain_on_every_opset(opset):
    # Unsqueeze/Squeeze take axes as an attribute before opset 13, as an input from 13 on
    ax = {"axes": [0]} if opset < 13 else {}
    axin = [] if opset < 13 else ["ax0"]
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Gather", ["s", "i1"], ["g1"], axis=0),
                        helper.make_node("Gather", ["s", "i2"], ["g2"], axis=0),
                        helper.make_node("Mul", ["g1", "g2"], ["hw"]),
                        helper.make_node("Unsqueeze", ["hw"] + axin, ["u"], **ax),
                        helper.make_node("Squeeze", ["u"] + axin, ["sq"], **ax),
                        helper.make_node("Unsqueeze", ["sq"] + axin, ["u2"], **ax),
                        helper.make_node("Concat", ["mone", "u2"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"])],
                       {"x": ["N", 4, 6]}, {"y": ["N", 24]}, opset=opset,
                       initializers={"i1": np.array(1, I64), "i2": np.array(2, I64), "ax0": np.array([0], I64),
                                     "mone": np.array([-1], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [-1, 24])
    _same(model, graph, [(0, 4, 6), (1, 4, 6), (7, 4, 6)])


def test_int32_shape_vectors_cast_to_int64():
    # tf2onnx style: Shape -> Cast(int32) -> Gather -> arithmetic in int32 -> Cast(int64)
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
                        helper.make_node("Gather", ["s32", "i1"], ["g"], axis=0),
                        helper.make_node("Add", ["g", "two"], ["g2"]),
                        helper.make_node("Unsqueeze", ["g2", "ax0"], ["u"]),
                        helper.make_node("Cast", ["u"], ["u64"], to=TensorProto.INT64),
                        helper.make_node("Concat", ["mone", "u64"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"])],
                       {"x": ["N", 4]}, {"y": ["M", 6]},
                       initializers={"i1": np.array(1, I64), "two": np.array(2, np.int32),
                                     "ax0": np.array([0], I64), "mone": np.array([-1], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [-1, 6])
    assert graph.nodes[0].inputs[1].values.dtype == np.int64
    _same(model, graph, [(0, 4), (3, 4), (6, 4)])


def test_integer_div_folds_for_nonnegative_operands_only():
    # C // 2 with C = 6 folds; (C - 13) / 2 = -7 / 2 is not folded (truncation vs floor: ONNX
    # does not say, onnxruntime truncates), and the graph still computes what it computed
    def model_for(sub):
        return make_model([helper.make_node("Shape", ["x"], ["s"]),
                           helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
                           helper.make_node("Sub", ["c", "k"], ["d"]),
                           helper.make_node("Div", ["d", "two"], ["q"]),
                           helper.make_node("Unsqueeze", ["q", "ax0"], ["y"])],
                          {"x": ["N", 6]}, {"y": (TensorProto.INT64, [1])},
                          initializers={"i1": np.array(1, I64), "k": np.array(sub, I64), "two": np.array(2, I64),
                                        "ax0": np.array([0], I64)})
    model = model_for(0)
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["Constant"]  # the graph output keeps its name
    assert graph.outputs[0].name == "y"
    _same(model, graph, [(0, 6), (2, 6)])
    model = model_for(13)
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and ops(graph) == ["Div", "Unsqueeze"]  # C - 13 = -7 is known
    assert graph.nodes[0].inputs[0].values == -7
    _same(model, graph, [(0, 6), (2, 6)])


def test_symbolic_dims_survive_neutral_arithmetic_and_int64_casts():
    # (N * 1 + 0) cast to int64 is still "dim 0 of x": the target becomes a constant [0, 12]
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
                        helper.make_node("Mul", ["n", "one"], ["n1"]),
                        helper.make_node("Add", ["zero", "n1"], ["n2"]),
                        helper.make_node("Cast", ["n2"], ["n3"], to=TensorProto.INT64),
                        helper.make_node("Unsqueeze", ["n3", "ax0"], ["u"]),
                        helper.make_node("Concat", ["u", "twelve"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"])],
                       {"x": ["N", 3, 4]}, {"y": ["N", 12]},
                       initializers={"i0": np.array(0, I64), "one": np.array(1, I64), "zero": np.array(0, I64),
                                     "ax0": np.array([0], I64), "twelve": np.array([12], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["reshape_targets"] == 1 and ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [0, 12])
    _same(model, graph, [(0, 3, 4), (1, 3, 4), (7, 3, 4)])


# -- case 2 refused, with the reason ---------------------------------------------------------

def test_two_unknown_entries_are_not_rewritten_and_say_why():
    nodes, inits = _gather_concat("x", [0, 1], [-1], src="z")
    model = make_model([helper.make_node("Identity", ["zz"], ["z"])] + nodes,
                       {"x": ["N", 3, 4], "zz": ["A", "B"]}, {"y": ["A", "B", "C"]}, initializers=inits)
    graph, result, reasons = _simplify(model)
    assert not result.modified
    assert reasons == ["target entries [0, 1] are unknown: at most one can become -1"]


def test_a_minus_one_is_not_written_next_to_an_entry_that_may_be_zero():
    # target [N, B] for x [N, K] (B from z): writing [0, -1] would fail when N = 0 (onnxruntime
    # cannot infer a -1 next to a zero product), where the original [0, B] runs
    model = make_model([helper.make_node("Shape", ["z"], ["sz"]),
                        helper.make_node("Shape", ["x"], ["sx"]),
                        helper.make_node("Gather", ["sx", "i0"], ["n"], axis=0),
                        helper.make_node("Unsqueeze", ["n", "ax0"], ["un"]),
                        helper.make_node("Concat", ["un", "sz"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"])],
                       {"x": ["N", "K"], "z": ["B"]}, {"y": ["N", "B"]},
                       initializers={"i0": np.array(0, I64), "ax0": np.array([0], I64)})
    graph, result, reasons = _simplify(model)
    assert result.stats["reshape_targets"] == 0
    assert reasons == ["entry 0 may be 0 at run time: the -1 for entry 1 would be ambiguous"]
    after = gp.to_proto(graph)
    for n, k, b in ((0, 4, 3), (2, 3, 3), (3, 4, 4)):
        assert_equivalent(model, after, feeds={"x": _data((n, k)), "z": _data((b,))}, exact=True)


def test_allowzero_copies_only_by_switching_it_off_and_a_literal_zero_blocks_that():
    # allowzero=1: a 0 is a size, not "copy"; N is x's own dim 0, so [N, 12] becomes [0, 12] with
    # allowzero=0 (copy gives N, 0 included); from another tensor, [B, 12] becomes [-1, 12]
    nodes, inits = _gather_concat("x", [0], [12])
    nodes[-1] = helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1)
    model = make_model(nodes, {"x": ["N", 3, 4]}, {"y": ["N", 12]}, initializers=inits, opset=14)
    graph, result, _ = _simplify(model)
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [0, 12])
    assert graph.nodes[0].attrs["allowzero"] == 0
    _same(model, graph, [(0, 3, 4), (1, 3, 4), (7, 3, 4)])
    nodes, inits = _gather_concat("x", [0], [12], src="z")
    nodes[-1] = helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1)
    model = make_model(nodes, {"x": ["N", 3, 4], "z": ["B"]}, {"y": ["B", 12]}, initializers=inits, opset=14)
    graph, result, _ = _simplify(model)
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [-1, 12])
    assert graph.nodes[0].attrs["allowzero"] == 1
    after = gp.to_proto(graph)
    for n in (0, 1, 7):
        assert_equivalent(model, after, feeds={"x": _data((n, 3, 4)), "z": _data((n,))}, exact=True)
    # a literal 0 beside x's own dim: copying would change what the 0 means, so nothing is rewritten
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Gather", ["s", "i0"], ["g"], axis=0),
                        helper.make_node("Unsqueeze", ["g", "ax0"], ["u"]),
                        helper.make_node("Shape", ["w"], ["k"]),
                        helper.make_node("Concat", ["u", "zero", "k"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1)],
                       {"x": ["N", 0, 3], "w": ["K"]}, {"y": ["N", 0, "K"]},
                       initializers={"i0": np.array(0, I64), "ax0": np.array([0], I64), "zero": np.array([0], I64)},
                       opset=14)
    graph, result, reasons = _simplify(model)
    assert not result.modified and reasons == ["target entries [0, 2] are unknown: at most one can become -1"]
    # allowzero=1 and a known 0 entry: no -1 may stand beside it
    nodes, inits = _gather_concat("x", [0], [0], src="z")
    nodes[-1] = helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1)
    model = make_model(nodes, {"x": [0, 3], "z": ["B"]}, {"y": ["B", 0]}, initializers=inits, opset=14)
    graph, result, reasons = _simplify(model)
    assert not result.modified and reasons == ["entry 1 is 0 with allowzero=1: a -1 cannot be inferred"]


def test_an_out_of_range_gather_is_left_to_fail():
    nodes, inits = _gather_concat("x", [0], [-1])
    inits["i0"] = np.array(5, I64)  # x has rank 2
    model = make_model(nodes, {"x": ["N", 3]}, {"y": ["N", 3]}, initializers=inits)
    graph, result, _ = _simplify(model)
    assert not result.modified


# -- cases 3-5: no-op Reshape / Expand / Tile removed ------------------------------------------

def test_reshape_to_the_shape_it_has_is_removed():
    # Reshape(relu(x), Shape(x)) and Reshape(x, [-1, 3, 4]) both leave x's shape as it is
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Reshape", ["r", "s"], ["a"]),
                        helper.make_node("Reshape", ["a", "t"], ["b"]),
                        helper.make_node("Neg", ["b"], ["y"])],
                       {"x": ["N", 3, 4]}, {"y": ["N", 3, 4]}, initializers={"t": np.array([-1, 3, 4], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 2 and ops(graph) == ["Relu", "Neg"]
    assert graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0]
    _same(model, graph, [(0, 3, 4), (1, 3, 4), (7, 3, 4)])


def test_reshape_that_may_change_the_shape_stays():
    # x [N, M, 4] -> [-1, M, 4]: when M = 0 the -1 cannot be inferred; x [N, 3] -> [3, -1] moves data
    model = make_model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Gather", ["s", "i1"], ["m"], axis=0),
                        helper.make_node("Unsqueeze", ["m", "ax0"], ["u"]),
                        helper.make_node("Concat", ["mone", "u", "four"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"]),
                        helper.make_node("Reshape", ["w", "t2"], ["y2"])],
                       {"x": ["N", "M", 4], "w": ["K", 3]}, {"y": ["N", "M", 4], "y2": [3, "K"]},
                       initializers={"i1": np.array(1, I64), "ax0": np.array([0], I64),
                                     "mone": np.array([-1], I64), "four": np.array([4], I64),
                                     "t2": np.array([3, -1], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 0 and ops(graph).count("Reshape") == 2
    # [-1, M, 4] -> [-1, 0, 4]: a constant, and still no no-op
    assert result.stats["reshape_targets"] == 1
    np.testing.assert_array_equal(graph.nodes[-2].inputs[1].values, [-1, 0, 4])


def test_expand_to_its_own_shape_is_removed_and_a_real_one_stays():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("Expand", ["r", "s"], ["a"]),       # to Shape(x): no-op
                        helper.make_node("Expand", ["a", "ones"], ["b"]),    # [1, 3]: no-op
                        helper.make_node("Expand", ["b", "wide"], ["y"])],   # [2, N, 3]: real
                       {"x": ["N", 3]}, {"y": [2, "N", 3]},
                       initializers={"ones": np.array([1, 3], I64), "wide": np.array([2, 1, 1], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 2 and ops(graph) == ["Relu", "Expand"]
    _same(model, graph, [(0, 3), (1, 3), (7, 3)])


def test_tile_by_ones_is_removed():
    model = make_model([helper.make_node("Tile", ["x", "reps"], ["a"]),
                        helper.make_node("Tile", ["a", "two"], ["y"])],
                       {"x": ["N", 3]}, {"y": ["M", 6]},
                       initializers={"reps": np.array([1, 1], I64), "two": np.array([1, 2], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 1 and ops(graph) == ["Tile"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [1, 2])
    _same(model, graph, [(0, 3), (1, 3), (7, 3)])


# -- scope: subgraphs, graph outputs, the pipeline ---------------------------------------------

def test_runs_inside_an_if_body_with_outer_scope_values():
    then_nodes, inits = _gather_concat("x", [0, 1], [-1])
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                             initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"])], "else", [],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)])
    model = make_model([helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)],
                       {"x": ["N", 3, 4], "c": (TensorProto.BOOL, [])}, {"out": (TensorProto.FLOAT, None)})
    graph, result, _ = _simplify(model)
    assert result.stats["reshape_targets"] == 1
    body = graph.nodes[0].attrs["then_branch"]
    assert ops(body) == ["Reshape"]
    np.testing.assert_array_equal(body.nodes[0].inputs[1].values, [0, 3, -1])
    after = gp.to_proto(graph)
    for n in (1, 7):  # N = 0 fails in the original: Reshape(x, [0, 3, -1])
        for c in (True, False):
            assert_equivalent(model, after, feeds={"x": _data((n, 3, 4)), "c": np.array(c)}, exact=True)


def test_in_the_cleanup_pipeline_after_fold_constants():
    from graphpass.passes.pipelines import CLEANUP, NEUTRAL, build
    assert CLEANUP.index("fold_constants") < CLEANUP.index("simplify_shapes") < CLEANUP.index("merge_reshapes")
    assert "simplify_shapes" in NEUTRAL and "simplify_shapes" in build("default")


def test_the_neutral_pipeline_leaves_one_reshape():
    nodes, inits = _gather_concat("r", [0, 1, 2], [-1])
    model = make_model([helper.make_node("Relu", ["x"], ["r"])] + nodes, {"x": ["N", 3, 4, 5]},
                       {"y": ["N", 3, 4, 5]}, initializers=inits)
    result = gp.optimize(model, pipeline="neutral", target="none")
    assert ops(result.graph) == ["Relu", "Reshape"]
    _same(model, result.graph, [(0, 3, 4, 5), (1, 3, 4, 5), (7, 3, 4, 5)])


# -- dims followed through the ops that keep or compute them ----------------------------------

def _forget(graph, *names):
    """Make the named tensors' shapes symbolic, as an exporter's stale value_info leaves them."""
    tensors = graph.tensors()
    for name in names:
        t = tensors[name]
        t.shape = [f"{name}_unk{i}" for i in range(len(t.shape))]


def _dims_of(nodes, inputs, t_name, axes, *, inits=None, opset=17, forget=(), feeds_list=()):
    """A model whose outputs are Shape(t)[k] for k in ``axes``; after simplify_shapes (with the
    tensors in ``forget`` made symbolic first) each is a constant equal to what onnxruntime
    computes on every feed."""
    outs = []
    for k in axes:
        nodes = nodes + [helper.make_node("Shape", [t_name], [f"s{k}"]),
                         helper.make_node("Gather", [f"s{k}", f"k{k}"], [f"d{k}"], axis=0)]
        outs.append(f"d{k}")
    inits = dict(inits or {}, **{f"k{k}": np.array(k, I64) for k in axes})
    model = make_model(nodes, inputs, {o: (TensorProto.INT64, []) for o in outs}, initializers=inits, opset=opset)
    graph = gp.load(model).graph
    _forget(graph, *(forget or (t_name,)))
    ctx = PassContext()
    result = simplify_shapes(graph, ctx)
    eliminate_dead_nodes(graph)
    assert result.stats["folded"] == len(axes), result.stats
    assert "Shape" not in ops(graph)
    after = gp.to_proto(graph)
    check_full(after)
    for feeds in feeds_list:
        assert_equivalent(model, after, feeds=feeds, exact=True)
    return graph


@pytest.mark.parametrize("attrs,kernel", [
    ({"strides": [2, 2], "pads": [1, 0, 2, 1]}, 3),
    ({"strides": [3, 1], "dilations": [2, 1]}, 3),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 3]}, 3),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 2),
    ({"auto_pad": "VALID", "strides": [2, 2]}, 4),
])
def test_conv_spatial_dims_follow_onnx_formula(attrs, kernel):
    w = np.ones((5, 3, kernel, kernel), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs)]
    feeds = [{"x": _data((n, 3, 17, 10))} for n in (1, 2)]
    _dims_of(nodes, {"x": ["N", 3, 17, 10]}, "c", [1, 2, 3], inits={"w": w}, feeds_list=feeds)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1], "dilations": [2, 1]}),
    ("AveragePool", {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("GlobalAveragePool", {}),
])
def test_pool_dims(op, attrs):
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs)]
    feeds = [{"x": _data((n, 3, 17, 10))} for n in (1, 3)]
    _dims_of(nodes, {"x": ["N", 3, 17, 10]}, "p", [1, 2, 3], feeds_list=feeds)


def test_ceil_mode_pooling_is_not_evaluated():
    model = make_model([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                        helper.make_node("Shape", ["p"], ["s"]),
                        helper.make_node("Gather", ["s", "k"], ["y"], axis=0)],
                       {"x": ["N", 3, 17, 10]}, {"y": (TensorProto.INT64, [])}, initializers={"k": np.array(2, I64)})
    graph = gp.load(model).graph
    _forget(graph, "p")
    assert not simplify_shapes(graph).modified


def test_concat_split_transpose_matmul_and_broadcast_dims():
    # r = Relu(x) [N, 6, 4]; c = Concat(r, r, axis=1) [N, 12, 4]; a, b = Split(c, [5, 7], axis=1);
    # t = Transpose(b, (0, 2, 1)) [N, 4, 7]; m = t @ W(7x3) [N, 4, 3]; q = m + bias(1, 3)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Concat", ["r", "r"], ["c"], axis=1),
             helper.make_node("Split", ["c", "sp"], ["a", "b"], axis=1),
             helper.make_node("Transpose", ["b"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "w"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["q"])]
    inits = {"sp": np.array([5, 7], I64), "w": np.ones((7, 3), np.float32), "bias": np.ones((1, 3), np.float32)}
    feeds = [{"x": _data((n, 6, 4))} for n in (1, 2)]
    _dims_of(nodes, {"x": ["N", 6, 4]}, "q", [1, 2], inits=inits, forget=("c", "a", "b", "t", "m", "q"),
             feeds_list=feeds)


def test_proven_dims_are_written_into_the_shapes():
    # what the evaluation proves replaces a stale symbolic dim, for the passes after it (the
    # fusions read static shapes); a dim it cannot prove stays as it was
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("Concat", ["r", "r"], ["c"], axis=1),
                        helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 1])],
                       {"x": ["N", 6, 4]}, {"y": ["N", 4, 12]})
    graph = gp.load(model).graph
    _forget(graph, "c", "y")
    result = simplify_shapes(graph)
    assert not result.modified and result.stats["dims_resolved"] == 4
    tensors = graph.tensors()
    assert tensors["c"].shape == ["c_unk0", 12, 4] and tensors["y"].shape == ["y_unk0", 4, 12]


def test_reshape_minus_one_as_a_quotient_of_symbolic_dims():
    # Reshape(x [B, S, 32], [0, 0, -1, 16]): the -1 is 32 / 16 = 2 whatever B and S are;
    # [0, -1, 16] leaves 2 * S: not one known dim
    model = make_model([helper.make_node("Reshape", ["x", "t"], ["h"]),
                        helper.make_node("Reshape", ["x", "t2"], ["h2"]),
                        helper.make_node("Shape", ["h"], ["s"]),
                        helper.make_node("Gather", ["s", "k"], ["y"], axis=0),
                        helper.make_node("Shape", ["h2"], ["s2"]),
                        helper.make_node("Gather", ["s2", "j"], ["y2"], axis=0)],
                       {"x": ["B", "S", 32]}, {"y": (TensorProto.INT64, []), "y2": (TensorProto.INT64, [])},
                       initializers={"t": np.array([0, 0, -1, 16], I64), "t2": np.array([0, -1, 16], I64),
                                     "k": np.array(2, I64), "j": np.array(1, I64)})
    graph = gp.load(model).graph
    _forget(graph, "h", "h2")
    result = simplify_shapes(graph)
    eliminate_dead_nodes(graph)
    assert result.stats["folded"] == 1 and ops(graph).count("Shape") == 1
    after = gp.to_proto(graph)
    for b, s in ((1, 3), (2, 7), (3, 1)):
        assert_equivalent(model, after, feeds={"x": _data((b, s, 32))}, exact=True)


def test_torch_expand_export_with_minus_one_sizes():
    # x.expand(z.size(0), -1, -1) as TorchScript writes it: sizes [B, -1, -1]; ConstantOfShape(1) * -1;
    # Equal; Where(eq, ones, sizes) = [B, 1, 1]. And e.expand(e.size(0), -1, -1) is a no-op.
    nodes = [helper.make_node("Shape", ["z"], ["sz"]),
             helper.make_node("Gather", ["sz", "i0"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["ub"]),
             helper.make_node("Concat", ["ub", "m1", "m1"], ["sizes"], axis=0),
             helper.make_node("ConstantOfShape", ["three"], ["ones"],
                              value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
             helper.make_node("Mul", ["ones", "m1s"], ["neg"]),
             helper.make_node("Equal", ["sizes", "neg"], ["eq"]),
             helper.make_node("Where", ["eq", "ones", "sizes"], ["w"]),
             helper.make_node("Expand", ["x", "w"], ["y"]),
             helper.make_node("Shape", ["e"], ["se"]),
             helper.make_node("Gather", ["se", "i0"], ["be"], axis=0),
             helper.make_node("Unsqueeze", ["be", "ax0"], ["ube"]),
             helper.make_node("Concat", ["ube", "m1", "m1"], ["sizes_e"], axis=0),
             helper.make_node("Equal", ["sizes_e", "neg"], ["eq_e"]),
             helper.make_node("Where", ["eq_e", "ones", "sizes_e"], ["w_e"]),
             helper.make_node("Expand", ["e", "w_e"], ["ex"]),
             helper.make_node("Neg", ["ex"], ["y2"])]
    inits = {"i0": np.array(0, I64), "ax0": np.array([0], I64), "m1": np.array([-1], I64),
             "three": np.array([3], I64), "m1s": np.array(-1, I64)}
    model = make_model(nodes, {"x": [1, 4, 5], "z": ["B", 2], "e": ["M", 4, 5]},
                       {"y": ["B", 4, 5], "y2": ["M", 4, 5]}, initializers=inits)
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 1
    assert "Equal" not in ops(graph) and ops(graph).count("Expand") == 1 and "Neg" in ops(graph)
    after = gp.to_proto(graph)
    for b, mm in ((0, 2), (1, 1), (7, 3)):
        feeds = {"x": _data((1, 4, 5)), "z": _data((b, 2)), "e": _data((mm, 4, 5), seed=1)}
        assert_equivalent(model, after, feeds=feeds, exact=True)


def test_a_deep_chain_of_concats_resolves_in_one_linear_walk():
    # DenseNet-like: each Concat reads the previous one; the dims are resolved in graph order, so
    # no recursion runs deep (a recursive walk from the end would overflow Python's stack)
    n = 1500
    nodes = [helper.make_node("Relu", ["x"], ["c0"])]
    for i in range(n):
        nodes.append(helper.make_node("Concat", [f"c{i}", "x"], [f"c{i + 1}"], axis=1))
    nodes += [helper.make_node("Shape", [f"c{n}"], ["s"]), helper.make_node("Gather", ["s", "k"], ["y"], axis=0)]
    model = make_model(nodes, {"x": ["N", 1]}, {"y": (TensorProto.INT64, [])}, initializers={"k": np.array(1, I64)})
    graph = gp.load(model).graph
    _forget(graph, *[f"c{i}" for i in range(1, n + 1)])
    result = simplify_shapes(graph)
    assert result.stats["folded"] == 1 and result.stats["dims_resolved"] == n
    assert graph.outputs[0].inputs[0].op == "Constant"
    after = gp.to_proto(graph)
    assert_equivalent(model, after, feeds={"x": _data((2, 1))}, exact=True)


def test_a_symbolic_reshape_entry_may_be_zero_and_copy_instead():
    # y = Reshape(x [1, 2, 3], [rows(z), 6]); when z has 0 rows the entry 0 copies x's dim (1), so
    # y's dim 0 is not rows(z): Expand(y, [rows(z), 6]) is no no-op (it makes [0, 6] from [1, 6])
    model = make_model([helper.make_node("Shape", ["z"], ["sz"]),
                        helper.make_node("Slice", ["sz", "zero", "one"], ["rows"]),
                        helper.make_node("Concat", ["rows", "six"], ["t"], axis=0),
                        helper.make_node("Reshape", ["x", "t"], ["y"]),
                        helper.make_node("Expand", ["y", "t"], ["out"])],
                       {"x": [1, 2, 3], "z": ["R", 2]}, {"out": ["R", 6]},
                       initializers={"zero": np.array([0], I64), "one": np.array([1], I64), "six": np.array([6], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 0 and ops(graph)[-2:] == ["Reshape", "Expand"]
    after = gp.to_proto(graph)
    for r in (0, 1):
        assert_equivalent(model, after, feeds={"x": _data((1, 2, 3)), "z": _data((r, 2))}, exact=True)


# -- real architectures -----------------------------------------------------------------------

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SHUFFLENET = os.path.join(_ROOT, "examples", "models", "shufflenet_v2_x0_5.onnx")


def test_shufflenet_with_a_dynamic_batch_loses_every_shape_chain():
    # ShuffleNetV2 as the TorchScript exporter writes it with a dynamic batch: each channel
    # shuffle's Reshape targets and each chunk come from Shape -> Gather -> Unsqueeze -> Concat
    model = onnx.load(_SHUFFLENET)
    without = gp.optimize(model, pipeline="cleanup", target="none", disable={"simplify_shapes"})
    result = gp.optimize(model, pipeline="cleanup", target="none")
    left = collections.Counter(ops(result.graph))
    assert not {"Shape", "Gather", "Unsqueeze", "Div"} & set(left), left
    assert len(result.graph.nodes) <= len(without.graph.nodes) - 140
    after = gp.to_proto(result.graph)
    for n in (1, 2):  # (N = 0 fails in onnxruntime before and after: a Reshape's -1 beside a 0)
        x = np.random.default_rng(n).standard_normal((n, 3, 224, 224)).astype(np.float32)
        assert_equivalent(model, after, feeds={"input": x}, exact=True)


_CORPUS = sorted(glob.glob(os.path.join(_ROOT, "tests", "data", "exporters", "*.onnx")))


@pytest.mark.parametrize("path", _CORPUS or [None], ids=[os.path.basename(p) for p in _CORPUS] or ["none"])
def test_the_exporter_corpus_keeps_its_outputs(path):
    # every committed export (tests/data/exporters and its manifest, when present): simplify_shapes
    # alone, then dead nodes removed; a valid model whose outputs are bitwise the original's, on
    # the manifest's valid inputs with the batch at 1 and 3
    if path is None:
        pytest.skip("no exporter corpus in this checkout")
    sys.path.insert(0, os.path.join(_ROOT, "tests", "exporters"))
    try:
        import _corpus
    finally:
        sys.path.pop(0)
    entry = next(e for e in _corpus.exported() if e["file"] == os.path.basename(path))
    model = gp.load(path)
    original = model.to_proto()
    simplify_shapes(model.graph)
    eliminate_dead_nodes(model.graph)
    after = model.to_proto()
    check_full(after)
    ran = 0
    for batch in (1, 3):
        e = copy.deepcopy(entry)
        for spec in e["example_inputs"].values():
            spec["shape"][0] = batch
        feeds = _corpus.feeds_for(e, seed=batch)
        try:
            ort_run(original, feeds)
        except BadModelError:
            continue  # (the detector's NMS export runs only at its exported batch)
        assert_equivalent(original, after, feeds=feeds, exact=True)
        ran += 1
    assert ran >= 1


def test_a_slice_that_takes_everything_is_removed():
    # x [1, 3, H, W]: [0:1] on axis 0 (dim known), [0:INT64_MAX] on axis 2 (dim symbolic) take all;
    # [0:H-ish] with a finite end on a symbolic dim, or a step of -1, do not
    model = make_model([helper.make_node("Slice", ["x", "z1", "o1", "z1", "o1"], ["a"]),
                        helper.make_node("Slice", ["a", "z1", "big", "two"], ["b"]),
                        helper.make_node("Slice", ["b", "z1", "thousand", "three"], ["c"]),
                        helper.make_node("Slice", ["c", "m1", "lowest", "z1", "m1"], ["y"])],
                       {"x": [1, 3, "H", "W"]}, {"y": [1, 3, "H", "W"]},
                       initializers={"z1": np.array([0], I64), "o1": np.array([1], I64),
                                     "big": np.array([INT64_MAX], I64), "two": np.array([2], I64),
                                     "thousand": np.array([1000], I64), "three": np.array([3], I64),
                                     "m1": np.array([-1], I64), "lowest": np.array([np.iinfo(np.int64).min], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 2 and ops(graph) == ["Slice", "Slice"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    after = gp.to_proto(graph)
    for h, w in ((0, 5), (4, 1001), (7, 3)):
        assert_equivalent(model, after, feeds={"x": _data((1, 3, h, w))}, exact=True)


def test_broadcast_of_two_tensors_and_gather_dims():
    # e = Gather(table, ids [B, S]) [B, S, 8]; p [1, S', 8] (another input); q = e + p: dim 0 is
    # B (p's is 1), dim 2 is 8; dim 1 is S or S' (equal wherever the Add runs): not one known dim
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("Add", ["e", "p"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Shape", ["ids"], ["si"]),
             helper.make_node("Slice", ["si", "z1", "o1"], ["b"]),
             helper.make_node("Concat", ["b", "m1", "eight"], ["t"], axis=0),
             helper.make_node("Reshape", ["q", "t"], ["y"]),
             helper.make_node("Gather", ["s", "k2"], ["d2"], axis=0)]
    inits = {"table": np.arange(80, dtype=np.float32).reshape(10, 8), "z1": np.array([0], I64),
             "o1": np.array([1], I64), "m1": np.array([-1], I64), "eight": np.array([8], I64),
             "k2": np.array(2, I64)}
    model = make_model(nodes, {"ids": (TensorProto.INT64, ["B", "S"]), "p": [1, "T", 8]},
                       {"y": ["B", "S", 8], "d2": (TensorProto.INT64, [])}, initializers=inits)
    graph = gp.load(model).graph
    _forget(graph, "e", "q")
    result = simplify_shapes(graph)
    eliminate_dead_nodes(graph)
    assert result.stats["folded"] == 1 and result.stats["reshape_targets"] == 1
    reshape = next(n for n in graph.nodes if n.op == "Reshape")
    np.testing.assert_array_equal(reshape.inputs[1].values, [0, -1, 8])
    after = gp.to_proto(graph)
    for b, s, t in ((1, 3, 3), (2, 5, 1), (3, 4, 4)):  # (B = 0 fails before and after: -1 beside a 0)
        feeds = {"ids": np.random.default_rng(b).integers(0, 10, (b, s)), "p": _data((1, t, 8))}
        assert_equivalent(model, after, feeds=feeds, exact=True)


def test_dim_param_names_are_trusted_only_when_asked():
    # x [batch, 12] reshaped by a target built from another input's "batch": two different dims
    # unless the user vouches for the names (trust_dim_params=True): then [0, 3, 4]
    nodes, inits = _gather_concat("x", [0], [3, 4], src="z")
    model = make_model(nodes, {"x": ["batch", 12], "z": ["batch", 2]}, {"y": ["batch", 3, 4]}, initializers=inits)
    graph, result, reasons = _simplify(model)
    np.testing.assert_array_equal(graph.nodes[-1].inputs[1].values, [-1, 3, 4])
    graph = gp.load(model).graph
    result = simplify_shapes(graph, trust_dim_params=True)
    eliminate_dead_nodes(graph)
    np.testing.assert_array_equal(graph.nodes[-1].inputs[1].values, [0, 3, 4])
    # what trusting means: with z's batch different from x's, the trusted rewrite copies x's
    # batch where the original took z's (and would have failed); on agreeing inputs both agree
    after = gp.to_proto(graph)
    assert_equivalent(model, after, feeds={"x": _data((3, 12)), "z": _data((3, 2))}, exact=True)
    with pytest.raises(BadModelError):
        ort_run(model, {"x": _data((3, 12)), "z": _data((2, 2))})
    assert ort_run(after, {"x": _data((3, 12)), "z": _data((2, 2))})["y"].shape == (3, 3, 4)


def _random_case(rng):
    """A random exporter-style shape computation on x [N, a, b, c]: pieces of Shape(x) (Gather
    with negative indices, Slice with negative bounds and steps, Shape's start/end), constants,
    int arithmetic, Cast through int32; the vector and Reshape(Relu(x), vector) are outputs."""
    dims = [int(v) for v in rng.integers(1, 5, 3)]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["x"], ["s"])]
    inits, parts = {}, []

    def const(name, value):
        inits[name] = np.array(value, I64)
        return name

    for k in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 5)
        out = f"p{k}"
        if kind == 0:
            i = int(rng.integers(-4, 4))
            nodes += [helper.make_node("Gather", ["s", const(f"gi{k}", i)], [f"g{k}"], axis=0),
                      helper.make_node("Unsqueeze", [f"g{k}", const(f"ax{k}", [0])], [out])]
        elif kind == 1:
            st, en, sp = int(rng.integers(-5, 5)), int(rng.integers(-5, 5)), int(rng.choice([-2, -1, 1, 2]))
            nodes.append(helper.make_node("Slice", ["s", const(f"st{k}", [st]), const(f"en{k}", [en]),
                                                    const(f"a{k}", [0]), const(f"sp{k}", [sp])], [out]))
        elif kind == 2:
            nodes.append(helper.make_node("Shape", ["x"], [out], start=int(rng.integers(-4, 4)),
                                          end=int(rng.integers(-4, 5))))
        elif kind == 3:
            i, j = int(rng.integers(0, 4)), int(rng.integers(0, 4))
            op = str(rng.choice(["Mul", "Add", "Sub", "Div"]))
            nodes += [helper.make_node("Gather", ["s", const(f"gi{k}", [i])], [f"g{k}"], axis=0),
                      helper.make_node("Gather", ["s", const(f"gj{k}", [j])], [f"h{k}"], axis=0),
                      helper.make_node(op, [f"g{k}", f"h{k}"], [out])]
        else:
            nodes += [helper.make_node("Cast", ["s"], [f"c{k}"], to=TensorProto.INT32),
                      helper.make_node("Gather", [f"c{k}", const(f"gi{k}", [int(rng.integers(-4, 4))])], [f"d{k}"],
                                       axis=0),
                      helper.make_node("Cast", [f"d{k}"], [out], to=TensorProto.INT64)]
        parts.append(out)
    if rng.integers(0, 2):
        parts.append(const("tail", [-1]))
    nodes += [helper.make_node("Concat", parts, ["t"], axis=0), helper.make_node("Identity", ["t"], ["vec"]),
              helper.make_node("Reshape", ["r", "t"], ["y"])]
    model = make_model(nodes, {"x": ["N"] + dims}, {"vec": (TensorProto.INT64, None), "y": (TensorProto.FLOAT, None)},
                       initializers=inits, opset=18)
    return model, dims


def test_random_shape_computations_keep_every_value():
    rng = np.random.default_rng(20)
    ran = changed = 0
    for case in range(40):
        model, dims = _random_case(rng)
        graph, result, _ = _simplify(model)
        changed += result.modified
        after = gp.to_proto(graph)
        try:
            check_full(model)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
            pass  # an impossible Reshape the checker sees statically: it sees it after too
        else:
            check_full(after)
        for n in (0, 1, 3):
            feeds = {"x": _data([n] + dims, seed=case)}
            try:
                ort_run(model, feeds)
            except BadModelError:
                continue  # the original fails on this input: nothing to keep
            assert_equivalent(model, after, feeds=feeds, exact=True)
            ran += 1
    assert ran >= 40 and changed >= 30, (ran, changed)


def test_runs_inside_a_loop_body_with_outer_scope_and_carried_values():
    # body: acc = Reshape(acc + x, [N (from Shape(x) outside), 12]) on a carried [?, 12]: the
    # Reshape keeps the shape wherever it runs (12 is known and nonzero), so it goes
    body_nodes = [helper.make_node("Add", ["acc_in", "x"], ["s"]),
                  helper.make_node("Reshape", ["s", "t"], ["acc_out"]),
                  helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, ["N", 12])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["N", 12])])
    model = make_model([helper.make_node("Shape", ["x"], ["sx"]),
                        helper.make_node("Slice", ["sx", "z1", "o1"], ["n"]),
                        helper.make_node("Concat", ["n", "twelve"], ["t"], axis=0),
                        helper.make_node("Loop", ["trips", "", "x"], ["acc"], body=body)],
                       {"x": ["N", 12], "trips": (TensorProto.INT64, [])}, {"acc": ["N", 12]},
                       initializers={"z1": np.array([0], I64), "o1": np.array([1], I64),
                                     "twelve": np.array([12], I64)})
    graph, result, _ = _simplify(model)
    assert result.stats["noop_removed"] == 1
    assert ops(graph) == ["Loop"] and ops(graph.nodes[0].attrs["body"]) == ["Add", "Identity"]
    after = gp.to_proto(graph)
    for n, trips in ((0, 2), (1, 0), (3, 3)):
        feeds = {"x": _data((n, 12)), "trips": np.array(trips, I64)}
        assert_equivalent(model, after, feeds=feeds, exact=True)


def test_a_value_no_reader_accepts_as_an_initializer_is_not_folded():
    # Range takes a [1] bound computed at run time but onnxruntime refuses one as an initializer
    # (the ONNX function of AffineGrid reads one through an If or an Identity)
    model = make_model([helper.make_node("Identity", ["one_1d"], ["d"]),
                        helper.make_node("Range", ["z", "d", "o"], ["r"])],
                       {}, {"r": (TensorProto.INT64, [None])}, opset=20,
                       initializers={"one_1d": np.array([2], I64), "z": np.array(0, I64), "o": np.array(1, I64)})
    graph, result, reasons = _simplify(model)
    assert not result.modified and ops(graph) == ["Identity", "Range"]
    assert reasons == ["Range cannot take this value as a constant input 1 (onnxruntime refuses it at load)"]
    assert_equivalent(model, gp.to_proto(graph), feeds={}, exact=True)


def test_a_known_range_bound_of_shape_1_is_not_folded_to_an_initializer_range_refuses():
    # integration of simplify_shapes with inline_control_flow (attack branch): Range runs a [1]
    # bound computed at run time, but onnxruntime refuses a [1] initializer there at load
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
             helper.make_node("Identity", ["s"], ["d"]),
             helper.make_node("Range", ["z", "d", "o"], ["r"])]
    model = make_model(nodes, {"x": (TensorProto.FLOAT, [3, "n"])}, {"r": (TensorProto.INT64, [None])}, opset=20,
                       initializers={"z": np.array(0, I64), "o": np.array(1, I64)})
    graph, result, _ = _simplify(model)
    assert "Range" in ops(graph)
    after = gp.to_proto(graph)
    check_full(after)
    assert_equivalent(model, after, feeds={"x": _data((3, 2))}, exact=True)


def test_allowzero_with_a_minus_one_is_not_switched_to_copy():
    # (attack branch) Reshape(x, [N, -1], allowzero=1) with N x's own dim 0: onnxruntime runs it at
    # N = 0 ((0, 3, 2) -> (0, 6)); [0, -1] with allowzero=0 copies the 0 and then fails to infer -1
    nodes, inits = _gather_concat("x", [0], [-1])
    nodes[-1] = helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=1)
    model = make_model(nodes, {"x": ["N", 3, "C"]}, {"y": ["N", None]}, initializers=inits, opset=14)
    graph, result, _ = _simplify(model)
    reshape = [n for n in graph.nodes if n.op == "Reshape"][0]
    assert reshape.attrs["allowzero"] == 1
    _same(model, graph, [(0, 3, 2), (0, 3, 0), (1, 3, 2), (4, 3, 1)])


# -- mutation survivors of the shape-value logic (benchmarks/mutation.py --files passes/cleanup/_shape_values.py=...)

def test_slice_indices_follow_onnxruntime_slice_on_every_small_case():
    """ONNX Slice's index rules (negative starts/ends add n, then clamp to [0, n] for a positive
    step, to [0, n-1] and [-1, n-1] for a negative one; not Python's: a start before the front
    with a negative step takes element 0), checked against onnxruntime's Slice itself, except
    where onnxruntime leaves the spec: an end of INT64_MAX with a negative step runs through the
    front in onnxruntime 1.32, where the spec clamps the end to n - 1 (nothing from a start at
    n - 1): slice_indices gives None there (not evaluated)."""
    import onnxruntime as ort

    from graphpass.passes.cleanup._shape_values import slice_indices

    model = make_model([helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])],
                       {"x": (TensorProto.INT64, ["n"]), "s": (TensorProto.INT64, [1]), "e": (TensorProto.INT64, [1]),
                        "p": (TensorProto.INT64, [1])}, {"y": (TensorProto.INT64, ["k"])},
                       initializers={"a": np.array([0], np.int64)})
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    big = np.iinfo(np.int64).max
    for n in range(0, 4):
        for start in (-big - 1, -big, -n - 1, -n, -2, -1, 0, 1, 2, n - 1, n, n + 3, big):
            for end in (-big - 1, -n - 1, -n, -2, -1, 0, 1, 2, n - 1, n, n + 3, big):
                for step in (-2, -1, 1, 2):
                    if end == big and step < 0:  # where onnxruntime leaves the spec: not evaluated
                        assert slice_indices(n, start, end, step) is None
                        continue
                    want = sess.run(None, {"x": np.arange(n, dtype=np.int64), "s": np.array([start], np.int64),
                                           "e": np.array([end], np.int64), "p": np.array([step], np.int64)})[0]
                    assert list(slice_indices(n, start, end, step)) == want.tolist(), (n, start, end, step)


def test_symbolic_products_divide_only_exactly():
    import onnx_graphsurgeon as gs

    from graphpass.passes.cleanup._shape_values import Dim, Param, Product

    t = gs.Variable("t", np.float32, ["n", "m"])
    n, m = Dim(t, 0), Dim(t, 1)
    assert Product([6, n]).divide(Product([3])) is None          # 2 * n: not one dim
    assert Product([6]).divide(Product([4])) is None             # not exact
    assert Product([6]).divide(Product([0])) is None
    assert Product([6]).divide(Product([-2])) is None
    assert Product([6]).divide(Product([3])) == 2
    assert Product([2, n]).divide(Product([2])) is n
    assert Product([n, n]).divide(Product([n])) is n             # a dim counted twice
    assert Product([n, m]).divide(Product([1])) is None          # two dims left
    assert Product([n]).divide(Product([m])) is None
    assert Product([n, 4]).divide(Product([n, 2])) == 2
    assert Param("N") == Param("N") and Param("N") != Param("M") and Param("N") != n and n != Param("N")


def test_only_small_int_or_bool_vectors_are_tracked():
    from graphpass.passes.cleanup._shape_values import MAX_ELEMS, from_array

    assert from_array(np.array([1, 2], np.int64)).ints() == [1, 2]
    assert from_array(np.array(3, np.int32)).scalar
    assert from_array(np.array([1.0, 2.0], np.float32)) is None
    assert from_array(np.zeros((2, 2), np.int64)) is None
    assert from_array(np.zeros(MAX_ELEMS + 1, np.int64)) is None
    assert from_array(np.zeros(MAX_ELEMS, np.int64)) is not None


@pytest.mark.parametrize("start", [-1, 2, np.iinfo(np.int64).max])
def test_a_backward_slice_of_a_shape_to_int64_max_is_not_folded(start):
    """Found by the slice_indices check against onnxruntime: for a negative step the spec clamps an
    end of INT64_MAX to n - 1 (nothing taken), onnxruntime 1.32 reads it as "through the front"
    (Shape [2, 3, 4] sliced [-1:INT64_MAX:-1] gives [4, 3, 2]). Folding it either way would differ
    from one of them: graphpass neither folds the values nor the length."""
    big = np.iinfo(np.int64).max
    model = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "st", "en", "ax", "p"], ["v"]),
                        helper.make_node("Cast", ["v"], ["y"], to=TensorProto.INT64)],
                       {"x": [2, 3, 4]}, {"y": (TensorProto.INT64, None)},
                       initializers={"st": np.array([start], np.int64), "en": np.array([big], np.int64),
                                     "ax": np.array([0], np.int64), "p": np.array([-1], np.int64)})
    graph = gp.load(model).graph
    simplify_shapes(graph)
    assert "Slice" in ops(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.zeros((2, 3, 4), np.float32)}, exact=True)
    result = gp.optimize(model)
    assert_equivalent(model, gp.to_proto(result.model), feeds={"x": np.zeros((2, 3, 4), np.float32)}, exact=True)


def test_ops_of_another_domain_named_like_shape_ops_are_not_evaluated():
    """A custom-domain 'Shape' or 'Gather' is not ONNX's: nothing folds (mutation survivor, the
    Fold rule's domain guard)."""
    model = make_model([helper.make_node("Shape", ["x"], ["s"], domain="custom"),
                        helper.make_node("Gather", ["s", "i"], ["y"], axis=0)],
                       {"x": [2, 3]}, {"y": (TensorProto.INT64, None)}, initializers={"i": np.array(1, np.int64)},
                       extra_opsets={"custom": 1})
    graph, result, _ = _simplify(model)
    assert not result.modified and [(n.op, n.domain) for n in graph.nodes] == [("Shape", "custom"), ("Gather", None)]
    model = make_model([helper.make_node("Shape", ["x"], ["s"], domain="custom")], {"x": [2, 3]},
                       {"s": (TensorProto.INT64, None)}, extra_opsets={"custom": 1})
    graph, result, _ = _simplify(model)
    assert not result.modified and [n.op for n in graph.nodes] == ["Shape"]


@pytest.mark.parametrize("op, k", [("Div", 2), ("Mul", 2), ("Add", 1), ("Sub", 1), ("Div", 1), ("Mul", 1), ("Add", 0)])
def test_a_symbolic_dim_combined_with_a_number_equals_the_dim_only_for_the_neutral_number(op, k):
    """Equal(N op k, N) on a symbolic N: true (folded) only for k = 1 (Mul, Div) or 0 (Add, Sub);
    otherwise unknown, computed at run time (mutation survivor: `_elem`'s Div returned N for N / 2,
    and Equal then folded to true)."""
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["r"]), n("Shape", ["r"], ["s"]), n("Gather", ["s", "zero"], ["b"], axis=0),
                        n(op, ["b", "k"], ["bk"]), n("Equal", ["bk", "b"], ["e"]), n("Cast", ["e"], ["y"], to=TensorProto.INT64)],
                       {"x": ["N", 4]}, {"y": (TensorProto.INT64, [])},
                       initializers={"zero": np.array(0, np.int64), "k": np.array(k, np.int64)})
    graph, result, _ = _simplify(model)
    neutral = k == (1 if op in ("Mul", "Div") else 0)
    assert ("Equal" not in ops(graph)) == neutral, ops(graph)
    _same(model, graph, [(1, 4), (4, 4), (7, 4)])


@pytest.mark.parametrize("cond", [True, False])
def test_where_of_three_one_element_values_folds_to_the_picked_one(cond):
    """Where(c, dim 1 of x, 7) with every operand a scalar: the picked scalar (mutation survivor of
    `_where`: the broadcast length of three one-element operands is 1)."""
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["r"]), n("Shape", ["r"], ["s"]), n("Gather", ["s", "one"], ["d"], axis=0),
                        n("Where", ["c", "d", "seven"], ["w"]), n("Unsqueeze", ["w", "ax"], ["w1"]),
                        n("Concat", ["m1", "w1"], ["t"], axis=0), n("Reshape", ["r", "t"], ["y"])],
                       {"x": ["N", 4, 7]}, {"y": (TensorProto.FLOAT, None)},
                       initializers={"one": np.array(1, np.int64), "c": np.array(cond), "seven": np.array(7, np.int64),
                                     "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64)})
    graph, result, _ = _simplify(model)
    assert "Where" not in ops(graph) and result.modified
    _same(model, graph, [(1, 4, 7), (2, 4, 7), (0, 4, 7)])


def test_an_allowzero_reshape_s_zero_entry_is_a_zero_dim():
    """Reshape(r, [0, 5], allowzero=1) of an empty r: its dim 0 is 0 whatever r is, so Shape of it
    folds to [0, 5] (mutation survivor of `_reshape_dim`: 0 read as 1)."""
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["r"]), n("Reshape", ["r", "t"], ["v"], allowzero=1), n("Shape", ["v"], ["y"])],
                       {"x": ["N", 0]}, {"y": (TensorProto.INT64, [2])}, initializers={"t": np.array([0, 5], np.int64)})
    graph, result, _ = _simplify(model)
    assert result.stats["folded"] == 1 and "Shape" not in ops(graph)
    _same(model, graph, [(1, 0), (3, 0)])
