import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.passes import merge_concats
from graphpass.testing import assert_equivalent, make_model, ops


def test_same_axis_concat_chain_is_flattened():
    model = make_model([helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
                        helper.make_node("Concat", ["ab", "c"], ["y"], axis=1)],
                       {"a": [1, 2, 3], "b": [1, 3, 3], "c": [1, 1, 3]}, {"y": [1, 6, 3]})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["concats_merged"] == 1
    assert ops(graph) == ["Concat"] and [t.name for t in graph.nodes[0].inputs] == ["a", "b", "c"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_other_axis_or_shared_inner_concat_is_kept():
    model = make_model([helper.make_node("Concat", ["a", "b"], ["ab"], axis=2),
                        helper.make_node("Concat", ["ab", "c"], ["y"], axis=1)],
                       {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1, 2, 6]}, {"y": [1, 4, 6]})
    graph = gp.load(model).graph
    assert not merge_concats(graph).modified


def test_split_then_concat_of_all_parts_is_removed():
    model = make_model([helper.make_node("Split", ["x", "s"], ["p0", "p1", "p2"], axis=1),
                        helper.make_node("Concat", ["p0", "p1", "p2"], ["c"], axis=1),
                        helper.make_node("Relu", ["c"], ["y"])],
                       {"x": [2, 6, 3]}, {"y": [2, 6, 3]}, initializers={"s": np.array([1, 2, 3], np.int64)})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["split_concat_removed"] == 1
    assert ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_slice_chain_is_composed():
    model = make_model([helper.make_node("Slice", ["x", "s1", "e1", "a1"], ["t"]),
                        helper.make_node("Slice", ["t", "s2", "e2", "a2"], ["y"])],
                       {"x": [10, 8]}, {"y": [3, 4]},
                       initializers={"s1": np.array([2], np.int64), "e1": np.array([-1], np.int64), "a1": np.array([0], np.int64),
                                     "s2": np.array([1, 4], np.int64), "e2": np.array([4, 100], np.int64),
                                     "a2": np.array([0, 1], np.int64)})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["slices_composed"] == 1
    assert ops(graph) == ["Slice"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_inner_concat_read_twice_by_the_chain_is_kept():
    """Found by the fuzzer (benchmarks/fuzz.py): Concat(Concat(a, t), t) with t = Concat(x, x).
    Splicing the first input used to make t look single-reader and splice it too, leaving the
    second reference dangling."""
    model = make_model([helper.make_node("Concat", ["x", "x"], ["t"], axis=1),
                        helper.make_node("Concat", ["a", "t"], ["u"], axis=1),
                        helper.make_node("Concat", ["u", "t"], ["y"], axis=1)],
                       {"x": [1, 2, 3], "a": [1, 1, 3]}, {"y": [1, 9, 3]})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["concats_merged"] == 1
    assert sorted(ops(graph)) == ["Concat", "Concat"]
    final = next(n for n in graph.nodes if n.outputs[0].name == "y")
    assert [t.name for t in final.inputs] == ["a", "t", "t"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_negative_and_positive_axes_that_name_the_same_axis_merge():
    for inner, outer in ((-2, 1), (1, -2), (-1, -1), (0, -3)):
        shapes = {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1, 2, 3]}
        out = [1, 2, 3]
        out[outer] = 3 * out[outer] if outer != -3 else 3
        model = make_model([helper.make_node("Concat", ["a", "b"], ["ab"], axis=inner),
                            helper.make_node("Concat", ["ab", "c"], ["y"], axis=outer)], shapes, {"y": out})
        graph = gp.load(model).graph
        assert merge_concats(graph).stats["concats_merged"] == 1, (inner, outer)
        assert ops(graph) == ["Concat"]
        assert_equivalent(model, gp.to_proto(graph), exact=True)


def _slices(inner, outer, x_shape=(10, 8), runtime=()):
    """Slice(Slice(x, *inner), *outer); each is (starts, ends, axes or None, steps or None)."""
    inits, inputs, nodes, src = {}, {"x": list(x_shape)}, [], "x"
    for k, (params, out) in enumerate(((inner, "t"), (outer, "y"))):
        names = []
        for field, v in zip(("s", "e", "a", "p"), params):
            if v is None:
                names.append("")
                continue
            name = f"{field}{k}"
            if name in runtime:
                inputs[name] = (7, [len(v)])
            else:
                inits[name] = np.array(v, np.int64)
            names.append(name)
        while names[-1] == "":
            names.pop()
        nodes.append(helper.make_node("Slice", [src, *names], [out]))
        src = out
    return make_model(nodes, inputs, {"y": (1, None)}, initializers=inits)


def test_slice_chains_with_axes_steps_and_clamped_ends_are_composed():
    big = np.iinfo(np.int64).max
    cases = [
        (([1, 2], [9, 7], None, None), ([1], [100], None, None)),          # axes omitted: 0.. in order
        (([2], [-1], [-2], [1]), ([-3, 1], [big, -1], [-2, -1], [1, 1])),  # negative axes and starts, unit steps
        (([0, 1], [5, 8], [1, 0], None), ([1], [3], [1], None)),           # axes out of order
        (([-100], [5], [0], None), ([0], [2], [1], None)),                  # a start clamped to 0, another axis
        (([0], [-100], [0], None), ([0], [1], [1], None)),                  # an end clamped to 0: empty
        (([3], [0], [0], None), ([0], [1], [1], None)),                     # an end of 0 (not -0 from the back)
    ]
    for inner, outer in cases:
        model = _slices(inner, outer)
        graph = gp.load(model).graph
        assert merge_concats(graph).stats["slices_composed"] == 1, (inner, outer)
        assert ops(graph) == ["Slice"]
        assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_slice_chains_with_a_step_or_runtime_parameters_are_kept():
    ok = ([1], [9], [0], None)
    cases = [
        (([1], [9], [0], [2]), ok, ()),         # a step of 2
        (ok, ([0], [4], [0], [-1]), ()),        # a negative step
        (([1], [9], [0], [1]), ok, ("p0",)),     # runtime steps
        (([1], [9], [0], None), ok, ("s0",)),    # runtime starts
        (([1], [9], [0], None), ok, ("a0",)),    # runtime axes
        (ok, ([1], [9], [0], None), ("e1",)),    # runtime ends
    ]
    for inner, outer, runtime in cases:
        model = _slices(inner, outer, runtime=runtime)
        graph = gp.load(model).graph
        assert not merge_concats(graph).modified and ops(graph) == ["Slice", "Slice"], (inner, outer, runtime)


def test_concats_of_another_domain_are_not_touched():
    model = make_model([helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
                        helper.make_node("Concat", ["ab", "c"], ["y"], axis=1, domain="custom")],
                       {"a": [1, 2, 3], "b": [1, 3, 3], "c": [1, 1, 3]}, {"y": (1, None)}, extra_opsets={"custom": 1})
    graph = gp.load(model).graph
    assert not merge_concats(graph).modified and len(graph.nodes) == 2
    model = make_model([helper.make_node("Split", ["x", "s"], ["p0", "p1"], axis=1),
                        helper.make_node("Concat", ["p0", "p1"], ["c"], axis=1, domain="custom"),
                        helper.make_node("Relu", ["c"], ["y"])],
                       {"x": [2, 6, 3]}, {"y": (1, None)}, initializers={"s": np.array([2, 4], np.int64)},
                       extra_opsets={"custom": 1})
    graph = gp.load(model).graph
    assert not merge_concats(graph).modified and len(graph.nodes) == 3


def test_a_slice_chain_of_unknown_shape_is_kept():
    model = make_model([helper.make_node("Slice", ["x", "s", "e"], ["t"]), helper.make_node("Slice", ["t", "s", "e"], ["y"])],
                       {"x": ["n", 8]}, {"y": (1, None)},
                       initializers={"s": np.array([1], np.int64), "e": np.array([5], np.int64)})
    graph = gp.load(model).graph
    assert not merge_concats(graph).modified and ops(graph) == ["Slice", "Slice"]


def _split_concat(order=(0, 1, 2), split_axis=1, concat_axis=1, extra=(), out="c", sizes=(1, 2, 3)):
    nodes = [helper.make_node("Split", ["x", "s"], ["p0", "p1", "p2"], axis=split_axis),
             helper.make_node("Concat", [f"p{k}" for k in order], ["c"], axis=concat_axis),
             helper.make_node("Relu", ["c"], ["y"]), *extra]
    outputs = {"y": (1, None)}
    outputs.update({n.output[0]: (1, None) for n in extra})
    if out == "c":
        outputs["c"] = (1, None)
        del outputs["y"]
        nodes = nodes[:2] + list(extra)
    return make_model(nodes, {"x": [2, 6, 3]}, outputs, initializers={"s": np.array(sizes, np.int64)})


def test_split_concat_round_trips_only_of_all_parts_in_order_on_the_same_axis():
    kept = [
        _split_concat(order=(1, 0, 2), out="y"),                          # out of order
        _split_concat(order=(0, 1), out="y"),                             # not every part
        _split_concat(order=(0, 1, 2, 2), out="y"),                       # a part twice
        _split_concat(split_axis=-2, concat_axis=2, out="y", sizes=(2, 2, 2)),  # another axis (-2 is 1)
        _split_concat(extra=[helper.make_node("Neg", ["p1"], ["z"])], out="y"),  # a part read elsewhere
        _split_concat(),                                                  # the Concat writes a graph output
    ]
    for k, model in enumerate(kept):
        graph = gp.load(model).graph
        assert merge_concats(graph).stats["split_concat_removed"] == 0, k
        assert_equivalent(model, gp.to_proto(graph), exact=True)
    model = _split_concat(split_axis=-2, concat_axis=1, out="y")          # -2 and 1 are one axis
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["split_concat_removed"] == 1 and ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_one_part_split_then_a_one_input_concat_is_removed():
    model = make_model([helper.make_node("Split", ["x"], ["p0"], axis=1), helper.make_node("Concat", ["p0"], ["c"], axis=1),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": [2, 6, 3]}, {"y": [2, 6, 3]})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["split_concat_removed"] == 1 and ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_split_without_axis_splits_axis_0():
    model = make_model([helper.make_node("Split", ["x", "s"], ["p0", "p1"]), helper.make_node("Concat", ["p0", "p1"], ["c"], axis=0),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": [6, 2]}, {"y": [6, 2]},
                       initializers={"s": np.array([2, 4], np.int64)})
    graph = gp.load(model).graph
    assert merge_concats(graph).stats["split_concat_removed"] == 1 and ops(graph) == ["Relu"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


# -- issue 20: "merge_concats crashes (exit 3) on a Slice that has a steps input" ----------------------
# merge_concats reads a Slice's inputs in one place, `_slice_params`: starts/ends (1, 2), axes (3, or
# omitted: given as '' or absent) and steps (4, or omitted). These tests reach each of its paths with
# every form the steps input takes; none crashed on the starting commit (nor did 9,768 generated
# chains of these forms, nor 222 runs of the default and neutral pipelines on them), so they pin the
# behaviour: unit steps compose, any other step or a runtime parameter keeps both Slices.

def _slice_chain(inner, outer, dtype=np.int64, opset=13, runtime=(), in_loop=False):
    """Slice(Slice(x, *inner), *outer) over x[10, 8]; each is (starts, ends, axes or None,
    steps or None), None given as '' when a later input follows; parameters of ``dtype``;
    names in ``runtime`` are graph inputs. ``in_loop``: the chain is a Loop body's (its parameters
    initializers of the body, x from the outer scope), run twice."""
    inits, inputs, nodes, src = {}, {} if in_loop else {"x": [10, 8]}, [], "x"
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for k, (params, out) in enumerate(((inner, "t"), (outer, "y"))):
        names = []
        for field, v in zip(("s", "e", "a", "p"), params):
            if v is None:
                names.append("")
                continue
            name = f"{field}{k}"
            if name in runtime:
                inputs[name] = (elem, [len(v)])
            else:
                inits[name] = np.array(v, dtype)
            names.append(name)
        while names[-1] == "":
            names.pop()
        nodes.append(helper.make_node("Slice", [src, *names], [out]))
        src = out
    if not in_loop:
        return make_model(nodes, inputs, {"y": (1, None)}, initializers=inits, opset=opset)
    body = helper.make_graph(
        nodes + [helper.make_node("Identity", ["c"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return make_model([helper.make_node("Relu", ["x0"], ["x"]), helper.make_node("Loop", ["m", ""], ["ys"], body=body)],
                      {"x0": [10, 8]}, {"ys": (1, None)}, initializers={"m": np.array(2, np.int64)}, opset=opset)


_UNIT = ([1], [9], [0], [1])
_STEP_CASES = [
    # (inner, outer, composed?)
    (([1], [9], None, [1]), _UNIT, True),                     # axes omitted as '' before a steps input
    (([1, 0], [9, 7], None, [1, 1]), ([-8, 2], [-1, 100], [-2, -1], [1, 1]), True),  # two axes, negative axes
    (([1], [9], None, None), ([2], [5], [1], [1]), True),      # steps absent, then steps of 1 on another axis
    (([1], [9], None, [2]), _UNIT, False),                     # axes omitted, a step of 2
    (_UNIT, ([8], [0], None, [-1]), False),                     # axes omitted, a negative step
    (_UNIT, ([8], [-100], [0], [-2]), False),                   # a negative step running past the start
    (([1, 0], [9, 7], [0, 1], [1, 3]), _UNIT, False),           # a step of 1 beside a step of 3
]


@pytest.mark.parametrize("opset", [10, 13, 18])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_slices_with_a_steps_input_in_every_form_compose_only_on_unit_steps(opset, dtype):
    for inner, outer, composed in _STEP_CASES:
        model = _slice_chain(inner, outer, dtype, opset)
        graph = gp.load(model).graph
        stats = merge_concats(graph).stats
        assert stats["slices_composed"] == int(composed), (inner, outer)
        assert ops(graph) == (["Slice"] if composed else ["Slice", "Slice"]), (inner, outer)
        if composed:  # one Slice, no steps input (they were all 1), parameters of one type
            node = graph.nodes[0]
            assert len(node.inputs) == 4 and node.inputs[0].name == "x"
        assert_equivalent(model, gp.to_proto(graph), exact=True)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_steps_given_at_run_time_keep_both_slices(dtype):
    for runtime, inner, outer in ((("p1",), _UNIT, _UNIT), (("p0",), ([1], [9], None, [1]), _UNIT),
                                  (("a1",), _UNIT, ([0], [4], [1], [1]))):
        model = _slice_chain(inner, outer, dtype, runtime=runtime)
        graph = gp.load(model).graph
        assert not merge_concats(graph).modified and ops(graph) == ["Slice", "Slice"], runtime
        feeds = {"x": np.arange(80, dtype=np.float32).reshape(10, 8),
                 **{n: np.array(dict(zip("seap", (inner, outer)[int(n[1])]))[n[0]], dtype) for n in runtime}}
        assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


def test_a_slice_chain_with_steps_in_a_loop_body_is_composed_there_on_unit_steps():
    for dtype in (np.int64, np.int32):
        for inner, outer, composed in _STEP_CASES:
            model = _slice_chain(inner, outer, dtype, in_loop=True)
            graph = gp.load(model).graph
            assert merge_concats(graph).stats["slices_composed"] == int(composed), (dtype, inner, outer)
            body = graph.nodes[-1].attrs["body"]
            assert [n.op for n in body.nodes] == (["Slice"] if composed else ["Slice", "Slice"]) + ["Identity"]
            assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_optimize_on_slices_with_steps_exits_0_and_verifies(tmp_path):
    from graphpass.cli import main

    for k, (inner, outer, _) in enumerate(_STEP_CASES):
        for opset in (10, 18):
            src, out = tmp_path / f"in{k}_{opset}.onnx", tmp_path / f"out{k}_{opset}.onnx"
            onnx.save(_slice_chain(inner, outer, np.int32 if k % 2 else np.int64, opset), src)
            assert main(["optimize", str(src), "-o", str(out), "-q", "--verify"]) == 0, (inner, outer, opset)
            assert out.exists()
