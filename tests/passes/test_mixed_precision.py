import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass import precision as P
from graphpass import verify as V
from graphpass.cli import main
from graphpass.ir import annotations as A
from graphpass.passes import mixed_precision
from graphpass.testing import make_model, ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import dbnet_precision  # noqa: E402

RNG = np.random.default_rng(7)


def _net():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Exp", ["r"], ["e"], name="exp"),
             helper.make_node("Add", ["e", "r"], ["y"], name="add")]
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                      initializers={"w": (RNG.standard_normal((4, 3, 3, 3)) * 0.1).astype(np.float32)})


def _fp16_nodes(graph):
    return sorted(n.name for n in graph.nodes if A.get(n, "graphpass.precision") == "fp16")


@pytest.mark.parametrize("mode, expected", [
    ("force_fp16", ["add", "conv", "exp", "relu"]),
    ("allow_fp32_to_fp16", ["conv"]),
    ("allow_mix_precision", ["conv", "relu"]),  # Exp is black; Add reads fp32 Exp output, so it follows fp32
])
def test_modes_choose_the_fp16_nodes_and_cast_only_at_boundaries(mode, expected):
    model = _net()
    graph = gp.load(model)
    result = mixed_precision(graph, mode=mode)
    assert result.modified and _fp16_nodes(graph) == expected
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT  # outputs keep their dtype
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert ops(graph).count("Cast") == result.stats["casts"] <= 3
    assert "Conv" in result.stats["fp16_only_ops"]
    report = V.verify_models(model, out, rtol=1e-2, atol=1e-2)
    assert report.ok


def test_keep_fp32_and_must_keep_origin_dtype():
    graph = gp.load(_net())
    mixed_precision(graph, mode="force_fp16", keep_fp32=["exp"])
    assert "exp" not in _fp16_nodes(graph)
    graph = gp.load(_net())
    assert not mixed_precision(graph, mode="must_keep_origin_dtype").modified


def test_precision_flags_the_underflow_and_auto_keep_list_fixes_it():
    model = dbnet_precision.build()
    report = P.analyze(model)
    risky = {r.name for r in report.risky}
    assert {"tiny_out", "log1p_out"} <= risky
    assert {"tiny", "one_plus", "log1p"} <= set(report.keep_fp32)

    def error(keep):
        opts = {"mixed_precision": {"mode": "force_fp16", "keep_fp32": keep, "emulate": True}}
        result = gp.optimize(model, enable=["mixed_precision"], options=opts)
        return V.verify_models(model, gp.to_proto(result.graph), rtol=V.FP16_RTOL, atol=V.FP16_ATOL)

    assert not error([]).ok  # force_fp16 loses log(1 + tiny)
    assert error(report.keep_fp32).ok


def test_precision_finds_overflow_and_suggests_a_loss_scale():
    over = make_model([helper.make_node("Mul", ["x", "k"], ["y"], name="big")], {"x": [64]}, {"y": [64]},
                      initializers={"k": np.array(1e6, np.float32)})
    r = P.analyze(over)
    assert r.risky and r.risky[0].overflow > 0 and r.keep_fp32 == ["big"]
    tiny = make_model([helper.make_node("Mul", ["x", "k"], ["y"], name="small")], {"x": [64]}, {"y": [64]},
                      initializers={"k": np.array(1e-9, np.float32)})
    r = P.analyze(tiny)
    assert r.risky[0].flush_share > 0.5 and r.loss_scale is not None and r.loss_scale >= 2 ** 10


def test_cli_precision_and_optimize_keep_fp32_auto(tmp_path, capsys):
    src = tmp_path / "db.onnx"
    src.write_bytes(dbnet_precision.build().SerializeToString())
    assert main(["precision", str(src)]) == 0
    out = capsys.readouterr().out
    assert "tiny_out" in out and "keep in fp32" in out
    dst = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(dst), "--mixed-precision", "force_fp16", "--keep-fp32", "auto", "-q"]) == 0
    m = onnx.load(dst)
    precision = {n.name: {p.key: p.value for p in n.metadata_props}.get("graphpass.precision") for n in m.graph.node}
    assert precision.get("log1p") is None and "fp16" in precision.values()
