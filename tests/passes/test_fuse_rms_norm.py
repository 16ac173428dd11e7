"""fuse_rms_norm: RMSNorm and Add+RMSNorm as exporters write them -> graphpass.ascend device ops (issue 26)."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion.fuse_rms_norm import FuseRmsNorm
from graphpass.testing import assert_equivalent, check_full, make_model, ops, ort_run

W = 8
RNG = np.random.default_rng(26)


def _rms(opset=18, elem=TensorProto.FLOAT, square="pow", rstd="reciprocal", upcast=None, order=0, residual=False,
         eps=1e-6, gamma_dtype=None):
    """LlamaRMSNorm as exported: [Cast up] Pow, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, [Cast down], Mul weight."""
    np_t = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
            TensorProto.BFLOAT16: ml_dtypes.bfloat16}[elem]
    upcast = elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16) if upcast is None else upcast
    comp = np.float32 if upcast else np_t
    inits = {"two": np.array(2.0, comp), "eps": np.array(eps, comp), "one": np.array(1.0, comp),
             "w": RNG.uniform(0.5, 1.5, W).astype(gamma_dtype or np_t)}
    nodes = []
    x = "x"
    if residual:
        nodes.append(helper.make_node("Add", ["a", "b"], ["x"]))
    if upcast:
        nodes.append(helper.make_node("Cast", [x], ["xf"], to=TensorProto.FLOAT))
        x = "xf"
    nodes.append(helper.make_node("Pow", [x, "two"], ["sq"]) if square == "pow" else helper.make_node("Mul", [x, x], ["sq"]))
    if opset >= 18:
        inits["axes"] = np.array([-1], np.int64)
        nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]))
    else:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]))
    nodes.append(helper.make_node("Add", ["ms", "eps"] if order == 0 else ["eps", "ms"], ["mse"]))
    nodes.append(helper.make_node("Sqrt", ["mse"], ["s"]))
    if rstd == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]),
                  helper.make_node("Mul", [x, "r"] if order == 0 else ["r", x], ["n"])]
    elif rstd == "div1":
        nodes += [helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", [x, "r"], ["n"])]
    else:  # x / Sqrt: another rounding than x * (1/Sqrt)
        nodes.append(helper.make_node("Div", [x, "s"], ["n"]))
    if upcast:
        nodes.append(helper.make_node("Cast", ["n"], ["nd"], to=elem))
    nodes.append(helper.make_node("Mul", ["w", "nd" if upcast else "n"] if order == 0 else ["nd" if upcast else "n", "w"], ["y"]))
    ins = {"a": (elem, [2, "s", W]), "b": (elem, [2, "s", W])} if residual else {"x": (elem, [2, "s", W])}
    outs = {"y": (elem, [2, "s", W])}
    if residual:  # the residual stream is read on (both outputs of AddRmsNorm)
        nodes.append(helper.make_node("Identity", ["x"], ["res"]))
        outs["res"] = (elem, [2, "s", W])
    return make_model(nodes, ins, outs, initializers=inits, opset=opset)


def _run(model, target="ascend910b2"):
    m = gp.load(model)
    ctx = PassContext(target=target)
    result = FuseRmsNorm()(m, ctx)
    return m, result, ctx


def _special(dtype, shape=(2, 5, W)):
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.finfo(dtype).tiny / 4 if dtype != ml_dtypes.bfloat16 else 1e-39,
                float(np.finfo(dtype).max), 1e-3]
    flat[: len(specials)] = np.array(specials, np.float64).astype(dtype)
    if x.ndim == 3:
        x[1, 4, :] = 0.0  # a whole row of zeros: 0 * (1/sqrt(eps))
        x[1, 3, :] = -0.0
    return x


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("square, rstd, order", [("pow", "reciprocal", 0), ("mul", "reciprocal", 1), ("pow", "div1", 0)])
def test_rms_norm_becomes_one_device_op_bitwise(opset, square, rstd, order, tmp_path):
    model = _rms(opset, square=square, rstd=rstd, order=order)
    m, result, _ = _run(model)
    assert result.stats["fired"] == 1
    assert ops(m.graph) == ["RmsNorm"] and m.graph.nodes[0].domain == "graphpass.ascend"
    assert m.graph.nodes[0].attrs["epsilon"] == pytest.approx(1e-6)
    feeds = {"x": _special(np.float32)}
    device = gp.to_proto(m.graph, emit="device")
    check_full(device)
    assert_equivalent(model, device, feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)  # portable: the body inlined


@pytest.mark.parametrize("elem, np_t", [(TensorProto.FLOAT16, np.float16), (TensorProto.DOUBLE, np.float64)])
def test_rms_norm_float16_upcast_and_float64(elem, np_t):
    # float64: no CANN kernel takes it (the target "none" has no limits); eps a float32 value
    model = _rms(18, elem=elem, eps=2.0 ** -20)
    m, result, _ = _run(model, "ascend910b2" if elem == TensorProto.FLOAT16 else "none")
    assert result.stats["fired"] == 1 and ops(m.graph) == ["RmsNorm"]
    if elem == TensorProto.FLOAT16:  # the exporters' Casts are inside the op now
        assert "Cast" in [n.op_type for n in gp.to_proto(m.graph, emit="device").functions[0].node]
    feeds = {"x": _special(np_t)}
    assert_equivalent(model, gp.to_proto(m.graph, emit="device"), feeds, exact=True)


def test_rms_norm_bfloat16_upcast_is_fused_on_910b_not_310p():
    model = _rms(18, elem=TensorProto.BFLOAT16)
    m, result, _ = _run(model, "ascend910b2")
    assert ops(m.graph) == ["RmsNorm"]
    check_full(gp.to_proto(m.graph, emit="device"))
    m, result, ctx = _run(model, "ascend310p3")
    assert not result.modified
    assert any("bfloat16" in e.reason and "ascend310p3" in e.reason for e in ctx.explanations)


def test_float16_rms_norm_computed_in_float16_is_not_fused():
    m, result, ctx = _run(_rms(18, elem=TensorProto.FLOAT16, upcast=False))
    assert not result.modified
    assert any("computes in float32" in e.reason for e in ctx.explanations)


def test_x_divided_by_sqrt_is_not_fused():
    m, result, _ = _run(_rms(18, rstd="div"))
    assert not result.modified and "RmsNorm" not in ops(m.graph)


def test_float64_is_no_dtype_of_the_kernel():
    m, result, ctx = _run(_rms(18, elem=TensorProto.DOUBLE, eps=2.0 ** -20))
    assert not result.modified
    assert any("not float64" in e.reason for e in ctx.explanations)


def test_910a_has_no_rms_norm_kernel():
    m, result, ctx = _run(_rms(18), "ascend910a")
    assert not result.modified
    assert any("no RmsNorm kernel" in e.reason and "norm/rms_norm" in e.reason for e in ctx.explanations)


def test_eps_not_a_float32_value_is_refused():
    m, result, ctx = _run(_rms(18, elem=TensorProto.DOUBLE, eps=1e-6), "none")  # 1e-6 in float64: no float32 value
    assert not result.modified
    assert any("eps" in e.reason for e in ctx.explanations)


def test_weight_of_another_type_is_refused():
    m, result, ctx = _run(_rms(18, elem=TensorProto.DOUBLE, eps=0.5, gamma_dtype=np.float32), "none")
    assert not result.modified
    assert any("weight is not of the input's type" in e.reason for e in ctx.explanations)


@pytest.mark.parametrize("elem, np_t", [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)])
def test_residual_add_joins_as_add_rms_norm_with_both_outputs(elem, np_t):
    model = _rms(18, elem=elem, residual=True)
    m, result, _ = _run(model)
    assert result.stats["add_rms_norm"] == 1
    assert ops(m.graph) == ["AddRmsNorm", "Identity"]
    node = m.graph.nodes[0]
    assert [t.name for t in node.outputs] == ["y", "x"]
    feeds = {"a": _special(np_t), "b": RNG.standard_normal((2, 5, W)).astype(np_t)}
    assert_equivalent(model, gp.to_proto(m.graph, emit="device"), feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m.graph), feeds, exact=True)


def test_broadcasting_residual_add_stays_an_add():
    model = _rms(18, residual=True)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 1  # b: [2, 1, W] broadcast over s
    m, result, ctx = _run(model)
    assert ops(m.graph) == ["Add", "RmsNorm", "Identity"]
    assert any("AddRmsNorm not formed" in e.reason for e in ctx.explanations)


def test_pow_by_two_and_x_times_x_are_the_same_bits():
    """The claim fuse_rms_norm's exactness rests on for Mul(x, x) (the body writes Pow(x, 2))."""
    for dtype, elem in [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE)]:
        model = make_model([helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("Mul", ["x", "x"], ["m"])],
                           {"x": (elem, [4096])}, {"p": (elem, [4096]), "m": (elem, [4096])},
                           initializers={"two": np.array(2.0, dtype)})
        with np.errstate(over="ignore"):  # float16: the large magnitudes become inf, on purpose
            big = (RNG.standard_normal(4032) * 10.0 ** RNG.integers(-20, 20, 4032)).astype(dtype)
        x = np.concatenate([_special(dtype, (64,)), big])
        out = ort_run(model, {"x": x})
        assert out["p"].tobytes() == out["m"].tobytes(), dtype


@pytest.mark.parametrize("name", ["llama.dynamo", "llama_static.dynamo", "llama.torchscript", "llama_static.torchscript"])
def test_llama_exports_every_norm_fused_bitwise(name):
    """2 layers x (input norm, post-attention norm) + the final norm: the first reads the embedding
    (RmsNorm), the other four a residual Add (AddRmsNorm)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "exporters" / f"{name}.onnx"
    src = onnx.load(str(path))
    result = gp.optimize(str(path), target="ascend910b2")
    device = gp.to_proto(result.graph, emit="device")
    kinds = [n.op_type for n in device.graph.node if n.domain == "graphpass.ascend"]
    assert kinds.count("RmsNorm") == 1 and kinds.count("AddRmsNorm") == 4
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} & {n.op_type for n in device.graph.node}
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 512, (3, 16)).astype(np.int64), "attention_mask": np.ones((3, 16), np.int64)}
    feeds["attention_mask"][1, :5] = 0
    assert_equivalent(src, gp.to_proto(result.graph), feeds, exact=True)


def test_an_upcast_read_elsewhere_stays_and_the_norm_is_fused():
    """torch's TorchScript exporter lets the residual Add read the RMSNorm's float32 upcast: the
    Cast stays for that reader and the op casts X itself (the same values)."""
    model = _rms(18, elem=TensorProto.FLOAT16)
    model.graph.node.append(helper.make_node("Identity", ["xf"], ["xf_out"]))
    model.graph.output.append(helper.make_tensor_value_info("xf_out", TensorProto.FLOAT, [2, "s", W]))
    m, result, _ = _run(model)
    assert result.stats["fired"] == 1
    assert sorted(ops(m.graph)) == ["Cast", "Identity", "RmsNorm"]
    feeds = {"x": _special(np.float16)}
    assert_equivalent(model, gp.to_proto(m.graph, emit="device"), feeds, exact=True)


@pytest.mark.parametrize("shape", [(), (1, W), (1, 1, 1)])
def test_a_weight_of_another_shape_is_passed_as_the_last_axis(shape):
    """CANN's gamma is shaped as x's last axis: a scalar or [1, W] weight becomes [W], same bits."""
    model = _rms(18)
    for t in model.graph.initializer:
        if t.name == "w":
            v = RNG.uniform(0.5, 1.5, W).astype(np.float32) if shape == (1, W) else np.float32(1.25)
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(v, np.float32).reshape(shape), "w"))
    m, result, _ = _run(model)
    assert ops(m.graph) == ["RmsNorm"] and list(m.graph.nodes[0].inputs[1].shape) == [W]
    feeds = {"x": _special(np.float32)}
    assert_equivalent(model, gp.to_proto(m.graph, emit="device"), feeds, exact=True)


def _fp16_stream_norms():
    """The TorchScript export of a float16 LLaMA: its first norm reads the float16 embedding
    (upcast, norm, Cast down, float16 weight); the next norms read the float32 residual stream
    (norm in float32, Cast down, float16 weight: no upcast)."""
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
             "w0": RNG.uniform(0.5, 1.5, W).astype(np.float16), "w1": RNG.uniform(0.5, 1.5, W).astype(np.float16)}

    def norm(x, w, out, tag):
        return [helper.make_node("Pow", [x, "two"], [f"{tag}sq"]),
                helper.make_node("ReduceMean", [f"{tag}sq"], [f"{tag}ms"], axes=[-1]),
                helper.make_node("Add", [f"{tag}ms", "eps"], [f"{tag}mse"]),
                helper.make_node("Sqrt", [f"{tag}mse"], [f"{tag}s"]),
                helper.make_node("Div", ["one", f"{tag}s"], [f"{tag}r"]),
                helper.make_node("Mul", [x, f"{tag}r"], [f"{tag}n"]),
                helper.make_node("Cast", [f"{tag}n"], [f"{tag}nd"], to=h),
                helper.make_node("Mul", [w, f"{tag}nd"], [out])]

    nodes = [helper.make_node("Cast", ["e"], ["ef"], to=f)]
    nodes += norm("ef", "w0", "y0", "a")                      # the upcast form
    nodes += [helper.make_node("Cast", ["y0"], ["y0f"], to=f),
              helper.make_node("Add", ["ef", "y0f"], ["r1"])]  # the float32 residual stream
    nodes += norm("r1", "w1", "y1", "b")                      # float32, cast down before the weight
    return make_model(nodes, {"e": (h, [2, 5, W])}, {"y1": (h, [2, 5, W]), "r1": (f, [2, 5, W])},
                      initializers=inits, opset=17)


def test_a_float32_norm_cast_down_before_a_float16_weight_fuses_with_the_weight_outside():
    model = _fp16_stream_norms()
    m, res, ctx = _run(model)
    norms = [n for n in m.graph.nodes if n.domain == "graphpass.ascend"]
    assert sorted(n.op for n in norms) == ["AddRmsNorm", "RmsNorm"], [str(e) for e in ctx.explanations]
    # one float32 body for both; the weights stay float16 Muls after the export's Casts down
    assert all(n.inputs[-1].dtype == np.float32 and np.all(np.asarray(n.inputs[-1].values) == 1) for n in norms)
    assert ops(m).count("Cast") == 4 and ops(m).count("Mul") == 2
    assert not {"Pow", "ReduceMean", "Sqrt", "Div"} & set(ops(m))
    feeds = {"e": _special(np.float16)}
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_a_norm_without_a_weight_fuses_with_a_weight_of_ones(elem):
    """torch.nn.RMSNorm(elementwise_affine=False), or a weight of ones eliminate_identity removed
    (what torch's dynamo export of a freshly built torch.nn.RMSNorm becomes): no weight Mul."""
    model = _rms(elem=elem, upcast=False, eps=float(np.float32(1e-6)))  # an eps the float attribute holds
    # drop the weight Mul: the norm's own Mul is the result
    nodes = [n for n in model.graph.node if not (n.op_type == "Mul" and "w" in n.input)]
    nodes[-1].output[0] = "y"
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    keep = [i for i in model.graph.initializer if i.name != "w"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    m, res, ctx = _run(model, target="none" if elem == TensorProto.DOUBLE else "ascend910b2")  # no float64 kernel
    if elem == TensorProto.FLOAT16:  # computed in float16 itself: not the body's float32
        assert not res.modified and "computed in its own type" in " ".join(str(e) for e in ctx.explanations)
        return
    assert ops(m) == ["RmsNorm"]
    (node,) = m.graph.nodes
    assert np.all(np.asarray(node.inputs[1].values) == 1) and node.inputs[1].shape == (W,)
    dtype = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}[elem]
    feeds = {"x": _special(dtype)}
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)
