"""issue 26: bfloat16 mixed precision where the target has it (910B), float16 elsewhere."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.ir import annotations as A
from graphpass.passes import mixed_precision
from graphpass.testing import make_model, ort_run

RNG = np.random.default_rng(2616)


def _mlp():
    """MatMul (white), Softmax (black), Relu (white) and an Add that follows its inputs."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["p"], name="softmax", axis=-1),
             helper.make_node("Add", ["r", "b"], ["y"], name="add")]
    return make_model(nodes, {"x": [2, 8]}, {"p": [2, 8], "y": [2, 8]}, opset=18,
                      initializers={"w": (RNG.standard_normal((8, 8)) * 0.3).astype(np.float32),
                                    "b": RNG.standard_normal(8).astype(np.float32)})


def _low(graph, tag):
    return sorted(n.name for n in graph.nodes if A.get(n, "graphpass.precision") == tag)


@pytest.mark.parametrize("mode, expected", [("allow_mix_precision_bf16", ["add", "mm", "relu"]),
                                            ("allow_fp32_to_bf16", ["mm"])])
def test_bf16_modes_convert_to_bfloat16_on_910b(mode, expected):
    model = _mlp()
    graph = gp.load(model).graph
    result = mixed_precision(graph, gp.PassContext(target="ascend910b2"), mode=mode)
    assert result.modified and _low(graph, "bf16") == expected and not _low(graph, "fp16")
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    assert {helper.get_attribute_value(c.attribute[0]) for c in casts} == {TensorProto.BFLOAT16, TensorProto.FLOAT}
    inits = {t.name: t.data_type for t in out.graph.initializer}
    assert TensorProto.BFLOAT16 in inits.values()  # the MatMul weight converted at compile time
    assert not any(t == TensorProto.FLOAT16 for t in inits.values())
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT


@pytest.mark.parametrize("target", ["ascend910a", "ascend310p3"])
def test_bf16_modes_are_refused_where_the_target_has_no_bfloat16(target):
    graph = gp.load(_mlp()).graph
    with pytest.raises(UsageError, match="does not have"):
        mixed_precision(graph, gp.PassContext(target=target), mode="allow_mix_precision_bf16")


def test_bf16_emulation_rounds_to_bfloat16_not_float16():
    """Emulated (fp32 dtypes, every low value rounded): a value beyond fp16's 65504 survives in
    bf16, and the rounding is bf16's (8 bits of mantissa)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, {"x": [4]}, {"y": [4]}, opset=18)
    graph = gp.load(model).graph
    mixed_precision(graph, gp.PassContext(target="ascend910b2"), mode="allow_mix_precision_bf16", emulate=True)
    x = np.array([1e5, 1.0 + 2 ** -10, -3.0, 0.1], np.float32)
    y = ort_run(gp.to_proto(graph), {"x": x})["y"]
    want = np.maximum(x, 0).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(y, want) and np.isfinite(y[0])


def test_the_cli_offers_the_bf16_modes():
    toolchain = gp.Target.none()
    assert {"allow_mix_precision_bf16", "allow_fp32_to_bf16"} <= set(toolchain.precision_mode_names(mixed_precision=True))
    # not fp16-lowering modes: graphpass precision judges float16 ranges
    assert "allow_mix_precision_bf16" not in toolchain.precision_mode_names(lowers=True)
