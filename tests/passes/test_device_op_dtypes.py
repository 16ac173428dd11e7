"""Device ops in float16, bfloat16 and float64 models (issue 16, item 4).

The fused ops' function bodies held float32 constants (Relu6's Clip bounds, Gelu's constants,
LayerNorm's epsilon), so a model of another float type came out invalid. Each model here goes
through ``graphpass optimize`` with both ``--emit`` forms; the output must pass the full checker
and give the original's outputs in onnxruntime (bit for bit where the pass is exact).
"""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphpass as gp
from graphpass.cli import main
from graphpass.passes.framework import PassContext
from graphpass.passes import fuse_conv_activation, fuse_gelu, fuse_layer_norm
from graphpass.testing import check_full, ort_run

F16, BF16, F64, F32 = TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.FLOAT
NP = {F16: np.float16, F64: np.float64, F32: np.float32}
RNG = np.random.default_rng(11)


def _t(name, elem, values):
    values = np.asarray(values, np.float64)
    return helper.make_tensor(name, elem, values.shape, values.ravel().tolist())


def _model(nodes, elem, x_shape, y_shape, inits, opset):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, x_shape)],
                          [helper.make_tensor_value_info("y", elem, y_shape)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    check_full(m)
    return m


def conv_relu6(elem, opset, bias=True):
    inits = [_t("w", elem, RNG.standard_normal((4, 3, 3, 3))), _t("lo", elem, 0.0), _t("hi", elem, 6.0)]
    if bias:
        inits.append(_t("b", elem, RNG.standard_normal(4)))
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    return _model(nodes, elem, [1, 3, 8, 8], [1, 4, 8, 8], inits, opset)


def gelu(elem, opset):
    inits = [_t("k", elem, math.sqrt(2)), _t("one", elem, 1.0), _t("half", elem, 0.5)]
    nodes = [helper.make_node("Div", ["x", "k"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return _model(nodes, elem, [2, 16], [2, 16], inits, opset)


def layer_norm(elem, opset, eps=2.0 ** -17):
    inits = [_t("two", elem, 2.0), _t("eps", elem, eps), _t("gamma", elem, RNG.uniform(0.5, 1.5, 8)),
             _t("beta", elem, RNG.standard_normal(8))]
    if opset >= 18:
        inits.append(helper.make_tensor("axes", TensorProto.INT64, [1], [-1]))
        mean = helper.make_node("ReduceMean", ["x", "axes"], ["mu"])
        var = helper.make_node("ReduceMean", ["sq", "axes"], ["var"])
    else:
        mean = helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1])
        var = helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1])
    nodes = [mean, helper.make_node("Sub", ["x", "mu"], ["d"]), helper.make_node("Pow", ["d", "two"], ["sq"]), var,
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["ns"]),
             helper.make_node("Add", ["ns", "beta"], ["y"])]
    return _model(nodes, elem, [2, 5, 8], [2, 5, 8], inits, opset)


def _optimize(model, emit, tmp_path):
    src, dst = tmp_path / "in.onnx", tmp_path / f"out_{emit}.onnx"
    onnx.save(model, src)
    # no cost veto: these tests are about the dtypes of the emitted device ops (with ATC's UB
    # fusion in the cost model an explicit fusion that adds a zero bias is rolled back, issue 21)
    assert main(["optimize", str(src), "-o", str(dst), "--emit", emit, "-q", "--target", "none"]) == 0
    out = onnx.load(dst)
    check_full(out)
    return out


def _feeds(elem, shape):
    x = RNG.standard_normal(shape) * 4
    x.ravel()[:4] = [0.0, -0.0, 7.0, -7.0]
    return {"x": x.astype(NP[elem])}


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _fused_ops(model):
    return sorted({n.op_type for n in model.graph.node} | {f.name for f in model.functions})


# onnxruntime's CPU provider has no bfloat16 Conv (nor Div, ReduceMean, ...) and no float64 Conv:
# those models are checked with the full checker only. Conv takes bfloat16 from opset 22.
@pytest.mark.parametrize("elem, opset", [(F16, 17), (F16, 13), (F64, 17), (BF16, 22)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("emit", ["portable", "device"])
def test_conv_relu6_of_every_float_type_comes_out_valid_and_bit_equal(elem, opset, bias, emit, tmp_path):
    model = conv_relu6(elem, opset, bias)
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 1
    out = _optimize(model, emit, tmp_path)
    if emit == "device":
        assert "FusedConvRelu6" in _fused_ops(out)
        body = next(f for f in out.functions if f.name == "FusedConvRelu6")
        consts = [numpy_helper.to_array(n.attribute[0].t) for n in body.node if n.op_type == "Constant"]
        assert [c.dtype.itemsize for c in consts] == [{F16: 2, BF16: 2, F64: 8}[elem]] * 2
    if elem in (BF16, F64):
        return
    feeds = _feeds(elem, [1, 3, 8, 8])
    ref, got = ort_run(model, feeds)["y"], ort_run(out, feeds)["y"]
    assert got.dtype == ref.dtype and np.array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("elem, opset", [(F64, 17), (F64, 20)])
@pytest.mark.parametrize("emit", ["portable", "device"])
def test_float64_gelu_fuses_with_double_constants(elem, opset, emit, tmp_path):
    model = gelu(elem, opset)
    graph = gp.load(model).graph
    assert fuse_gelu(graph).stats["fired"] == 1
    out = _optimize(model, emit, tmp_path)
    if emit == "device" and opset < 20:
        body = next(f for f in out.functions if f.name == "Gelu")
        sqrt2 = next(numpy_helper.to_array(n.attribute[0].t) for n in body.node if n.output[0] == "sqrt2")
        assert sqrt2.dtype == np.float64 and float(sqrt2) == math.sqrt(2)
    # onnxruntime's CPU provider has no float64 Erf: the original cannot run, the checker must pass


@pytest.mark.parametrize("elem, opset", [(F64, 16), (F64, 17), (F64, 18)])
@pytest.mark.parametrize("emit", ["portable", "device"])
def test_float64_layer_norm_fuses_with_its_eps_in_the_body_type(elem, opset, emit, tmp_path):
    model = layer_norm(elem, opset)
    graph = gp.load(model).graph
    assert fuse_layer_norm(graph).stats["fired"] == 1
    assert graph.nodes[0].attrs["epsilon"] == 2.0 ** -17
    out = _optimize(model, emit, tmp_path)
    feeds = _feeds(elem, [2, 5, 8])
    np.testing.assert_allclose(ort_run(out, feeds)["y"], ort_run(model, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_float64_layer_norm_with_an_eps_a_float_cannot_hold_is_not_fused():
    # 1e-5 as a double is not a float32: the epsilon attribute would round it
    assert not fuse_layer_norm(gp.load(layer_norm(F64, 17, eps=1e-5)).graph).modified


@pytest.mark.parametrize("elem, opset", [(F16, 17), (F16, 20), (BF16, 22)])
@pytest.mark.parametrize("build, fuse", [(gelu, fuse_gelu), (layer_norm, fuse_layer_norm)])
@pytest.mark.parametrize("emit", ["portable", "device"])
def test_half_precision_gelu_and_layer_norm_are_left_and_come_out_valid(elem, opset, build, fuse, emit, tmp_path):
    # One fused kernel differs from a float16 decomposition (rounded at every step) by far more
    # than the promised 1e-5: not fused. The model still comes out valid and equal.
    model = build(elem, opset)
    ctx = PassContext()
    assert not fuse(gp.load(model).graph, ctx).modified
    assert "more than the promised tolerance" in ctx.explanations[0].reason
    out = _optimize(model, emit, tmp_path)
    if elem == BF16:
        return  # onnxruntime's CPU provider has no bfloat16 Div/ReduceMean kernels
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = _feeds(elem, shape)
    ref, got = ort_run(model, feeds)["y"], ort_run(out, feeds)["y"]
    assert np.array_equal(_bits(got), _bits(ref))


def test_relu6_conv_of_a_second_type_in_one_model_is_refused_with_the_reason():
    # one FusedConvRelu6 body per model: typed for the first Conv's type; the float16 one stays
    inits = [_t("w", F32, RNG.standard_normal((3, 3, 3, 3))), _t("lo", F32, 0.0), _t("hi", F32, 6.0),
             _t("w16", F16, RNG.standard_normal((3, 3, 3, 3))), _t("lo16", F16, 0.0), _t("hi16", F16, 6.0)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Clip", ["c", "lo", "hi"], ["r"]),
             helper.make_node("Cast", ["r"], ["h"], to=F16), helper.make_node("Conv", ["h", "w16"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c2", "lo16", "hi16"], ["y16"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [1, 3, 5, 5])],
                          [helper.make_tensor_value_info("y16", F16, [1, 3, 5, 5])], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    graph = gp.load(model).graph
    ctx = PassContext()
    stats = fuse_conv_activation(graph, ctx).stats
    assert (stats["fired"], stats["refused"]) == (1, 1)
    assert stats["rules"]["conv_relu6"] == {"matched": 2, "refused": 1, "rewritten": 1, "removed": 2, "created": 1}
    assert "typed for FLOAT; a FLOAT16 call cannot share it" in ctx.explanations[0].reason
    feeds = {"x": RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)}
    for emit in ("device", "portable"):
        out = gp.to_proto(graph, emit=emit)
        check_full(out)
        assert np.array_equal(_bits(ort_run(out, feeds)["y16"]), _bits(ort_run(model, feeds)["y16"]))


def test_an_unmarked_body_from_an_earlier_graphpass_counts_as_float32():
    # FusedConvRelu6 bodies were written with float32 bounds before they were typed
    from graphpass.ir.device_ops import function_type_conflict, fused_conv_function
    model = conv_relu6(F16, 17)
    old = fused_conv_function("Relu6", 17, F32)
    old.doc_string = ""
    model.functions.append(old)
    model.opset_import.append(helper.make_opsetid("graphpass.ascend", 1))
    graph = gp.load(model).graph
    assert "typed for FLOAT" in function_type_conflict(graph, "FusedConvRelu6", F16)
    assert function_type_conflict(graph, "FusedConvRelu6", F32) is None
    assert function_type_conflict(graph, "FusedConvRelu", F16) is None  # no constants: any type
