import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.passes.framework import PassContext
from graphpass.passes.lowering import NarrowInt64
from graphpass.testing import assert_equivalent, make_model, ops, ort_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
from _corpus import DATA, exported, feeds_for  # noqa: E402

I32_MAX, I32_MIN = 2 ** 31 - 1, -(2 ** 31)
NASTY = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, 3.4e38, -3.4e38, 1.5, -2.5], np.float32)


def _i64(v):
    return np.asarray(v, np.int64)


def _run(model, target="ascend910a"):
    graph = gp.load(model).graph
    ctx = PassContext(target=target)
    result = NarrowInt64()(graph, ctx)
    return graph, result, ctx


def _node(graph, op):
    return next(n for n in graph.nodes if n.op == op)


def _dtype(t):
    return np.dtype(t.dtype)


def _index_model(x_shape=("batch", 16), factor=2):
    """Shape arithmetic, a Range mask and a Reshape target: the exporters' pattern. On 910A
    (32 GiB) x's batch is at most 2**35 / (4 * 16) = 2**29, so batch * 2 + 3 fits int32."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Mul", ["b", "c16"], ["n"]),
        helper.make_node("Range", ["c0", "n", "c1"], ["r"]),
        helper.make_node("Add", ["r", "c3"], ["r3"]),
        helper.make_node("Less", ["r3", "n"], ["mask"]),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "width"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"zero": _i64(0), "c16": _i64(factor), "c0": _i64(0), "c1": _i64(1), "c3": _i64(3), "ax0": _i64([0]),
             "width": _i64([x_shape[1] if isinstance(x_shape[1], int) else -1])}
    return make_model(nodes, {"x": (TP.FLOAT, list(x_shape))}, {"mask": (TP.BOOL, None), "y": (TP.FLOAT, None)},
                      initializers=inits)


def _x(batch, width=16):
    return {"x": np.resize(NASTY, batch * width).reshape(batch, width)}


def test_index_arithmetic_runs_in_int32_bitwise():
    model = _index_model()
    graph, result, ctx = _run(model)
    assert result.modified and result.stats["fired"] == 4  # Mul, Range, Add, Less: AI CPU in int64 on 910A
    for op in ("Mul", "Range", "Add"):
        assert _dtype(_node(graph, op).outputs[0]) == np.int32
    assert _dtype(_node(graph, "Less").inputs[0]) == np.int32
    # the shape vector and what only moves its elements (Gather, Unsqueeze, Concat) stay int64: the
    # Reshape's target (int64 by the schema) needs no Cast back; one Cast(int32) where Mul reads the dim
    assert _dtype(_node(graph, "Concat").outputs[0]) == np.int64
    casts = [n for n in graph.nodes if n.op == "Cast"]
    assert len(casts) == 1 and casts[0].attrs["to"] == TP.INT32 and casts[0].inputs[0].name == "b"
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    for batch in (3, 1, 0):  # 0: empty tensors
        assert_equivalent(model, after, feeds=_x(batch), exact=True)


def _edge_model(c, op="Add", out_const=0):
    """Range(0, 3) op c, read back exactly through an Identity (a graph output keeps int64)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Range", ["c0", "n", "c1"], ["r"]),
        helper.make_node(op, ["r", "c"], ["v"]),
        helper.make_node("Less", ["v", "k"], ["m"]),
        helper.make_node("Identity", ["v"], ["vout"]),
    ]
    inits = {"zero": _i64(0), "c0": _i64(0), "c1": _i64(1), "c": _i64(c), "k": _i64(out_const)}
    return make_model(nodes, {"x": (TP.FLOAT, [3])}, {"m": (TP.BOOL, [3]), "vout": (TP.INT64, [3])}, initializers=inits)


@pytest.mark.parametrize("c,op,fires", [
    (I32_MAX - 2, "Add", True),    # r + c reaches 2**31 - 1 exactly
    (I32_MAX - 1, "Add", False),   # reaches 2**31
    (I32_MIN, "Add", True),        # starts at -2**31 exactly
    (I32_MIN - 1, "Add", False),   # the constant itself is below int32
    (I32_MIN + 3, "Sub", True),    # 2 - c = 2**31 - 1
    (I32_MIN + 2, "Sub", False),   # 2 - c = 2**31
    (2 ** 30 - 1, "Mul", True),    # 2 * c = 2**31 - 2
    (2 ** 30, "Mul", False),       # 2 * c = 2**31
])
def test_values_at_the_int32_edges(c, op, fires):
    model = _edge_model(c, op)
    graph, result, ctx = _run(model)
    assert result.modified  # the Range (0..2) always
    assert (_dtype(_node(graph, op).outputs[0]) == np.int32) == fires
    if not fires:
        assert any("not proven within int32" in e.reason for e in ctx.explanations), ctx.explanations
    feeds = {"x": np.zeros(3, np.float32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)
    expected = {"Add": np.arange(3) + c, "Sub": np.arange(3) - c, "Mul": np.arange(3) * c}[op]
    np.testing.assert_array_equal(ort_run(gp.to_proto(graph), feeds)["vout"], expected)


def test_edge_values_survive_bitwise():
    for c, values in ((I32_MAX - 2, [I32_MAX - 2, I32_MAX - 1, I32_MAX]), (I32_MIN, [I32_MIN, I32_MIN + 1, I32_MIN + 2])):
        model = _edge_model(c, out_const=c + 1)
        graph, result, _ = _run(model)
        assert result.modified
        out = ort_run(gp.to_proto(graph), {"x": np.zeros(3, np.float32)})
        assert out["vout"].dtype == np.int64 and out["vout"].tolist() == values
        assert out["m"].tolist() == [True, False, False]


def test_argmax_indices_and_narrow_inputs_are_bounded():
    """ArgMax's indices (int64 only by the schema) are below the axis' size; a uint8 input cast to
    int64 is within 0..255: both narrowed after a Cast, the float data with NaN/inf untouched."""
    nodes = [
        helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
        helper.make_node("Cast", ["u"], ["u64"], to=TP.INT64),
        helper.make_node("Mul", ["u64", "c1000"], ["u1000"]),
        helper.make_node("Add", ["i", "u1000"], ["key"]),
        helper.make_node("Equal", ["key", "c7"], ["hit"]),
    ]
    model = make_model(nodes, {"x": (TP.FLOAT, [4, 10]), "u": (TP.UINT8, [4])}, {"hit": (TP.BOOL, [4])},
                       initializers={"c1000": _i64(1000), "c7": _i64(7)})
    graph, result, _ = _run(model)
    assert result.modified
    cast = next(n for n in graph.nodes if n.op == "Cast" and n.inputs[0].name == "u")
    assert cast.attrs["to"] == TP.INT32  # case 5: the Cast to int64 inside the region now casts to int32
    assert _dtype(_node(graph, "ArgMax").outputs[0]) == np.int64  # ArgMax writes int64 only: a Cast follows
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    feeds = {"x": np.resize(NASTY, 40).reshape(4, 10), "u": np.array([0, 255, 7, 128], np.uint8)}
    assert_equivalent(model, after, feeds=feeds, exact=True)


def test_constant_of_shape_value_narrowed_when_it_fits():
    def model(value):
        nodes = [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["k"], value=helper.make_tensor("v", TP.INT64, [1], [value])),
            helper.make_node("Range", ["c0", "n", "c1"], ["r"]),
            helper.make_node("Add", ["k", "r"], ["kr"]),
            helper.make_node("Greater", ["kr", "c0"], ["m"]),
        ]
        return make_model(nodes, {"x": (TP.FLOAT, [5]), "n": (TP.INT64, [])}, {"m": (TP.BOOL, [5])},
                          initializers={"c0": _i64(0), "c1": _i64(1)})

    # n is a graph input: its data is not bounded, so the Range is not narrowed; the ConstantOfShape is
    graph, result, ctx = _run(model(7))
    assert any("Range stays on AI CPU" in e.reason and "not bounded" in e.reason for e in ctx.explanations)
    fits = make_model([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["k"], value=helper.make_tensor("v", TP.INT64, [1], [7])),
        helper.make_node("Add", ["k", "s"], ["ks"]),
        helper.make_node("Greater", ["ks", "c0"], ["m"]),
    ], {"x": (TP.FLOAT, [5])}, {"m": (TP.BOOL, [5])}, initializers={"c0": _i64(0)})
    graph, result, _ = _run(fits)
    assert result.modified
    cos = _node(graph, "ConstantOfShape")
    assert np.asarray(cos.attrs["value"].values).dtype == np.int32 and _dtype(cos.inputs[0]) == np.int64
    after = gp.to_proto(graph)
    assert_equivalent(fits, after, feeds={"x": np.zeros(5, np.float32)}, exact=True)
    too_big = onnx.ModelProto()
    too_big.CopyFrom(fits)
    too_big.graph.node[1].attribute[0].t.int64_data[0] = 2 ** 31
    graph, result, ctx = _run(too_big)
    assert not result.modified
    assert any("not proven within int32" in e.reason for e in ctx.explanations)


def test_slice_parameters_are_all_int32_or_all_int64():
    """A Slice's starts/ends/axes/steps share one type: computed starts in the region take the
    constant ends/axes/steps along as int32 copies (auto_optimizer left int64 ends: invalid)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Sub", ["n", "c2"], ["start"]),
        helper.make_node("Unsqueeze", ["start", "ax0"], ["starts"]),
        helper.make_node("Slice", ["x", "starts", "ends", "ax0", "step"], ["y"]),
    ]
    model = make_model(nodes, {"x": (TP.FLOAT, [6, 3])}, {"y": (TP.FLOAT, None)},
                       initializers={"zero": _i64(0), "c2": _i64(2), "ax0": _i64([0]), "ends": _i64([2 ** 62]),
                                     "step": _i64([1])})
    graph, result, ctx = _run(model)
    slc = _node(graph, "Slice")
    types = {_dtype(t) for t in slc.inputs[1:]}
    assert len(types) == 1, types  # never mixed
    # the INT64-sized end does not fit: the Slice's parameters stay int64, the Sub is cast back
    assert types == {np.dtype(np.int64)}
    assert result.modified and _dtype(_node(graph, "Sub").outputs[0]) == np.int32
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(model, after, feeds={"x": np.resize(NASTY, 18).reshape(6, 3)}, exact=True)
    # with an end that fits, all four parameters become int32
    fits = onnx.ModelProto()
    fits.CopyFrom(model)
    for init in fits.graph.initializer:
        if init.name == "ends":
            init.CopyFrom(onnx.numpy_helper.from_array(_i64([6]), "ends"))
    graph, result, _ = _run(fits)
    slc = _node(graph, "Slice")
    assert {_dtype(t) for t in slc.inputs[1:]} == {np.dtype(np.int32)}
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(fits, after, feeds={"x": np.resize(NASTY, 18).reshape(6, 3)}, exact=True)


def test_refused_with_reasons():
    data = make_model([helper.make_node("Add", ["ids", "one"], ["p"]), helper.make_node("Less", ["p", "one"], ["m"])],
                      {"ids": (TP.INT64, [2, 8])}, {"m": (TP.BOOL, [2, 8])}, initializers={"one": _i64(1)})
    two_symbols = _index_model(("batch", "seq"))  # another dim of x may be 0: batch has no bound
    too_many = _index_model(factor=16)  # batch <= 2**29 on 910A, batch * 16 may reach 2**33
    out = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Add", ["s", "one"], ["p"])],
                     {"x": [2, 3]}, {"p": (TP.INT64, [2])}, initializers={"one": _i64(1)})
    div = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Shape", ["z"], ["t"]),
                      helper.make_node("Div", ["s", "t"], ["q"]), helper.make_node("Less", ["q", "one"], ["m"])],
                     {"x": [2, 3], "z": [0, 3]}, {"m": (TP.BOOL, [2])}, initializers={"one": _i64(1)})
    cases = [(data, "a graph input are not bounded"), (two_symbols, "dim 'batch'"),
             (out, "is a graph output"), (div, "may divide by 0"), (too_many, "range [0, 8589934592]")]
    for model, reason in cases:
        graph, result, ctx = _run(model)
        assert not result.modified, reason
        assert any(reason in e.reason for e in ctx.explanations), (reason, ctx.explanations)


def test_nothing_to_gain_where_the_target_has_int64_kernels():
    model = make_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Add", ["s", "one"], ["p"]),
                        helper.make_node("Less", ["p", "one"], ["m"])],
                       {"x": [2, 3]}, {"m": (TP.BOOL, [2])}, initializers={"one": _i64(1)})
    graph, result, ctx = _run(model, target="ascend910b2")  # ops-math's Add and Less take int64 there
    assert not result.modified
    assert any("runs on AI Core on ascend910b2: nothing to gain" in e.reason for e in ctx.explanations)
    graph, result, _ = _run(model, target="ascend310p3")
    assert result.modified


def test_needs_a_target_and_is_skipped_under_none():
    model = _index_model()
    with pytest.raises(UsageError, match="needs a hardware target"):
        _run(model, target="none")
    result = gp.optimize(model, target="none")
    assert result.report.ops_after.get("Cast", 0) == 0


def test_cost_model_prices_int64_on_ai_cpu_and_the_pipeline_fires():
    model = _index_model()
    target = gp.Target.load("ascend910a")
    before = target.estimate(model)
    aicpu = [n for n in before.nodes if n["engine"] == "AICPU"]
    assert {n["op"] for n in aicpu} >= {"Range", "Add", "Mul", "Less"}
    assert all("has no AI Core kernel on ascend910a" in n["note"] for n in aicpu)
    result = gp.optimize(model, target="ascend910a")
    after = target.estimate(result.model)
    assert after.total_us < before.total_us
    assert not any(n["engine"] == "AICPU" for n in after.nodes)
    rec = next(p for p in result.report.to_dict()["passes"] if p["name"] == "narrow_int64")
    assert rec["stats"]["fired"] >= 1 and not rec["rolled_back"]
    onnx.checker.check_model(gp.to_proto(result.model), full_check=True)
    assert_equivalent(model, gp.to_proto(result.model), feeds=_x(5), exact=True)
    # on 910B2 the same graph keeps its int64 ops on AI Core, and the pipeline leaves them
    b2 = gp.Target.load("ascend910b2").estimate(model)
    assert not any(n["engine"] == "AICPU" and n["op"] in ("Add", "Mul", "Less") for n in b2.nodes)


@pytest.mark.parametrize("name", ["llama_static.torchscript.onnx", "llama_static.dynamo.onnx", "vit.torchscript.onnx"])
def test_real_exporter_models_fire_and_stay_bitwise(name):
    """The exporters' masks and position ids (Range over a batch an input bounds, comparisons,
    Max, Where): narrowed on 910A, the estimate lower, outputs bitwise those of the same pipeline
    without the pass, on seeded inputs."""
    entry = next(e for e in exported() if e["file"] == name)
    path = str(DATA / name)
    with_pass = gp.optimize(path, target="ascend910a")
    rec = next(p for p in with_pass.report.to_dict()["passes"] if p["name"] == "narrow_int64")
    assert rec["stats"]["fired"] >= 1 and not rec["rolled_back"]
    assert rec["cost_after_us"] < rec["cost_before_us"]
    without = gp.optimize(path, target="ascend910a", disable=["narrow_int64"])
    a, b = gp.to_proto(with_pass.model), gp.to_proto(without.model)
    onnx.checker.check_model(a, full_check=True)
    feeds = feeds_for(entry)
    out_a, out_b = ort_run(a, feeds), ort_run(b, feeds)
    assert out_a.keys() == out_b.keys()
    for k in out_b:
        assert out_a[k].dtype == out_b[k].dtype
        np.testing.assert_array_equal(out_a[k].view(np.uint8), out_b[k].view(np.uint8))


def test_each_dim_of_a_shape_vector_has_its_own_bound():
    """x: [batch, 8] float32 bounds batch by 2**35 / 32 = 2**30 on 910A; y: [seq] uint8 bounds seq
    only by 2**35 (not within int32). The Range over batch is narrowed, the one over seq is not,
    though both dims come out of one Concat of the two Shapes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["y"], ["sy"]),
        helper.make_node("Concat", ["sx", "sy"], ["dims"], axis=0),
        helper.make_node("Gather", ["dims", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["dims", "two"], ["seq"], axis=0),
        helper.make_node("Range", ["c0", "batch", "c1"], ["rb"]),
        helper.make_node("Range", ["c0", "seq", "c1"], ["rs"]),
        helper.make_node("Less", ["rb", "c1"], ["mb"]), helper.make_node("Less", ["rs", "c1"], ["ms"]),
    ]
    model = make_model(nodes, {"x": (TP.FLOAT, ["batch", 8]), "y": (TP.UINT8, ["seq"])},
                       {"mb": (TP.BOOL, ["b"]), "ms": (TP.BOOL, ["s"])},
                       initializers={"zero": _i64(0), "two": _i64(2), "c0": _i64(0), "c1": _i64(1)})
    graph, result, ctx = _run(model)
    assert result.modified
    rb, rs = (next(n for n in graph.nodes if n.outputs[0].name == name) for name in ("rb", "rs"))
    assert _dtype(rb.outputs[0]) == np.int32 and _dtype(rs.outputs[0]) == np.int64
    assert any("'seq' is not proven within int32 (range [0, 34359738368])" in e.reason for e in ctx.explanations)
    after = gp.to_proto(graph)
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(model, after, feeds={"x": np.resize(NASTY, 24).reshape(3, 8), "y": np.arange(5, dtype=np.uint8)},
                      exact=True)


@pytest.mark.parametrize("elem", [TP.INT32, TP.FLOAT, TP.INT8])
def test_graphs_without_int64_computation_are_left_alone(elem):
    model = make_model([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Less", ["s", "b"], ["m"])],
                       {"a": (elem, [4]), "b": (elem, [4])}, {"m": (TP.BOOL, [4])})
    graph, result, ctx = _run(model)
    assert not result.modified and result.stats == {"fired": 0} and not ctx.explanations
    assert ops(graph) == ["Add", "Less"]


def test_a_symbol_one_input_leaves_open_bounds_nothing():
    """Whisper names its batch on input_features [batch, 80, 3000] (bounded by memory) and on
    decoder_input_ids [batch, seq] (not): onnxruntime does not hold the two to one size, so the
    batch is not bounded and its index arithmetic stays int64, with the reason."""
    entry = next(e for e in exported() if e["file"] == "whisper.dynamo.onnx")
    result = gp.optimize(str(DATA / entry["file"]), target="ascend910a")
    rec = next(p for p in result.report.to_dict()["passes"] if p["name"] == "narrow_int64")
    assert rec["stats"].get("fired", 0) == 0
    assert any("dim 'batch'" in (e.reason if hasattr(e, "reason") else str(e)) for e in result.report.explanations)


def test_a_graph_without_int64_is_not_analysed(monkeypatch):
    """No node computes in int64: the range analysis (a walk of every node) is not built."""
    from graphpass.passes.lowering import narrow_int64 as mod

    def refuse(*a, **k):
        raise AssertionError("IntRanges built for a graph without int64")

    monkeypatch.setattr(mod, "IntRanges", refuse)
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "x"], ["y"])],
                       {"x": (TP.FLOAT, [2, 3])}, {"y": (TP.FLOAT, [2, 3])})
    graph, result, _ = _run(model)
    assert not result.modified and ops(graph) == ["Relu", "Add"]
    with pytest.raises(AssertionError, match="IntRanges built"):  # int64 index arithmetic: analysed as before
        _run(_index_model())
