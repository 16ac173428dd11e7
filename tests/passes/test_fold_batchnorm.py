import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.infra import PassContext
from graphpass.ir import annotations as A
from graphpass.passes import fold_batchnorm
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(0)


def _bn_params(c, prefix="bn"):
    return {f"{prefix}_s": RNG.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_b": RNG.standard_normal(c).astype(np.float32),
            f"{prefix}_m": RNG.standard_normal(c).astype(np.float32), f"{prefix}_v": RNG.uniform(0.5, 1.5, c).astype(np.float32)}


def _bn(x, y, prefix="bn", **attrs):
    return helper.make_node("BatchNormalization", [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                            name=prefix, epsilon=1e-3, **attrs)


def _conv_bn(group=1, bias=True, dtype=np.float32):
    w = RNG.standard_normal((8, 8 // group, 3, 3)).astype(dtype)
    inits = {"w": w, **_bn_params(8)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(8).astype(dtype)
        conv_in.append("b")
    return make_model([helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], group=group), _bn("c", "y")],
                      {"x": [2, 8, 6, 6]}, {"y": [2, 8, 6, 6]}, initializers=inits)


def test_folds_into_conv_with_and_without_bias_and_groups():
    for group, bias in ((1, True), (1, False), (4, True), (8, False)):
        model = _conv_bn(group, bias)
        graph = gp.load(model)
        result = fold_batchnorm(graph)
        assert result.modified and result.stats["fired"] == 1
        assert ops(graph) == ["Conv"]
        conv = graph.nodes[0]
        assert conv.outputs[0].name == "y" and len(conv.inputs) == 3
        assert A.get(conv, A.PASS) == "fold_batchnorm" and A.fused_from(conv) == ["conv", "bn"]
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_folds_into_conv_transpose_and_gemm():
    ct = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2]), _bn("c", "y")],
                    {"x": [1, 4, 5, 5]}, {"y": [1, 6, 11, 11]},
                    initializers={"w": RNG.standard_normal((4, 6, 3, 3)).astype(np.float32), **_bn_params(6)})
    gemm = make_model([helper.make_node("Gemm", ["x", "w", "c0"], ["g"], transB=1, beta=0.5), _bn("g", "y")],
                      {"x": [3, 5]}, {"y": [3, 7]},
                      initializers={"w": RNG.standard_normal((7, 5)).astype(np.float32), "c0": RNG.standard_normal(7).astype(np.float32),
                                    **_bn_params(7)})
    for model, op in ((ct, "ConvTranspose"), (gemm, "Gemm")):
        graph = gp.load(model)
        assert fold_batchnorm(graph).modified and ops(graph) == [op]
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def _refusal(model):
    graph = gp.load(model)
    ctx = PassContext()
    result = fold_batchnorm(graph, ctx)
    assert not result.modified and "BatchNormalization" in ops(graph)
    return ctx.explanations[0].reason


def test_refuses_with_reasons():
    assert "float16" in _refusal(_conv_bn(dtype=np.float16).__class__.FromString(_fp16_model().SerializeToString()))
    shared = _conv_bn()
    shared.graph.node.append(helper.make_node("Conv", ["x", "w"], ["other"], pads=[1, 1, 1, 1]))
    shared.graph.output.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, [2, 8, 6, 6]))
    assert "shared with Conv" in _refusal(shared)
    runtime = _conv_bn()
    runtime.graph.initializer.remove(next(i for i in runtime.graph.initializer if i.name == "bn_v"))
    runtime.graph.input.append(helper.make_tensor_value_info("bn_v", TensorProto.FLOAT, [8]))
    assert "'bn_v' is not a constant" in _refusal(runtime)
    grouped = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=2), _bn("c", "y")],
                         {"x": [1, 4, 5, 5]}, {"y": [1, 6, 7, 7]},
                         initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), **_bn_params(6)})
    assert "grouped ConvTranspose" in _refusal(grouped)


def _fp16_model():
    w = RNG.standard_normal((8, 8, 3, 3)).astype(np.float16)
    p = {k: v.astype(np.float16) for k, v in _bn_params(8).items()}
    return make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _bn("c", "y")],
                      {"x": (TensorProto.FLOAT16, [1, 8, 4, 4])}, {"y": (TensorProto.FLOAT16, [1, 8, 4, 4])},
                      initializers={"w": w, **p})


def test_bn_after_non_conv_is_not_matched():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), _bn("r", "y")], {"x": [1, 8, 4, 4]}, {"y": [1, 8, 4, 4]},
                       initializers=_bn_params(8))
    graph = gp.load(model)
    assert not fold_batchnorm(graph).modified
