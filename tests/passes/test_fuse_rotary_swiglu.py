"""fuse_rotary_embedding and fuse_swiglu: rotary embedding (rotate-half) and SwiGLU gated MLPs as
exporters write them -> graphpass.ascend device ops (issue 26)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion.fuse_rotary_embedding import FuseRotaryEmbedding
from graphpass.passes.fusion.fuse_swiglu import FuseSwiGlu
from graphpass.testing import assert_equivalent, check_full, make_model, ops

RNG = np.random.default_rng(260)
NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}


def _run(pass_cls, model, target="ascend910b2"):
    m = gp.load(model)
    ctx = PassContext(target=target)
    return m, pass_cls()(m, ctx), ctx


def _special(shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    vals = [np.nan, np.inf, -np.inf, -0.0, 0.0, float(np.finfo(dtype).max), float(np.finfo(dtype).tiny) / 8]
    flat[: len(vals)] = np.array(vals, np.float64).astype(dtype)
    return x


# ------------------------------------------------------------------------------------------
# rotary

def _rotary(d=8, elem=TensorProto.FLOAT, order=0, lo=(0, None), hi=(None, 2 ** 63 - 1), axis=-1, rank=4,
            neg_first=True):
    h = d // 2
    lo = (lo[0], h if lo[1] is None else lo[1])
    hi = (h if hi[0] is None else hi[0], hi[1])
    inits = {"s0": np.array([lo[0]], np.int64), "e0": np.array([lo[1]], np.int64),
             "s1": np.array([hi[0]], np.int64), "e1": np.array([hi[1]], np.int64),
             "ax": np.array([axis], np.int64), "st": np.array([1], np.int64)}
    nodes = [helper.make_node("Mul", ["x", "cos"] if order == 0 else ["cos", "x"], ["xc"]),
             helper.make_node("Slice", ["x", "s0", "e0", "ax", "st"], ["x1"]),
             helper.make_node("Slice", ["x", "s1", "e1", "ax", "st"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["nx2"]),
             helper.make_node("Concat", ["nx2", "x1"] if neg_first else ["x1", "nx2"], ["rot"], axis=-1),
             helper.make_node("Mul", ["rot", "sin"] if order == 0 else ["sin", "rot"], ["rs"]),
             helper.make_node("Add", ["xc", "rs"] if order == 0 else ["rs", "xc"], ["y"])]
    xs = [2, 3, 5, d][-rank:]
    cs = [1, 1, 5, d][-rank:]
    return make_model(nodes, {"x": (elem, xs), "cos": (elem, cs), "sin": (elem, cs)}, {"y": (elem, xs)},
                      initializers=inits, opset=18)


def _rot_feeds(model, dtype):
    shp = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    ang = RNG.uniform(-3, 3, shp["cos"])
    return {"x": _special(shp["x"], dtype), "cos": np.cos(ang).astype(dtype), "sin": np.sin(ang).astype(dtype)}


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_rotate_half_becomes_one_device_op_bitwise(order, elem):
    model = _rotary(order=order, elem=elem)
    m, result, _ = _run(FuseRotaryEmbedding, model)
    assert result.stats["fired"] == 1 and ops(m.graph) == ["RotaryEmbedding"]
    device = gp.to_proto(m.graph, emit="device")
    check_full(device)
    feeds = _rot_feeds(model, NP[elem])
    assert_equivalent(model, device, feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)


def test_rotate_half_with_negative_slice_bounds():
    model = _rotary(lo=(-8, -4), hi=(-4, 8))
    m, result, _ = _run(FuseRotaryEmbedding, model)
    assert ops(m.graph) == ["RotaryEmbedding"]
    assert_equivalent(model, gp.to_proto(m.graph), _rot_feeds(model, np.float32), exact=True)


@pytest.mark.parametrize("kw, why", [
    (dict(lo=(0, 3), hi=(3, 8)), "halves"),          # not the halves
    (dict(neg_first=False), None),                    # Concat(x1, -x2): another rotation, no match
])
def test_not_a_rotate_half_is_not_fused(kw, why):
    m, result, ctx = _run(FuseRotaryEmbedding, _rotary(**kw))
    assert not result.modified and "RotaryEmbedding" not in ops(m.graph)
    if why:
        assert any(why in e.reason for e in ctx.explanations)


@pytest.mark.parametrize("target, d, why", [("ascend310p3", 8, "no RotaryPositionEmbedding"),
                                            ("ascend910a", 8, "no RotaryPositionEmbedding"),
                                            ("ascend910b2", 2002, "head dim")])
def test_rotary_the_target_cannot_run_is_not_formed(target, d, why):
    m, result, ctx = _run(FuseRotaryEmbedding, _rotary(d=d), target)
    assert not result.modified
    assert any(why in e.reason for e in ctx.explanations), [e.reason for e in ctx.explanations]


def test_rotary_on_a_3d_tensor_is_not_formed_for_a_target():
    m, result, ctx = _run(FuseRotaryEmbedding, _rotary(rank=3))
    assert not result.modified and any("4-D" in e.reason for e in ctx.explanations)


# ------------------------------------------------------------------------------------------
# SwiGLU

def _swiglu_two_matmuls(elem=TensorProto.FLOAT, k=8, i=16, order=0):
    dt = NP[elem]
    inits = {"wg": (RNG.standard_normal((k, i)) / 3).astype(dt), "wu": (RNG.standard_normal((k, i)) / 3).astype(dt)}
    nodes = [helper.make_node("MatMul", ["h", "wg"], ["g"]), helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["g", "sg"] if order == 0 else ["sg", "g"], ["silu"]),
             helper.make_node("MatMul", ["h", "wu"], ["u"]),
             helper.make_node("Mul", ["silu", "u"] if order == 0 else ["u", "silu"], ["y"])]
    return make_model(nodes, {"h": (elem, [2, 5, k])}, {"y": (elem, [2, 5, i])}, initializers=inits, opset=18)


def _swiglu_split(elem=TensorProto.FLOAT, d=32, form="split", sizes=None):
    nodes, inits = [], {}
    if form == "split":
        inits["sp"] = np.array(sizes or [d // 2, d // 2], np.int64)
        nodes.append(helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=-1))
    else:
        inits.update({"z": np.array([0], np.int64), "h": np.array([d // 2], np.int64),
                      "e": np.array([2 ** 63 - 1], np.int64), "ax": np.array([-1], np.int64)})
        nodes += [helper.make_node("Slice", ["x", "z", "h", "ax"], ["a"]),
                  helper.make_node("Slice", ["x", "h", "e", "ax"], ["b"])]
    nodes += [helper.make_node("Sigmoid", ["a"], ["sa"]), helper.make_node("Mul", ["a", "sa"], ["silu"]),
              helper.make_node("Mul", ["silu", "b"], ["y"])]
    return make_model(nodes, {"x": (elem, [2, 3, d])}, {"y": (elem, [2, 3, (sizes or [d // 2])[0]])},
                      initializers=inits, opset=18)


@pytest.mark.parametrize("form", ["split", "slice"])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_split_swiglu_becomes_one_device_op_bitwise(form, elem):
    model = _swiglu_split(elem, form=form)
    m, result, _ = _run(FuseSwiGlu, model)
    assert result.stats["fired"] == 1 and ops(m.graph) == ["SwiGlu"]
    feeds = {"x": _special([2, 3, 32], NP[elem])}
    assert_equivalent(model, gp.to_proto(m.graph, emit="device"), feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)


def test_unequal_split_is_not_swiglu():
    model = _swiglu_split(sizes=[20, 12])
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 12
    m, result, _ = _run(FuseSwiGlu, model)
    assert "SwiGlu" not in ops(m.graph)


@pytest.mark.parametrize("order", [0, 1])
def test_two_matmul_swiglu_packs_the_weights(order):
    model = _swiglu_two_matmuls(order=order)
    m, result, _ = _run(FuseSwiGlu, model)
    assert ops(m.graph) == ["MatMul", "SwiGlu"]
    assert list(m.graph.nodes[0].inputs[1].shape) == [8, 32]
    assert result.stats["rules"]["swiglu"]["packed_matmuls"] == 1
    feeds = {"h": _special([2, 5, 8], np.float32)}
    assert_equivalent(model, gp.to_proto(m.graph), feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16])
def test_two_float16_matmuls_are_concatenated_not_packed(elem):
    """float16: one packed MatMul could round differently; the two stay and feed SwiGlu through a
    Concat, which is exact."""
    model = _swiglu_two_matmuls(elem)
    m, result, _ = _run(FuseSwiGlu, model)
    assert ops(m.graph) == ["MatMul", "MatMul", "Concat", "SwiGlu"]
    assert result.stats["rules"]["swiglu"]["concatenated_projections"] == 1
    feeds = {"h": _special([2, 5, 8], NP[elem])}
    # float16 "exact" is judged under fp16 emulation (every float16 value rounded, as the spec
    # computes): onnxruntime's CPU provider runs fp16 chains without kernels in float32
    from graphpass.check import verify as V

    out = gp.to_proto(m.graph)
    check_full(out)
    checked = V.check_outputs(model, out, feeds, V.Tolerance(0.0, 0.0, "exact"), fp16_emulate=True)
    assert checked.ok, "; ".join(V.describe(c) for c in checked.failures)


def test_weights_computed_at_run_time_are_concatenated():
    model = _swiglu_two_matmuls()
    for init in list(model.graph.initializer):
        if init.name == "wu":  # the up weight becomes a graph input
            model.graph.initializer.remove(init)
            model.graph.input.append(helper.make_tensor_value_info("wu", TensorProto.FLOAT, [8, 16]))
    m, result, _ = _run(FuseSwiGlu, model)
    assert ops(m.graph) == ["MatMul", "MatMul", "Concat", "SwiGlu"]
    feeds = {"h": _special([2, 5, 8], np.float32), "wu": RNG.standard_normal((8, 16)).astype(np.float32)}
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)


def test_gate_read_elsewhere_is_not_fused():
    model = _swiglu_two_matmuls()
    model.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 5, 16]))
    m, result, _ = _run(FuseSwiGlu, model)
    assert not result.modified


@pytest.mark.parametrize("target, d, why", [("ascend910a", 32, "no SwiGlu"), ("ascend310p3", 24, "64-byte")])
def test_swiglu_the_target_cannot_run_is_not_formed(target, d, why):
    m, result, ctx = _run(FuseSwiGlu, _swiglu_split(TensorProto.FLOAT16, d=d), target)
    assert not result.modified
    assert any(why in e.reason for e in ctx.explanations), [e.reason for e in ctx.explanations]


# ------------------------------------------------------------------------------------------
# rotary, interleaved (GPT-J's rotate_every_two)

def _rotary_interleaved(d=32, target=None, odd_start=1, elem=TensorProto.FLOAT):
    inits = {"z": np.array([0], np.int64), "o": np.array([odd_start], np.int64), "e": np.array([2 ** 63 - 1], np.int64),
             "ax": np.array([-1], np.int64), "st": np.array([2], np.int64),
             "shape": np.array(target or [-1, 2, 5, d], np.int64)}
    nodes = [helper.make_node("Mul", ["x", "cos"], ["xc"]),
             helper.make_node("Slice", ["x", "z", "e", "ax", "st"], ["xe"]),
             helper.make_node("Slice", ["x", "o", "e", "ax", "st"], ["xo"]),
             helper.make_node("Neg", ["xo"], ["nxo"]),
             helper.make_node("Unsqueeze", ["nxo", "ax"], ["a"]), helper.make_node("Unsqueeze", ["xe", "ax"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["stk"], axis=-1),
             helper.make_node("Reshape", ["stk", "shape"], ["rot"], allowzero=1),
             helper.make_node("Mul", ["rot", "sin"], ["rs"]), helper.make_node("Add", ["xc", "rs"], ["y"])]
    return make_model(nodes, {"x": (elem, ["b", 2, 5, d]), "cos": (elem, [1, 1, 5, d]), "sin": (elem, [1, 1, 5, d])},
                      {"y": (elem, ["b", 2, 5, d])}, initializers=inits, opset=18)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_interleaved_rotary_becomes_one_device_op_bitwise(elem):
    model = _rotary_interleaved(elem=elem)
    m, result, _ = _run(FuseRotaryEmbedding, model)
    assert ops(m.graph) == ["RotaryEmbeddingInterleaved"] and m.graph.nodes[0].domain == "graphpass.ascend"
    device = gp.to_proto(m.graph, emit="device")
    check_full(device)
    ang = RNG.uniform(-3, 3, (1, 1, 5, 32))
    dt = NP[elem]
    feeds = {"x": _special([3, 2, 5, 32], dt), "cos": np.cos(ang).astype(dt), "sin": np.sin(ang).astype(dt)}
    assert_equivalent(model, device, feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)


@pytest.mark.parametrize("kw, target, why", [
    (dict(d=8), "ascend910b2", "multiple of 32"),                       # the head dim CANN mode 1 takes
    (dict(), "ascend310p3", "no RotaryPositionEmbedding (mode 1"),
    (dict(odd_start=0), "none", "X[..., 1::2]"),                       # not the odd elements
    (dict(target=[0, 2, 10, 16]), "none", "Reshape target"),            # not X's shape
])
def test_interleaved_rotary_not_formed_says_why(kw, target, why):
    m, result, ctx = _run(FuseRotaryEmbedding, _rotary_interleaved(**kw), target)
    assert not result.modified
    assert any(why in e.reason for e in ctx.explanations), [e.reason for e in ctx.explanations]


# ------------------------------------------------------------------------------------------
# GeGLU

def _geglu(opset, form="split", approximate="none", d=32):
    """Gelu(A) * B: A, B the halves of x (form split), or two MatMuls of h (form matmuls); the
    Gelu as the standard op (opset 20+) or as the erf decomposition exporters write before."""
    inits, nodes = {}, []
    if form == "split":
        inits["sp"] = np.array([d // 2, d // 2], np.int64)
        nodes.append(helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=-1))
        ins = {"x": [2, 3, d]}
    else:
        inits.update({"w1": (RNG.standard_normal((8, d // 2)) / 3).astype(np.float32),
                      "w2": (RNG.standard_normal((8, d // 2)) / 3).astype(np.float32)})
        nodes += [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"])]
        ins = {"x": [2, 3, 8]}
    if opset >= 20:
        nodes.append(helper.make_node("Gelu", ["a"], ["g"], approximate=approximate))
    else:
        inits.update({"k": np.array(2 ** 0.5, np.float32), "one": np.array(1.0, np.float32),
                      "half": np.array(0.5, np.float32)})
        nodes += [helper.make_node("Div", ["a", "k"], ["dv"]), helper.make_node("Erf", ["dv"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["g"])]
    nodes.append(helper.make_node("Mul", ["g", "b"], ["y"]))
    return make_model(nodes, ins, {"y": [2, 3, d // 2]}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset, form, approximate, op", [
    (18, "split", "none", "GeGlu"),            # the erf decomposition, fused by fuse_gelu first
    (20, "split", "tanh", "GeGluTanh"),
    (20, "matmuls", "none", "GeGlu"),          # two MatMuls: packed
])
def test_geglu_becomes_one_device_op(opset, form, approximate, op):
    model = _geglu(opset, form, approximate)
    result = gp.optimize(model, passes=["fuse_gelu", "fuse_swiglu"], target="ascend910b2")
    kinds = [n.op for n in result.graph.nodes]
    assert op in kinds and "Gelu" not in kinds and "Erf" not in kinds
    device = gp.to_proto(result.graph, emit="device")
    check_full(device)
    feeds = {"x": _special([2, 3, 32 if form == "split" else 8], np.float32)}
    # against the export: fuse_gelu's fused-kernel tolerance (the GeGLU step itself is exact)
    assert_equivalent(model, gp.to_proto(result.graph), feeds, rtol=1e-5, atol=1e-6)
    only_gelu = gp.optimize(model, passes=["fuse_gelu"], target="ascend910b2")
    exact = form == "split"  # the packed MatMul is a tolerance
    assert_equivalent(gp.to_proto(only_gelu.graph), gp.to_proto(result.graph), feeds, exact=exact)


def test_geglu_of_a_gelu_read_elsewhere_is_not_fused():
    model = _geglu(20)
    model.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 3, 16]))
    result = gp.optimize(model, passes=["fuse_swiglu"], target="ascend910b2")
    assert "GeGlu" not in [n.op for n in result.graph.nodes]
