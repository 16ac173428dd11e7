import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import merge_slices
from graphpass.passes.framework import PassContext
from graphpass.testing import assert_equivalent, make_model, ops

I64_MAX = int(np.iinfo(np.int64).max)
I64_MIN = int(np.iinfo(np.int64).min)


def _slice(name, src, dst, starts, ends, axes=None, steps=None, *, opset=13, dtype=np.int64, inits=None):
    """A Slice node (Slice-1 attributes when opset < 10), its constant inputs added to ``inits``."""
    if opset < 10:
        attrs = {"starts": starts, "ends": ends}
        if axes is not None:
            attrs["axes"] = axes
        return helper.make_node("Slice", [src], [dst], name=name, **attrs)
    ins = [src]
    for what, v in (("s", starts), ("e", ends), ("a", axes), ("t", steps)):
        if v is None:
            ins.append("")
            continue
        inits[f"{name}_{what}"] = np.array(v, dtype=dtype)
        ins.append(f"{name}_{what}")
    while ins[-1] == "":
        ins.pop()
    return helper.make_node("Slice", ins, [dst], name=name)


def _chain(shape, params, *, opset=13, dtype=np.int64, elem=TensorProto.FLOAT, extra_out=None):
    inits, nodes, src = {}, [], "x"
    for k, p in enumerate(params):
        dst = "y" if k == len(params) - 1 else f"m{k}"
        nodes.append(_slice(f"s{k}", src, dst, *p, opset=opset, dtype=dtype, inits=inits))
        src = dst
    outs = {"y": (elem, None)}
    if extra_out:
        outs[extra_out] = (elem, None)
    return make_model(nodes, {"x": (elem, shape)}, outs, initializers=inits, opset=opset)


def _feeds(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo(np.float32).max], dtype=np.float32)
    flat = x.reshape(-1)
    flat[: min(len(flat), len(special))] = special[: len(flat)].astype(dtype)
    return {"x": x}


def _merged(model):
    graph = gp.load(model).graph
    ctx = PassContext()
    result = merge_slices(graph, ctx)
    return graph, result, ctx


def test_two_slices_on_one_axis_compose_into_one_exactly():
    bounds = [0, 1, 2, -1, -3, 4, 6, 9, -9, I64_MAX, I64_MIN]
    steps = [1, 2, 3, -1, -2, -4]
    rng = np.random.default_rng(7)
    fired = 0
    for n in (0, 1, 5, 7):
        cases = [(s1, e1, t1, s2, e2, t2) for s1, e1, t1, s2, e2, t2 in
                 (tuple(rng.choice(bounds, 2)) + (rng.choice(steps),) + tuple(rng.choice(bounds, 2)) + (rng.choice(steps),)
                  for _ in range(40))]
        for s1, e1, t1, s2, e2, t2 in cases:
            model = _chain([3, n], [([int(s1)], [int(e1)], [1], [int(t1)]), ([int(s2)], [int(e2)], [1], [int(t2)])])
            graph, result, ctx = _merged(model)
            backward_max = (t1 < 0 and e1 == I64_MAX) or (t2 < 0 and e2 == I64_MAX)
            if backward_max:  # onnxruntime and the spec disagree: left alone
                assert not result.modified and "INT64_MAX" in ctx.explanations[0].reason
                continue
            assert result.modified, (n, s1, e1, t1, s2, e2, t2)
            assert ops(graph) == ["Slice"]
            fired += 1
            out = gp.to_proto(graph)
            assert_equivalent(model, out, _feeds([3, n]), exact=True)
            if fired % 40 == 1:
                onnx.checker.check_model(out, full_check=True)
    assert fired > 100


def test_disjoint_axes_merge_on_symbolic_dims_and_negative_axes():
    model = _chain(["N", "C", 8], [([1], [I64_MAX], [-1], [2]), ([0], [-1], [1], [1])])
    graph, result, _ = _merged(model)
    assert result.modified and ops(graph) == ["Slice"]
    (node,) = graph.nodes
    assert [list(np.asarray(t.values)) for t in node.inputs[1:]] == [[0, 1], [-1, I64_MAX], [1, 2], [1, 2]]
    assert node.outputs[0].name == "y" and node.inputs[0].name == "x"
    assert_equivalent(model, gp.to_proto(graph), _feeds([2, 3, 8]), exact=True)


def test_a_chain_of_three_becomes_one_slice():
    model = _chain([4, 10], [([1], [10], [1], [1]), ([0], [3], [0], [1]), ([7], [-9], [1], [-2])])
    graph, result, _ = _merged(model)
    assert result.modified and ops(graph) == ["Slice"]
    assert_equivalent(model, gp.to_proto(graph), _feeds([4, 10]), exact=True)


def test_slice_1_attribute_form_and_int32_parameters():
    model = _chain([6, 8], [([1, 2], [6, 8], None), ([1], [-1], [1])], opset=9)
    graph, result, _ = _merged(model)
    assert result.modified and ops(graph) == ["Slice"]
    node = graph.nodes[0]
    assert len(node.inputs) == 1 and node.attrs["axes"] == [0, 1] and node.attrs["starts"] == [1, 3]
    assert_equivalent(model, gp.to_proto(graph), _feeds([6, 8]), exact=True)
    model = _chain([6, 8], [([1], [5], [1], [1]), ([-2], [-9], [1], [-1])], dtype=np.int32)
    graph, result, _ = _merged(model)
    assert result.modified
    assert_equivalent(model, gp.to_proto(graph), _feeds([6, 8]), exact=True)


def test_every_dtype_slices_the_same():
    for elem, dt in ((TensorProto.FLOAT16, np.float16), (TensorProto.INT8, np.int8), (TensorProto.INT64, np.int64),
                     (TensorProto.BOOL, np.bool_), (TensorProto.DOUBLE, np.float64)):
        model = _chain([5, 6], [([4], [0], [1], [-1]), ([1], [I64_MAX], [1], [2])], elem=elem)
        graph, result, _ = _merged(model)
        assert result.modified, dt
        x = (np.arange(30).reshape(5, 6) % 3).astype(dt)
        assert_equivalent(model, gp.to_proto(graph), {"x": x}, exact=True)


def test_refusals_say_why():
    # a shared axis of unknown length
    model = _chain(["N", 8], [([1], [5], [0], [1]), ([1], [3], [0], [1])])
    graph, result, ctx = _merged(model)
    assert not result.modified and "axis 0 is cut by both Slices and its length is not static" in ctx.explanations[0].reason
    # a negative axis on an input of unknown rank
    inits = {}
    nodes = [_slice("a", "x", "m", [1], [5], [-1], [1], inits=inits), _slice("b", "m", "y", [0], [2], [0], [1], inits=inits)]
    model = make_model(nodes, {"x": None}, {"y": None}, initializers=inits)
    graph, result, ctx = _merged(model)
    assert not result.modified and "negative axis on an input of unknown rank" in ctx.explanations[0].reason
    # runtime starts
    inits = {"e": np.array([5], np.int64), "a": np.array([0], np.int64)}
    nodes = [helper.make_node("Slice", ["x", "st", "e", "a"], ["m"]), _slice("b", "m", "y", [0], [2], [0], [1], inits=inits)]
    model = make_model(nodes, {"x": [6], "st": (TensorProto.INT64, [1])}, {"y": None}, initializers=inits)
    graph, result, ctx = _merged(model)
    assert not result.modified and "computed at run time" in ctx.explanations[0].reason


def test_a_first_slice_read_elsewhere_is_not_merged():
    model = _chain([6, 8], [([1], [5], [0], [1]), ([1], [3], [1], [1])], extra_out="m0")
    graph, result, _ = _merged(model)
    assert not result.modified and ops(graph) == ["Slice", "Slice"]


def test_merge_slices_is_in_the_default_pipeline():
    model = _chain([6, 8], [([1], [5], [0], [1]), ([1], [3], [1], [1])])
    result = gp.optimize(model)
    assert result.report.ops_after == {"Slice": 1}
    assert_equivalent(model, gp.to_proto(result.graph), _feeds([6, 8]), exact=True)
