import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.check import precision as P
from graphpass.check import verify as V
from graphpass.cli import main
from graphpass.ir import annotations as A
from graphpass.ir.graph import graph_protos
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
    graph = gp.load(model).graph
    result = mixed_precision(graph, gp.PassContext(target="ascend910a"), mode=mode)
    assert result.modified and _fp16_nodes(graph) == expected
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT  # outputs keep their dtype
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert ops(graph).count("Cast") == result.stats["casts"] <= 3
    assert "Conv" in result.stats["fp16_only_ops"]  # the target's op table: fp16-only on 910A
    report = V.verify_models(model, out, rtol=1e-2, atol=1e-2)
    assert report.ok


def test_fp16_only_ops_come_from_the_target_and_none_has_no_op_table():
    graph = gp.load(_net())
    res = mixed_precision(graph, gp.PassContext(target="none"), mode="force_fp16")
    assert res.modified and res.stats["fp16_only_ops"] == ""
    with pytest.raises(gp.UsageError, match="mixed_precision: unknown mode 'force_fp32'; known: force_fp16, "
                                            "allow_fp32_to_fp16, allow_mix_precision, allow_mix_precision_bf16, "
                                            "allow_fp32_to_bf16, must_keep_origin_dtype"):
        mixed_precision(gp.load(_net()), mode="force_fp32")


def test_keep_fp32_and_must_keep_origin_dtype():
    graph = gp.load(_net()).graph
    mixed_precision(graph, mode="force_fp16", keep_fp32=["exp"])
    assert "exp" not in _fp16_nodes(graph)
    graph = gp.load(_net()).graph
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


# Issue 16 item 5: only the inputs that share the op's data type (schema type parameter) become fp16.

def _convert_and_run(model, feeds, rtol=2e-2, atol=2e-2, emulate=False):
    graph = gp.load(model).graph
    result = mixed_precision(graph, mode="force_fp16", emulate=emulate)
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    ref = V.run(V.session(model), feeds)
    got = V.run(V.session(out), feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=atol, err_msg=k)
    return result, out


def _elem_types(model):
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    vis = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
    types = {v.name: v.type.tensor_type.elem_type for v in vis}
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    return types


def test_resize_roi_and_scales_stay_float32():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Resize", ["r", "roi", "scales"], ["y"], name="resize", mode="linear")]
    model = make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 8, 8]},
                       initializers={"roi": np.array([], np.float32), "scales": np.array([1, 1, 2, 2], np.float32)})
    feeds = {"x": RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    for emulate in (False, True):
        result, out = _convert_and_run(model, feeds, emulate=emulate)
        resize = next(n for n in out.graph.node if n.op_type == "Resize")
        types = _elem_types(out)
        assert types[resize.input[1]] == TensorProto.FLOAT and types[resize.input[2]] == TensorProto.FLOAT
        if not emulate:
            assert types[resize.input[0]] == TensorProto.FLOAT16 and result.stats["fp16_nodes"] == 2


def test_resize_scales_computed_by_an_fp16_op_are_cast_back():
    # the scales come out of a Mul that itself runs in fp16: the Resize reads them back in fp32
    nodes = [helper.make_node("Mul", ["s0", "two"], ["scales"], name="scale_mul"),
             helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="nearest")]
    model = make_model(nodes, {"x": [1, 1, 2, 2], "s0": [4]}, {"y": [1, 1, 4, 4]},
                       initializers={"two": np.array(2.0, np.float32)})
    feeds = {"x": RNG.standard_normal((1, 1, 2, 2)).astype(np.float32), "s0": np.ones(4, np.float32)}
    _, out = _convert_and_run(model, feeds)
    resize = next(n for n in out.graph.node if n.op_type == "Resize")
    assert _elem_types(out)[resize.input[2]] == TensorProto.FLOAT


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_clip_min_max_follow_the_data_type(opset):
    # min is a runtime tensor (computed in fp16 here), max a constant: both must be fp16 with the data
    nodes = [helper.make_node("Mul", ["m", "lo"], ["lo2"], name="runtime_min"),
             helper.make_node("Clip", ["x", "lo2", "hi"], ["y"], name="clip")]
    model = make_model(nodes, {"x": [8], "m": []}, {"y": [8]}, opset=opset,
                       initializers={"lo": np.array(-0.5, np.float32), "hi": np.array(0.75, np.float32)})
    feeds = {"x": np.linspace(-2, 2, 8).astype(np.float32), "m": np.array(1.0, np.float32)}
    _, out = _convert_and_run(model, feeds)
    clip = next(n for n in out.graph.node if n.op_type == "Clip")
    types = _elem_types(out)
    assert {types[i] for i in clip.input} == {TensorProto.FLOAT16}


def test_layer_normalization_keeps_mean_and_inv_std_in_float32():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], name="ln", axis=-1)]
    model = make_model(nodes, {"x": [2, 8]}, {"y": [2, 8], "mean": [2, 1], "inv": [2, 1]},
                       initializers={"g": np.ones(8, np.float32), "b": np.zeros(8, np.float32)})
    feeds = {"x": RNG.standard_normal((2, 8)).astype(np.float32)}
    result, out = _convert_and_run(model, feeds)
    assert result.stats["fp16_nodes"] == 1
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [TensorProto.FLOAT] * 3


def _if_and_loop_model():
    then = helper.make_graph([helper.make_node("Resize", ["a", "roi", "sc"], ["t"], name="then_resize", mode="nearest")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                             [onnx.numpy_helper.from_array(np.array([], np.float32), "roi"),
                              onnx.numpy_helper.from_array(np.array([1, 1, 1, 1], np.float32), "sc")])
    els = helper.make_graph([helper.make_node("Mul", ["a", "k"], ["e"], name="else_mul")], "else", [],
                            [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Add", ["acc", "a"], ["acc2"], name="body_add"),
         helper.make_node("Clip", ["acc2", "lo", "hi"], ["acc3"], name="body_clip")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc3", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(-3.0, np.float32), "lo"),
         onnx.numpy_helper.from_array(np.array(3.0, np.float32), "hi")])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["c"], ["yi"], name="if", then_branch=then, else_branch=els),
             helper.make_node("Loop", ["n", "", "x"], ["yl"], name="loop", body=body)]
    return make_model(nodes, {"x": [1, 1, 2, 2], "c": (TensorProto.BOOL, []), "n": (TensorProto.INT64, [])},
                      {"yi": [1, 1, 2, 2], "yl": [1, 1, 2, 2]}, initializers={"k": np.array(3.0, np.float32)})


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("emulate", [False, True])
def test_if_and_loop_bodies_are_converted_and_stay_valid(cond, emulate):
    model = _if_and_loop_model()
    feeds = {"x": RNG.standard_normal((1, 1, 2, 2)).astype(np.float32), "c": np.array(cond), "n": np.array(3, np.int64)}
    result, out = _convert_and_run(model, feeds, emulate=emulate)
    fp16 = {n.name for g in graph_protos(out.graph)
            for n in g.node if {p.key: p.value for p in n.metadata_props}.get("graphpass.precision") == "fp16"}
    if not emulate:
        assert {"relu", "then_resize", "else_mul", "body_add", "body_clip"} <= fp16
    assert result.stats["fp16_nodes"] == 5


def test_keep_fp32_names_an_unnamed_node_by_its_first_output():
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Mul", ["a", "a"], ["sq"]),
             helper.make_node("Sqrt", ["sq"], ["y"])]
    model = make_model(nodes, {"x": [8]}, {"y": [8]}, initializers={"k": np.array(400, np.float32)})
    graph = gp.load(model).graph
    mixed_precision(graph, mode="force_fp16", keep_fp32=["sq", "y"])
    half = [n.outputs[0].name for n in graph.nodes if A.get(n, "graphpass.precision") == "fp16"]
    assert half == ["a"]
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    x = np.linspace(-2, 2, 8).astype(np.float32)
    np.testing.assert_allclose(V.run(V.session(out), {"x": x})["y"], 400 * np.abs(x), rtol=1e-3)


I64 = TensorProto.INT64


@pytest.mark.parametrize("op, inputs, attrs, inits, out_shape", [
    ("Pad", ["r", "pads", "cval"], {}, {"pads": np.array([0, 1, 0, 1], np.int64), "cval": np.array(0.5, np.float32)}, [2, 6]),
    ("Slice", ["r", "starts", "ends"], {}, {"starts": np.array([0, 1], np.int64), "ends": np.array([2, 3], np.int64)}, [2, 2]),
    ("Reshape", ["r", "shape"], {}, {"shape": np.array([4, 2], np.int64)}, [4, 2]),
    ("Tile", ["r", "reps"], {}, {"reps": np.array([1, 2], np.int64)}, [2, 8]),
    ("Expand", ["r", "eshape"], {}, {"eshape": np.array([3, 2, 4], np.int64)}, [3, 2, 4]),
    ("Gather", ["r", "idx"], {"axis": 1}, {"idx": np.array([3, 0], np.int64)}, [2, 2]),
    ("Split", ["r", "split"], {"axis": 1}, {"split": np.array([1, 3], np.int64)}, [2, 1]),
    ("Unsqueeze", ["r", "axes"], {}, {"axes": np.array([0], np.int64)}, [1, 2, 4]),
    ("ReduceMax", ["r", "raxes"], {}, {"raxes": np.array([1], np.int64)}, [2, 1]),
])
def test_shape_and_index_inputs_keep_their_dtype(op, inputs, attrs, inits, out_shape):
    outs = ["y", "y2"] if op == "Split" else ["y"]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node(op, inputs, outs, name="op", **attrs)]
    if op == "ReduceMax":
        model = make_model(nodes, {"x": [2, 4]}, {"y": out_shape}, initializers=inits, opset=18)
    else:
        model = make_model(nodes, {"x": [2, 4]}, {"y": out_shape}, initializers=inits)
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32)}
    result, out = _convert_and_run(model, feeds)
    assert result.stats["fp16_nodes"] == 2
    node = next(n for n in out.graph.node if n.name == "op")
    types = _elem_types(out)
    for given, now in zip(inputs, node.input):
        if given != "r":
            assert types[now] == onnx.helper.np_dtype_to_tensor_dtype(np.asarray(inits[given]).dtype) or \
                (given == "cval" and types[now] == TensorProto.FLOAT16), (given, types[now])


def test_topk_values_fp16_indices_int64():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("TopK", ["r", "k"], ["v", "i"], name="topk", axis=-1)]
    model = make_model(nodes, {"x": [2, 6]}, {"v": [2, 3], "i": (I64, [2, 3])}, initializers={"k": np.array([3], np.int64)})
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32)}
    result, out = _convert_and_run(model, feeds)
    assert result.stats["fp16_nodes"] == 2
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [TensorProto.FLOAT, I64]


def test_an_omitted_optional_data_input_does_not_stop_the_conversion():
    # Clip(x, "", hi): min omitted; the op still converts, its present inputs become fp16
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")]
    model = make_model(nodes, {"x": [8]}, {"y": [8]}, opset=13, initializers={"hi": np.array(0.75, np.float32)})
    feeds = {"x": np.linspace(-2, 2, 8).astype(np.float32)}
    result, out = _convert_and_run(model, feeds)
    assert result.stats["fp16_nodes"] == 1
    clip = next(n for n in out.graph.node if n.op_type == "Clip")
    types = _elem_types(out)
    assert types[clip.input[0]] == types[clip.input[2]] == TensorProto.FLOAT16 and clip.input[1] == ""


def test_a_graph_output_also_read_by_an_fp16_node_feeds_it_the_fp16_value():
    # r is a graph output (kept fp32 by a Cast back) and Add's input: Add reads the fp16 value
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    model = make_model(nodes, {"x": [8]}, {"r": [8], "y": [8]})
    feeds = {"x": np.linspace(-2, 2, 8).astype(np.float32)}
    for emulate in (False, True):
        result, out = _convert_and_run(model, feeds, emulate=emulate)
        assert result.stats["fp16_nodes"] == 2
        assert [o.type.tensor_type.elem_type for o in out.graph.output] == [TensorProto.FLOAT] * 2
        if not emulate:
            add = next(n for n in out.graph.node if n.op_type == "Add")
            assert {_elem_types(out)[i] for i in add.input} == {TensorProto.FLOAT16}
            assert sum(n.op_type == "Cast" for n in out.graph.node) == 3  # x in, r and y back


def test_emulation_rounds_the_inputs_of_an_fp16_node_and_says_so_in_stats():
    # 1 + 2**-11 is not an fp16 value (it rounds to 1): an fp16 Sub of it and 1 gives 0, while
    # rounding only the result would give 2**-11 (an fp16 value)
    nodes = [helper.make_node("Sub", ["x", "one"], ["y"], name="sub")]
    model = make_model(nodes, {"x": [2]}, {"y": [2]}, initializers={"one": np.array(1.0, np.float32)})
    graph = gp.load(model).graph
    result = mixed_precision(graph, mode="force_fp16", emulate=True)
    assert result.stats["emulated"] == 1 and result.stats["constants_converted"] == 1
    out = gp.to_proto(graph)
    got = V.run(V.session(out), {"x": np.array([1 + 2 ** -11, 3.0], np.float32)})["y"]
    np.testing.assert_array_equal(got, np.array([0.0, 2.0], np.float32))
    plain = mixed_precision(gp.load(model), mode="force_fp16")
    assert plain.modified and "emulated" not in plain.stats
    nothing = mixed_precision(gp.load(model), mode="must_keep_origin_dtype", emulate=True)
    assert not nothing.modified and "emulated" not in nothing.stats


def test_cli_mixed_precision_with_an_explicit_pass_list_still_converts(tmp_path):
    # `--passes eliminate_identity --mixed-precision force_fp16` wrote an fp32 model, exit 0:
    # --mixed-precision only enabled the pass, and --enable does not add to an explicit list
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(make_model([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])],
                         {"x": [2, 4]}, {"y": [2, 4]}, initializers={"w": np.eye(4, dtype=np.float32)}), src)
    assert main(["optimize", str(src), "-o", str(dst), "--passes", "eliminate_identity",
                 "--mixed-precision", "force_fp16", "-q"]) == 0
    m = onnx.load(dst)
    assert "Identity" not in [n.op_type for n in m.graph.node]
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in m.graph.initializer) or \
        any(n.op_type == "Cast" for n in m.graph.node)


# --- the mutation run's survivors (README "Mutation testing") -------------------------------------

def test_fp16_only_ops_lists_exactly_the_fp16_only_ops_of_the_graph():
    graph = gp.load(_net())  # Conv, Relu, Exp, Add: only Conv is fp16-only on 910A
    res = mixed_precision(graph, gp.PassContext(target="ascend910a"), mode="force_fp16")
    assert res.stats["fp16_only_ops"] == "Conv"
    assert res.stats["constants_converted"] == 1 and res.stats["fp16_nodes"] == 4


def test_a_graph_with_nothing_to_convert_is_not_modified():
    nodes = [helper.make_node("Add", ["n", "n"], ["y"], name="add")]
    model = make_model(nodes, {"n": (TensorProto.INT64, [4])}, {"y": (TensorProto.INT64, [4])})
    for emulate in (False, True):
        graph = gp.load(model).graph
        result = mixed_precision(graph, mode="force_fp16", emulate=emulate)
        assert not result.modified and result.stats["fp16_nodes"] == 0 and "emulated" not in result.stats


def test_a_bfloat16_graph_is_not_converted():
    # bfloat16 is a float type numpy cannot name: it is not float32, so nothing changes
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")]
    model = make_model(nodes, {"x": (TensorProto.BFLOAT16, [4])}, {"y": (TensorProto.BFLOAT16, [4])})
    graph = gp.load(model).graph
    assert not mixed_precision(graph, mode="force_fp16").modified
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    assert ops(out) == ["Relu", "Add"] and _elem_types(out)["r"] == TensorProto.BFLOAT16


def _bn14(extra_opsets=None):
    c = 2
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "b", "mean", "var"], ["y"], name="bn")]
    inits = {"scale": np.array([1.5, -2], np.float32), "b": np.array([0.25, -0.0], np.float32),
             "mean": np.array([0.5, 1], np.float32), "var": np.array([4, 0.25], np.float32)}
    return make_model(nodes, {"x": [1, c, 2, 2]}, {"y": [1, c, 2, 2]}, opset=14, initializers=inits,
                      extra_opsets=extra_opsets)


def _bn_input_types(graph):
    bn = next(n for n in graph.nodes if n.op == "BatchNormalization")
    return [np.dtype(t.dtype).name for t in bn.inputs]


def test_batchnorm_14_converts_scale_and_bias_with_x_by_the_models_own_opset():
    # BatchNormalization-14 types X, scale and B alike (T) and mean/var apart (U); from opset 15
    # scale and B have their own type: the opset read must be the default domain's, 14
    model = _bn14(extra_opsets={"com.example": 21})  # another domain's version is not the opset
    feeds = {"x": np.array([-1, 0.5, 2, -0.0, 3, 1e-3, -4, 8], np.float32).reshape(1, 2, 2, 2)}
    result, out = _convert_and_run(model, feeds)
    assert result.stats["fp16_nodes"] == 1
    assert _bn_input_types(gp.load(out).graph) == ["float16"] * 3 + ["float32"] * 2


def test_a_graph_without_opset_imports_reads_its_own_opset():
    # a graph built with onnx-graphsurgeon by hand has no import_domains, only its opset
    graph = gp.load(_bn14()).graph
    graph.import_domains = None
    assert graph.opset == 14
    assert mixed_precision(graph, mode="force_fp16").stats["fp16_nodes"] == 1
    assert _bn_input_types(graph) == ["float16"] * 3 + ["float32"] * 2


def test_allow_mix_precision_gray_ops_follow_their_runtime_inputs():
    # Add is gray: fp16 after the (white) Relu, fp32 on a graph input; Sub reads only constants
    # besides the fp32 graph input x and stays fp32 too
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "c"], ["a"], name="after_white"),
             helper.make_node("Sub", ["x", "c"], ["s"], name="after_input"),
             helper.make_node("Mul", ["a", "s"], ["y"], name="mixed")]
    model = make_model(nodes, {"x": [4]}, {"y": [4]}, initializers={"c": np.array([0.5, -1, 2, -0.0], np.float32)})
    graph = gp.load(model).graph
    mixed_precision(graph, mode="allow_mix_precision")
    assert _fp16_nodes(graph) == ["after_white", "relu"]
    onnx.checker.check_model(gp.to_proto(graph), full_check=True)


def test_emulation_rounds_a_graph_output_written_by_an_fp16_node():
    # (1 + 2**-10)**2 = 1 + 2**-9 + 2**-20 is not an fp16 value: the graph output y, written by the
    # fp16 Mul, is rounded to 1 + 2**-9; its other reader (Add) reads the rounded value too
    nodes = [helper.make_node("Mul", ["x", "x"], ["y"], name="sq"), helper.make_node("Add", ["y", "x"], ["z"], name="add")]
    model = make_model(nodes, {"x": [2]}, {"y": [2], "z": [2]})
    graph = gp.load(model).graph
    mixed_precision(graph, mode="force_fp16", emulate=True)
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["y", "z"]
    x = np.array([1 + 2 ** -10, 3.0], np.float32)
    got = V.run(V.session(out), {"x": x})
    h = (x.astype(np.float16) * x.astype(np.float16)).astype(np.float16)
    np.testing.assert_array_equal(got["y"], h.astype(np.float32))
    assert got["y"][0] == np.float32(1 + 2 ** -9)
    np.testing.assert_array_equal(got["z"], (h + x.astype(np.float16)).astype(np.float16).astype(np.float32))


def test_convert_model_emulates_fp16_in_a_float32_model():
    # the precision analysis checks its findings on an emulated conversion: float32 dtypes throughout
    out = mixed_precision_convert(_net(), "force_fp16", [])
    assert {i.data_type for i in out.graph.initializer} == {TensorProto.FLOAT}
    conv = next(n for n in out.graph.node if n.op_type == "Conv")
    assert _elem_types(out)[conv.output[0]] == TensorProto.FLOAT
    to16 = [n for n in out.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16]
    assert to16 and all(any(r.op_type == "Cast" and r.input[0] == n.output[0] for r in out.graph.node) for n in to16)


from graphpass.passes.precision.mixed_precision import convert_model as mixed_precision_convert  # noqa: E402


@pytest.mark.parametrize("emulate", [False, True])
def test_an_omitted_optional_data_output_is_left_alone(emulate):
    # LSTM(X, W, R) -> ("", Y_h): Y is omitted; only Y_h becomes fp16 (or is rounded)
    hidden = 2
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["", "y_h"], name="lstm", hidden_size=hidden)]
    rng = np.random.default_rng(3)
    model = make_model(nodes, {"x": [2, 1, 3]}, {"y_h": [1, 1, hidden]},
                       initializers={"w": rng.standard_normal((1, 4 * hidden, 3)).astype(np.float32) * 0.5,
                                     "r": rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.5})
    feeds = {"x": rng.standard_normal((2, 1, 3)).astype(np.float32)}
    result, out = _convert_and_run(model, feeds, emulate=emulate)
    assert result.stats["fp16_nodes"] == 1
    lstm = next(n for n in out.graph.node if n.op_type == "LSTM")
    assert lstm.output[0] == "" and all(i != "" for n in out.graph.node if n.op_type == "Cast" for i in n.input)
