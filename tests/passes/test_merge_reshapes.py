import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.passes import merge_reshapes
from graphpass.testing import assert_equivalent, make_model, ops


def test_reshape_chain_collapses():
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Flatten", ["a"], ["b"], axis=1),
                        helper.make_node("Reshape", ["b", "s2"], ["y"])],
                       {"x": [2, 3, 4]}, {"y": [4, 6]},
                       initializers={"s1": np.array([6, 4], np.int64), "s2": np.array([4, -1], np.int64)})
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.modified and result.stats["merged"] == 2
    assert ops(graph) == ["Reshape"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_zero_entries_resolved_from_static_intermediate_shape():
    model = make_model([helper.make_node("Unsqueeze", ["x", "ax"], ["a"]),
                        helper.make_node("Reshape", ["a", "s"], ["y"])],
                       {"x": [2, 3, 4]}, {"y": [2, 12]},
                       initializers={"ax": np.array([0], np.int64), "s": np.array([0, 0, -1], np.int64)})
    # a: [1, 2, 3, 4]; Reshape(0, 0, -1) -> [1, 2, 12]. The 0s copy dims of `a`, not of `x`.
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 12
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 2
    graph = gp.load(model).graph
    merge_reshapes(graph)
    assert ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [1, 2, -1])
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_noop_reshape_removed_but_not_a_real_one():
    model = make_model([helper.make_node("Reshape", ["x", "same"], ["a"]),
                        helper.make_node("Relu", ["a"], ["r"]),
                        helper.make_node("Reshape", ["r", "other"], ["y"])],
                       {"x": [2, 3]}, {"y": [3, 2]},
                       initializers={"same": np.array([2, 3], np.int64), "other": np.array([3, 2], np.int64)})
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.stats["noop_removed"] == 1
    assert ops(graph) == ["Relu", "Reshape"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_dynamic_shape_input_not_merged():
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Reshape", ["a", "s2"], ["y"])],
                       {"x": [2, 3], "s2": (7, [2])}, {"y": [3, 2]},
                       initializers={"s1": np.array([6], np.int64)})
    graph = gp.load(model).graph
    assert not merge_reshapes(graph).modified


def test_chain_merges_through_a_dynamic_intermediate_when_the_target_has_no_zero():
    # The intermediate's shape is unknown (N is symbolic): without a 0 in the target it is not
    # needed, so the chain still collapses. Reading it anyway stops the merge.
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Reshape", ["a", "s2"], ["y"])],
                       {"x": ["N", 6]}, {"y": ["M", 2]},
                       initializers={"s1": np.array([-1, 3], np.int64), "s2": np.array([-1, 2], np.int64)})
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.stats["merged"] == 1
    assert ops(graph) == ["Reshape"] and graph.nodes[0].inputs[0] is graph.inputs[0]
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": x}, exact=True)


def test_allowzero_target_keeps_its_zero_as_a_dim():
    # allowzero=1: a 0 in the target is a dim of size 0, never "copy the input's dim".
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Reshape", ["a", "s2"], ["y"], allowzero=1)],
                       {"x": [2, 0, 3]}, {"y": [0, 3]},
                       initializers={"s1": np.array([6, 0], np.int64), "s2": np.array([0, 3], np.int64)},
                       opset=18)
    graph = gp.load(model).graph
    merge_reshapes(graph)
    assert ops(graph) == ["Reshape"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, [0, 3])
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.zeros((2, 0, 3), np.float32)}, exact=True)


def test_a_chain_that_changes_no_shape_disappears_unless_it_writes_a_graph_output():
    # [2,3] -> [6] -> [2,3] read by a Relu: both Reshapes go
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    inits = {"s1": np.array([6], np.int64), "s2": np.array([2, 3], np.int64)}
    model = make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, initializers=inits)
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.stats["merged"] == 1 and result.stats["noop_removed"] == 1 and ops(graph) == ["Relu"]
    assert graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)
    # the same chain writing the graph output keeps one Reshape (the output's name stays)
    model = make_model(nodes[:2], {"x": [2, 3]}, {"b": [2, 3]}, initializers=inits)
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.stats["merged"] == 1 and result.stats["noop_removed"] == 0 and ops(graph) == ["Reshape"]
    assert graph.outputs[0].name == "b" and graph.nodes[0].inputs[0] is graph.inputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_chain_read_inside_that_changes_the_shape_keeps_one_reshape():
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["b"]),
                        helper.make_node("Relu", ["b"], ["y"])],
                       {"x": [2, 3]}, {"y": [3, 2]},
                       initializers={"s1": np.array([6], np.int64), "s2": np.array([3, 2], np.int64)})
    graph = gp.load(model).graph
    result = merge_reshapes(graph)
    assert result.stats["merged"] == 1 and result.stats["noop_removed"] == 0 and ops(graph) == ["Reshape", "Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_zero_entry_after_an_intermediate_of_unknown_shape_is_not_merged():
    # the 0 copies a dim of the intermediate, whose shape is unknown: nothing to resolve it with
    model = make_model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                        helper.make_node("Reshape", ["a", "s2"], ["y"])],
                       {"x": [2, 3], "s1": (7, [2])}, {"y": ["d0", "d1"]},
                       initializers={"s2": np.array([0, -1], np.int64)})
    graph = gp.load(model).graph
    assert not merge_reshapes(graph).modified and ops(graph) == ["Reshape", "Reshape"]


import pytest  # noqa: E402
from onnx import TensorProto  # noqa: E402

from graphpass.passes.cleanup.merge_reshapes import compose_unsqueezes  # noqa: E402


def test_composed_unsqueeze_axes_match_numpy_on_every_small_case():
    import itertools

    for rank in range(0, 3):
        x = np.zeros(tuple(range(2, 2 + rank)))
        for n1 in (1, 2):
            for a1 in itertools.permutations(range(-(rank + n1), rank + n1), n1):
                y = np.expand_dims(x, a1) if len(set(np.mod(a1, rank + n1))) == n1 else None
                if y is None:
                    continue
                for a2 in itertools.combinations(range(-(y.ndim + 1), y.ndim + 1), 1):
                    z = np.expand_dims(y, a2)
                    axes = compose_unsqueezes(list(a1), list(a2), rank)
                    assert np.expand_dims(x, axes).shape == z.shape, (rank, a1, a2, axes)
                    if min(a1 + a2) >= 0:  # non-negative axes need no rank
                        assert compose_unsqueezes(list(a1), list(a2), None) == axes


def _unsqueezes(opset, a1, a2, x_shape=("n",), extra_reader=False):
    def unsq(src, axes, out):
        if opset >= 13:
            return helper.make_node("Unsqueeze", [src, out + "_axes"], [out])
        return helper.make_node("Unsqueeze", [src], [out], axes=axes)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), unsq("r", a1, "u1"), unsq("u1", a2, "y")]
    outputs = {"y": (TensorProto.FLOAT, None)}
    if extra_reader:
        nodes.append(unsq("u1", [0], "z"))
        outputs["z"] = (TensorProto.FLOAT, None)
    inits = {"u1_axes": np.array(a1, np.int64), "y_axes": np.array(a2, np.int64), "z_axes": np.array([0], np.int64)} if opset >= 13 else {}
    inits = {k: v for k, v in inits.items() if k != "z_axes" or extra_reader}
    return make_model(nodes, {"x": list(x_shape) if x_shape is not None else (TensorProto.FLOAT, None)}, outputs,
                      initializers=inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 21])
@pytest.mark.parametrize("a1, a2", [([0], [2]), ([1, 2], [0]), ([-1], [-1]), ([0, -1], [2])])
def test_two_unsqueezes_on_a_symbolic_dim_become_one(opset, a1, a2):
    """The dynamo exporter's position ids: Unsqueeze(Unsqueeze(arange(S), [0, 1]), [3])."""
    model = _unsqueezes(opset, a1, a2)
    graph = gp.load(model).graph
    assert merge_reshapes(graph).stats["merged"] == 1 and ops(graph) == ["Relu", "Unsqueeze"]
    after = gp.to_proto(graph)
    for n in (0, 1, 5):
        x = np.linspace(-2, 2, n).astype(np.float32)
        if n:
            x[0] = np.nan
        assert_equivalent(model, after, feeds={"x": x}, exact=True)


def test_an_unsqueeze_read_twice_feeds_both_readers_from_its_input():
    model = _unsqueezes(17, [0], [2], extra_reader=True)
    graph = gp.load(model).graph
    merge_reshapes(graph)
    from graphpass.passes import eliminate_dead_nodes
    eliminate_dead_nodes(graph)
    assert ops(graph) == ["Relu", "Unsqueeze", "Unsqueeze"]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.arange(3, dtype=np.float32)}, exact=True)


def test_negative_axes_on_an_input_of_unknown_rank_are_left_alone():
    model = _unsqueezes(17, [-1], [0], x_shape=None)
    graph = gp.load(model).graph
    graph.nodes[0].outputs[0].shape = None  # nobody knows r's rank
    assert not merge_reshapes(graph).modified and ops(graph) == ["Relu", "Unsqueeze", "Unsqueeze"]


def _gelu_between_reshapes(t2=(-1, 8), bias=None, extra_reader=False, middle="Tanh", x_shape=("n", 8)):
    """What torch's dynamo exporter writes around GPT-2's MLP GELU: [N, 8] -> [B, S, 8] -> tanh-GELU
    -> [-1, 8] (here B = N, S = 1)."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"]), n("Reshape", ["r", "t1"], ["v"]),
             n("Mul", ["v", "half"], ["a"]), n("Pow", ["v", "three"], ["p"]), n("Mul", ["p", "k"], ["b"]),
             n("Add", ["v", "b"], ["c"]), n(middle, ["c"], ["d"]), n("Add", ["d", "one"], ["e"]),
             n("Mul", ["a", "e"], ["f"]), n("Reshape", ["f", "t2"], ["y"])]
    inits = {"t1": np.array([-1, 1, 8], np.int64), "t2": np.array(t2, np.int64), "half": np.array(0.5, np.float32),
             "three": np.array(3.0, np.float32), "k": np.array([0.044715], np.float32), "one": np.array(1.0, np.float32)}
    outputs = {"y": list(x_shape) if len(t2) == len(x_shape) else (TensorProto.FLOAT, None)}
    if bias is not None:
        inits["half"] = bias
    if extra_reader:
        outputs["c"] = (TensorProto.FLOAT, None)
    return make_model(nodes, {"x": list(x_shape)}, outputs, initializers=inits)


def _special(n, width=8):
    x = np.linspace(-6, 6, n * width).astype(np.float32).reshape(n, width)
    flat = x.ravel()
    flat[::5] = np.resize(np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38], np.float32), flat[::5].size)
    return {"x": x}


def test_reshapes_around_an_elementwise_region_go_and_the_result_is_bitwise_equal():
    model = _gelu_between_reshapes()
    graph = gp.load(model).graph
    assert merge_reshapes(graph).stats["around_elementwise"] == 1
    assert "Reshape" not in ops(graph) and ops(graph).count("Mul") == 3
    after = gp.to_proto(graph)
    for n in (0, 1, 7):
        assert_equivalent(model, after, feeds=_special(n), exact=True)


@pytest.mark.parametrize("case", ["vector constant", "read elsewhere", "not back", "softmax", "scalar x"])
def test_reshapes_around_elementwise_ops_stay_where_the_region_is_not_shape_free(case):
    if case == "vector constant":  # a per-channel constant broadcasts by position: rank matters
        model = _gelu_between_reshapes(bias=np.full(8, 0.5, np.float32))
    elif case == "read elsewhere":
        model = _gelu_between_reshapes(extra_reader=True)
    elif case == "not back":
        model = _gelu_between_reshapes(t2=(-1, 4, 2), x_shape=("n", 8))
    elif case == "softmax":
        model = _gelu_between_reshapes(middle="Softmax")
    else:
        model = make_model([helper.make_node("Reshape", ["x", "t1"], ["v"]), helper.make_node("Add", ["v", "one"], ["a"]),
                            helper.make_node("Reshape", ["a", "t2"], ["y"])], {"x": []}, {"y": []},
                           initializers={"t1": np.array([1], np.int64), "t2": np.zeros([0], np.int64),
                                         "one": np.ones([1], np.float32)})
    graph = gp.load(model).graph
    before = ops(graph)
    result = merge_reshapes(graph)
    assert result.stats["around_elementwise"] == 0 and ops(graph).count("Reshape") >= 1
    assert_equivalent(model, gp.to_proto(graph), feeds=None if case == "scalar x" else _special(3), exact=True)
    assert before.count("Reshape") >= ops(graph).count("Reshape")


# -- mutation survivors of issue 20's rules (benchmarks/mutation.py --lines on them) ---------------

def test_repeated_or_out_of_range_unsqueeze_axes_do_not_compose():
    """compose_unsqueezes refuses axes the model would fail on, in either Unsqueeze alone."""
    assert compose_unsqueezes([0, 0], [1], 2) is None      # repeated in the first
    assert compose_unsqueezes([0], [1, -4], 2) is None     # 1 and -4 name one axis of the rank-5 result
    assert compose_unsqueezes([3], [0], 2) is None          # past the first result's rank 3
    assert compose_unsqueezes([0], [4], 2) is None          # past the second result's rank 4
    assert compose_unsqueezes([0], [3], 2) == [0, 3]


def test_unsqueezes_with_runtime_axes_are_left_alone():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unsqueeze", ["r", "a1"], ["u"]),
                        helper.make_node("Unsqueeze", ["u", "a2"], ["y"])],
                       {"x": [3], "a1": (TensorProto.INT64, [1])}, {"y": (TensorProto.FLOAT, None)},
                       initializers={"a2": np.array([0], np.int64)})
    graph = gp.load(model).graph
    assert not merge_reshapes(graph).modified and ops(graph) == ["Relu", "Unsqueeze", "Unsqueeze"]


def _around(t2, x_shape=(4, 8), t2_runtime=False):
    n = helper.make_node
    back = n("Reshape", ["a", "t2"], ["y"])
    inits = {"t1": np.array([-1, 2, 4], np.int64), "one": np.array(1.5, np.float32)}
    inputs = {"x": list(x_shape)}
    if t2_runtime:
        inputs["t2"] = (TensorProto.INT64, [len(t2)])
    else:
        inits["t2"] = np.array(t2, np.int64)
    return make_model([n("Reshape", ["x", "t1"], ["v"]), n("Mul", ["v", "one"], ["a"]), back], inputs,
                      {"y": (TensorProto.FLOAT, None)}, initializers=inits)


@pytest.mark.parametrize("t2, x_shape, kw, fused", [
    ((1, 32), (1, 32), {}, True),                 # a target holding 1s restores x [1, 32]
    ((-1, 8), ("n", 8), {}, True),                # the one -1 leaves x's symbolic dim
    ((4, 8), (4, 8), {"t2_runtime": True}, False),  # a target known only at run time
    ((2, 8), ("n", 8), {}, False),                # a symbolic dim against a number: the original fails unless n = 2
    ((0, 8), (4, 8), {}, False),                  # a 0 copies the intermediate's dim (4, 2, 4 -> 4, 8 only by chance)
    ((4, 8, 1), (4, 8), {}, False),               # another rank
])
def test_the_reshape_back_must_restore_x_shape_exactly(t2, x_shape, kw, fused):
    model = _around(t2, x_shape, **kw)
    graph = gp.load(model).graph
    assert merge_reshapes(graph).stats["around_elementwise"] == int(fused), (t2, x_shape)
    assert ("Reshape" not in ops(graph)) == fused
    if "n" in x_shape and not fused:
        return  # the original runs only for n = 2
    feeds = {"x": np.linspace(-3, 3, int(np.prod([d if d != "n" else 4 for d in x_shape]))).astype(np.float32)
             .reshape([d if d != "n" else 4 for d in x_shape])}
    if kw.get("t2_runtime"):
        feeds["t2"] = np.array(t2, np.int64)
    if (0, 8) == t2:
        return  # Reshape [8, 4] -> [0, 8] is invalid at run time: only the refusal matters
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


def test_a_region_fed_by_two_different_reshapes_is_left_alone():
    """Add(Reshape(x1), Reshape(x2)) then a Reshape back to x1's shape: the region has two first
    Reshapes; removing them would add x1 and x2 in their own shapes."""
    n = helper.make_node
    model = make_model([n("Reshape", ["x1", "t1"], ["v1"]), n("Reshape", ["x2", "t1b"], ["v2"]),
                        n("Add", ["v1", "v2"], ["a"]), n("Reshape", ["a", "t2"], ["y"])],
                       {"x1": [4, 8], "x2": [2, 16]}, {"y": [4, 8]},
                       initializers={"t1": np.array([-1, 2, 4], np.int64), "t1b": np.array([-1, 2, 4], np.int64),
                                     "t2": np.array([4, 8], np.int64)})
    graph = gp.load(model).graph
    assert merge_reshapes(graph).stats["around_elementwise"] == 0 and ops(graph).count("Reshape") == 3
    assert_equivalent(model, gp.to_proto(graph), exact=True)
