"""The Ascend cost model: formulas against CANN's estimator, the directions the seeds teach."""

import dataclasses
import json
import os

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import AscendCostModel, create, load_profile
from graphpass.cost_model.ascend import cube_cycles_conv, cube_cycles_matmul, padded_numel, vector_cycles
from graphpass.ir import annotations as A
from graphpass.testing import make_model

F16 = TensorProto.FLOAT16


def _one_core(target="ascend910a"):
    p = load_profile(target)
    return AscendCostModel(dataclasses.replace(p, values={**p.values, "ai_core_count": 1, "vector_core_count": 1}))


def _node(report, op):
    return next(n for n in report.nodes if n["op"] == op)


# -- CANN's own estimator (ascend_facts.md §9) -----------------------------------------------

FR = AscendCostModel().fr  # the fractal sizes of the data files (16x16, C0 16 / 32)


def test_conv_cycles_match_cann_estimator():
    # ceil(H*W/16) * K1 * N1 * N, K1 = C1*kh*kw, N1 = ceil(Cout/16)
    assert cube_cycles_conv(1, 64, 64, 3, 3, 56, 56, 1, FR, 16) == 196 * (4 * 9) * 4 * 1 == 28224
    assert cube_cycles_conv(8, 3, 64, 7, 7, 112, 112, 1, FR, 16) == 784 * (1 * 49) * 4 * 8


def test_depthwise_groups_are_packed_into_one_fractal():
    # 58 one-channel groups: 16 per fractal -> 4 packed groups of 1 K-block and 1 N-block each,
    # not 58 (issue 21: about 16x too much before)
    assert cube_cycles_conv(1, 58, 58, 3, 3, 28, 28, 58, FR, 16) == 49 * 9 * 1 * 4
    # 4-channel groups: 4 per fractal
    assert cube_cycles_conv(1, 64, 64, 3, 3, 28, 28, 16, FR, 16) == 49 * 9 * 1 * 4
    # groups of 16 or more channels fill a fractal each: no packing
    assert cube_cycles_conv(1, 64, 64, 3, 3, 28, 28, 2, FR, 16) == 49 * (2 * 9) * 2 * 2


def test_matmul_and_vector_cycles_match_cann_estimator():
    assert cube_cycles_matmul(128, 256, 512, 1, FR, 16) == 8 * 16 * 32
    assert cube_cycles_matmul(17, 16, 16, 3, FR, 16) == 2 * 1 * 1 * 3
    assert vector_cycles(1 * 64 * 56 * 56, 128, 3.0) == 3 * 200704 / 128


def test_model_uses_those_cycles_on_one_core():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": (F16, [1, 64, 56, 56])}, {"y": (F16, [1, 64, 56, 56])},
                       initializers={"w": np.zeros((64, 64, 3, 3), np.float16)})
    cm = _one_core()
    eff = cm.pv.cube_efficiency  # the share of the estimator's cycles the Cube achieves (fitted, data file)
    r = cm.estimate(gp.load(model).graph)
    conv = _node(r, "Conv")
    assert conv["cube_us"] == pytest.approx(28224 / 1000.0 / eff)  # cycles / 1000 MHz / efficiency
    mm = make_model([helper.make_node("MatMul", ["a", "b"], ["c"])], {"a": (F16, [128, 256]), "b": (F16, [256, 512])},
                    {"c": (F16, [128, 512])})
    assert _node(_one_core().estimate(gp.load(mm).graph), "MatMul")["cube_us"] == pytest.approx(4096 / 1000.0 / eff)


# -- formats and padding -----------------------------------------------------------------------

def _relu_5hd(c):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (F16, [1, c, 64, 64])}, {"y": (F16, [1, c, 64, 64])})
    g = gp.load(model).graph
    A.set_format(g.inputs[0], "NC1HWC0")
    return AscendCostModel().estimate(g)


def test_c16_vs_c17_padding_jump():
    assert padded_numel([1, 16, 8, 8], "NC1HWC0", 2, FR) == 1024
    assert padded_numel([1, 17, 8, 8], "NC1HWC0", 2, FR) == 2048
    m16, m17 = _node(_relu_5hd(16), "Relu")["memory_us"], _node(_relu_5hd(17), "Relu")["memory_us"]
    assert m17 == pytest.approx(2 * m16)  # 17 channels occupy 32 lanes


def test_fp32_conv_costs_more_than_fp16_on_910a():
    def conv(dtype):
        np_t = np.float16 if dtype == F16 else np.float32
        m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": (dtype, [1, 64, 56, 56])}, {"y": (dtype, [1, 64, 56, 56])},
                       initializers={"w": np.zeros((64, 64, 3, 3), np_t)})
        return gp.load(m).graph

    cm = AscendCostModel("ascend910a")
    f16 = cm.estimate(conv(F16)).total_us
    assert cm.estimate(conv(TensorProto.FLOAT), precision_mode="force_fp16").total_us > f16
    keep = cm.estimate(conv(TensorProto.FLOAT), precision_mode="must_keep_origin_dtype")
    assert keep.total_us > f16 and _node(keep, "Conv")["engine"] == "AICPU"  # no fp32 Cube on 910A
    # on 910B2 the Cube has fp32: it stays on AI Core
    assert _node(AscendCostModel("ascend910b2").estimate(conv(TensorProto.FLOAT), precision_mode="must_keep_origin_dtype"),
                 "Conv")["engine"] == "AICORE"


def test_cube_bound_graph_is_faster_on_910b2():
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["c"])], {"a": (F16, [4096, 4096]), "b": (F16, [4096, 4096])},
                   {"c": (F16, [4096, 4096])})
    g = gp.load(m).graph
    a, b = AscendCostModel("ascend910a").estimate(g), AscendCostModel("ascend910b2").estimate(g)
    assert _node(a, "MatMul")["bound"] == "cube"
    assert _node(b, "MatMul")["us"] < _node(a, "MatMul")["us"]


# -- engines, crossings, dynamic shapes, loops ------------------------------------------------

def test_aicpu_node_between_ai_core_nodes_adds_two_crossings():
    m = make_model([helper.make_node("Relu", ["x"], ["a"]),
                    helper.make_node("Resize", ["a", "", "scales"], ["b"], mode="cubic"),  # cubic: AI CPU (op_info.toml)
                    helper.make_node("Relu", ["b"], ["y"])],
                   {"x": (F16, [1, 16, 32, 32])}, {"y": (F16, [1, 16, 64, 64])},
                   initializers={"scales": np.array([1, 1, 2, 2], np.float32)})
    r = AscendCostModel().estimate(gp.load(m).graph)
    assert _node(r, "Resize")["engine"] == "AICPU"
    assert [(c["from"], c["to"]) for c in r.crossings] == [("AICORE", "AICPU"), ("AICPU", "AICORE")]


def _topk_model(k_const: bool):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("TopK", ["r", "k"], ["v", "i"]),
             helper.make_node("ReduceSum", ["v"], ["y"], keepdims=0)]
    inputs = {"x": (F16, [1, 4096])}
    inits = {}
    if k_const:
        inits["k"] = np.array([16], np.int64)
    else:
        inputs["k"] = (TensorProto.INT64, [1])
    return gp.load(make_model(nodes, inputs, {"y": (F16, [])}, initializers=inits, opset=13)).graph


def test_topk_with_runtime_k_makes_its_region_host_scheduled():
    dyn = AscendCostModel().estimate(_topk_model(False))
    assert dyn.dynamic_regions and dyn.dynamic_regions[0]["reason"] == "TopK with a runtime k"
    assert dyn.dynamic_regions[0]["nodes"] == 2  # TopK and the ReduceSum after it
    static = AscendCostModel().estimate(_topk_model(True))
    assert not static.dynamic_regions and static.total_us < dyn.total_us


def _loop_graph(sunk: bool):
    body = helper.make_graph(
        [helper.make_node("Relu", ["acc_in"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F16, [1, 16, 32, 32])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F16, [1, 16, 32, 32])],
    )
    g = gp.load(make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], {"x": (F16, [1, 16, 32, 32])},
                           {"y": (F16, [1, 16, 32, 32])}, initializers={"n": np.array(10, np.int64)})).graph
    if sunk:
        A.set(g.nodes[0], A.SINK, "device")
    return g


def test_sunk_loop_costs_less_than_the_same_loop_unsunk():
    cm = AscendCostModel()
    sunk, unsunk = cm.estimate(_loop_graph(True)), cm.estimate(_loop_graph(False))
    assert sunk.total_us < unsunk.total_us
    assert "10 iterations" in _node(unsunk, "Loop")["note"]


def test_iterations_per_loop_amortizes_the_step_term():
    g = _loop_graph(True)
    cm = AscendCostModel()
    assert cm.estimate(g, iterations_per_loop=1000).total_us < cm.estimate(g, iterations_per_loop=1).total_us


# -- seed directions ---------------------------------------------------------------------------

def test_extract_image_patches_on_host_costs_more_than_a_conv():
    eip = make_model([helper.make_node("ExtractImagePatches", ["x"], ["y"], domain="tf", ksizes=[1, 3, 3, 1],
                                       strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="VALID")],
                     {"x": [1, 64, 64, 16]}, {"y": [1, 62, 62, 144]}, extra_opsets={"tf": 1})
    host = gp.load(eip).graph
    A.set_engine(host.nodes[0], "HOST")  # the py_func fallback of seed 000
    conv = make_model([helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
                       helper.make_node("Conv", ["xt", "w"], ["c"]),
                       helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])],
                      {"x": [1, 64, 64, 16]}, {"y": [1, 62, 62, 144]},
                      initializers={"w": np.zeros((144, 16, 3, 3), np.float32)})
    cm = AscendCostModel()
    on_host, by_conv = cm.estimate(host), cm.estimate(gp.load(conv).graph)
    assert on_host.total_us > by_conv.total_us
    assert on_host.crossings and not by_conv.crossings


def _shuffle_between_convs(use_gather: bool):
    c = 116
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"])]
    inits = {"w1": np.zeros((c, c, 1, 1), np.float16), "w2": np.zeros((c, c, 1, 1), np.float16)}
    if use_gather:
        perm = np.arange(c).reshape(2, c // 2).T.ravel().astype(np.int64)
        inits["perm"] = perm
        nodes.append(helper.make_node("Gather", ["a", "perm"], ["s"], axis=1))
    else:
        inits["s5"] = np.array([1, 2, c // 2, 28, 28], np.int64)
        inits["s4"] = np.array([1, c, 28, 28], np.int64)
        nodes += [helper.make_node("Reshape", ["a", "s5"], ["r"]),
                  helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
                  helper.make_node("Reshape", ["t", "s4"], ["s"])]
    nodes.append(helper.make_node("Conv", ["s", "w2"], ["y"]))
    return gp.load(make_model(nodes, {"x": (F16, [1, c, 28, 28])}, {"y": (F16, [1, c, 28, 28])}, initializers=inits)).graph


def test_channel_shuffle_by_transpose_costs_more_than_by_gather():
    cm = AscendCostModel()
    rtr, gather = cm.estimate(_shuffle_between_convs(False)), cm.estimate(_shuffle_between_convs(True))
    assert rtr.total_us > gather.total_us
    # both leave 5HD for an ND island: two TransData each, around the shuffle
    assert rtr.transdata["implicit"] >= 2 and gather.transdata["implicit"] >= 2


def _concat_of(c):
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["x", "w2"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1), helper.make_node("Conv", ["cat", "w3"], ["y"])]
    inits = {"w1": np.zeros((c, 16, 1, 1), np.float16), "w2": np.zeros((c, 16, 1, 1), np.float16),
             "w3": np.zeros((16, 2 * c, 1, 1), np.float16)}
    return gp.load(make_model(nodes, {"x": (F16, [1, 16, 28, 28])}, {"y": (F16, [1, 16, 28, 28])}, initializers=inits)).graph


def test_concat_of_unaligned_channels_in_5hd_costs_more():
    cm = AscendCostModel()
    c58, c64 = cm.estimate(_concat_of(58)), cm.estimate(_concat_of(64))
    cat58, cat64 = _node(c58, "Concat"), _node(c64, "Concat")
    assert cat64["us"] == 0.0 and "no-task" in cat64["note"]
    assert cat58["us"] > 0 and "repacking" in cat58["note"]
    assert c58.total_us > c64.total_us


# -- robustness and the report -------------------------------------------------------------------

def test_unknown_ops_dtypes_and_symbolic_shapes_are_costed_with_assumptions():
    m = make_model([helper.make_node("Mystery", ["x"], ["a"], domain="com.vendor"), helper.make_node("Relu", ["a"], ["y"])],
                   {"x": ["N", 3, "H", "W"]}, {"y": ["N", 3, "H", "W"]}, extra_opsets={"com.vendor": 1})
    r = AscendCostModel().estimate(gp.load(m).graph)
    assert r.unknown_ops == ["com.vendor::Mystery"]
    assert _node(r, "com.vendor::Mystery")["engine"] == "AICPU"
    assert any("symbolic dim 'N'" in a for a in r.assumptions)
    assert r.total_us > 0


REQUIRED = {"schema": str, "target": str, "precision_mode": str, "iterations_per_loop": int, "estimate": bool,
            "total_us": float, "breakdown_us": dict, "per_engine_us": dict, "per_op_us": dict, "transdata": dict,
            "crossings": dict, "dynamic_regions": list, "unknown_ops": list, "assumptions": list, "nodes": list}
NODE_KEYS = {"name", "op", "engine", "formats_in", "formats_out", "us", "bound", "cube_us", "vector_us", "memory_us", "launch_us", "note"}


def test_json_follows_the_documented_schema(light_path):
    r = create().estimate(gp.load(light_path("light_resnet50.onnx")).graph)
    d = json.loads(r.to_json())
    for k, kind in REQUIRED.items():
        assert isinstance(d[k], kind), k
    assert d["schema"] == "graphpass.cost_report/1" and d["estimate"] is True
    assert all(NODE_KEYS <= set(n) for n in d["nodes"])
    assert set(d["crossings"]) >= {"count", "bytes", "us", "list"}
    assert r.to_csv().splitlines()[0].startswith("name,op,engine")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")) if f.endswith(".onnx")))
def test_every_light_model_gets_a_plausible_breakdown(name, light_path):
    r = create().estimate(gp.load(light_path(name)).graph)
    assert r.total_us > 0 and not r.unknown_ops
    ops = sorted(r.per_op_us.items(), key=lambda kv: -kv[1])
    assert ops[0][0] in ("Conv", "Gemm", "BatchNormalization", "TransData (implicit)")
    assert "estimate" in r.to_table()
    if name == "light_resnet50.onnx":
        assert ops[0][0] == "Conv"  # Conv dominates ResNet-50 at batch 1


def test_unknown_target_and_precision_mode():
    from graphpass.errors import UsageError

    with pytest.raises(UsageError, match="known targets: ascend910a, ascend310p3, ascend910b2"):
        create("ascend999")
    with pytest.raises(UsageError, match="unknown precision mode"):
        AscendCostModel().estimate(_loop_graph(True), precision_mode="fp8_everything")
