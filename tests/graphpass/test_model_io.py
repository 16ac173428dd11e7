import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import BadModelError
from graphpass.ir import annotations as A
from graphpass.ir import external, model_io
from graphpass.testing import assert_equivalent, make_model


def _small_model():
    return make_model([helper.make_node("Add", ["x", "w"], ["a"], name="add"),
                       helper.make_node("Relu", ["a"], ["y"], name="relu")],
                      {"x": [4, 8]}, {"y": [4, 8]},
                      initializers={"w": np.arange(32, dtype=np.float32).reshape(4, 8)})


def test_round_trip_keeps_model_data_and_annotations(tmp_path):
    model = _small_model()
    model.metadata_props.add(key="author", value="me")
    model.doc_string = "doc"
    model.model_version = 7
    model.graph.node[0].metadata_props.add(key="user.key", value="kept")
    graph = gp.load(model).graph
    A.set_engine(graph.nodes[0], "AICORE")
    A.set_format(graph.nodes[0].outputs[0], "NC1HWC0")
    A.set_format(graph.nodes[0].inputs[1], "ND")  # an initializer
    A.set_format(graph.inputs[0], "NCHW")
    A.mark_created(graph.nodes[1], "some_pass", replaced=[graph.nodes[0]])
    gp.save(graph, tmp_path / "m.onnx")
    back = onnx.load(tmp_path / "m.onnx")
    onnx.checker.check_model(back, full_check=True)
    assert {p.key: p.value for p in back.metadata_props} == {"author": "me"}
    assert back.doc_string == "doc" and back.model_version == 7
    g2 = gp.load(tmp_path / "m.onnx").graph
    add, relu = g2.nodes
    assert A.get_engine(add) == "AICORE" and A.get(add, "user.key") == "kept"
    assert A.get_format(add.outputs[0]) == "NC1HWC0"
    assert A.get_format(add.inputs[1]) == "ND"
    assert A.get_format(g2.inputs[0]) == "NCHW"
    assert A.get(relu, A.PASS) == "some_pass" and A.fused_from(relu) == ["add"]
    assert_equivalent(model, back, exact=True)


def test_local_functions_and_custom_opsets_survive(tmp_path):
    body = helper.make_function("graphpass.ascend", "TransData", ["x"], ["y"],
                                [helper.make_node("Identity", ["x"], ["y"])], [helper.make_opsetid("", 17)],
                                attributes=["src_format", "dst_format"])
    model = make_model([helper.make_node("TransData", ["x"], ["t"], domain="graphpass.ascend",
                                         src_format="NCHW", dst_format="NC1HWC0"),
                        helper.make_node("Relu", ["t"], ["r"]),
                        helper.make_node("TransData", ["r"], ["y"], domain="graphpass.ascend",
                                         src_format="NC1HWC0", dst_format="NCHW")],
                       {"x": [1, 2]}, {"y": [1, 2]}, functions=[body], extra_opsets={"graphpass.ascend": 1})
    graph = gp.load(model).graph
    A.set_engine(graph.nodes[2], "AICORE")
    gp.save(graph, tmp_path / "f.onnx", emit="device")
    back = onnx.load(tmp_path / "f.onnx")
    assert [f.name for f in back.functions] == ["TransData"]
    assert {o.domain for o in back.opset_import} >= {"", "graphpass.ascend"}
    assert back.ir_version >= 8
    assert_equivalent(model, back, exact=True)
    # portable: TransData is Identity on the value, so it is dropped, except where it writes a
    # graph output (the output keeps its name): there it is inlined and keeps its annotations
    gp.save(graph, tmp_path / "p.onnx")
    portable = onnx.load(tmp_path / "p.onnx")
    assert not portable.functions and "graphpass.ascend" not in {o.domain for o in portable.opset_import}
    assert [n.op_type for n in portable.graph.node] == ["Relu", "Identity"]
    assert list(portable.graph.node[0].input) == ["x"]
    assert {p.key: p.value for p in portable.graph.node[1].metadata_props} == {A.ENGINE: "AICORE"}
    assert_equivalent(model, portable, exact=True)


def test_ir3_model_saved_as_valid_ir4(light_path, tmp_path):
    graph = gp.load(light_path("light_squeezenet.onnx")).graph
    gp.save(graph, tmp_path / "s.onnx")
    back = onnx.load(tmp_path / "s.onnx")
    assert back.ir_version == 4
    onnx.checker.check_model(back, full_check=True)


def test_external_data_loads_and_saves(tmp_path):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 256]}, {"y": [2, 256]},
                       initializers={"w": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)})
    onnx.save_model(model, tmp_path / "ext.onnx", save_as_external_data=True, location="ext.weights", size_threshold=0)
    graph = gp.load(tmp_path / "ext.onnx").graph
    out = tmp_path / "out"
    out.mkdir()
    gp.save(graph, out / "m.onnx", external_data=True)
    assert (out / "m.onnx.data").stat().st_size >= 256 * 256 * 4
    assert sorted(os.listdir(out)) == ["m.onnx", "m.onnx.data"]  # no temp files left behind
    gp.save(graph, out / "m.onnx", external_data=True)  # saving twice does not append to the data
    assert (out / "m.onnx.data").stat().st_size < 2 * 256 * 256 * 4
    back = gp.load(out / "m.onnx").graph
    np.testing.assert_array_equal(back.nodes[0].inputs[1].values, graph.nodes[0].inputs[1].values)


def test_models_past_the_threshold_are_saved_with_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(external, "EXTERNAL_DATA_THRESHOLD", 1000)
    graph = gp.load(_small_model().SerializeToString()).graph
    big = np.ones((64, 64), np.float32)
    graph.nodes[0].inputs[1].values = big[:4, :8].copy()
    model = gp.to_proto(graph)
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.ones((4, 8), np.float32) * 2, "w"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(big, "unused_big"))
    model_io.save_proto(model, tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").exists()
    onnx.checker.check_model(str(tmp_path / "big.onnx"), full_check=True)


@pytest.mark.parametrize("location, message", [
    ("/etc/passwd", "absolute path"),
    ("../outside.bin", "outside the model's folder"),
    ("sub/../../outside.bin", "outside the model's folder"),
    ("missing.bin", "missing"),
])
def test_external_data_locations_are_confined(tmp_path, location, message):
    model = _small_model()
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    (tmp_path.parent / "outside.bin").write_bytes(b"\0" * 128)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(BadModelError, match=message):
        gp.load(path).graph


def test_caller_proto_is_not_mutated():
    model = _small_model()
    before = model.SerializeToString()
    gp.optimize(model, input_shapes=None)
    assert model.SerializeToString() == before


def test_streamed_save_writes_one_valid_model_with_every_weight(tmp_path):
    """gp.save appends big weights as separate graph.initializer records: the file must parse
    as the same model, main-graph and Loop-body weights included."""
    rng = np.random.default_rng(0)
    w_body = rng.standard_normal((64, 64)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["acc_in", "wb"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 64])],
        initializer=[onnx.numpy_helper.from_array(w_body, "wb")],
    )
    weights = {f"w{k}": (rng.standard_normal((64, 64)) / 8).astype(np.float32) for k in range(3)}
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a0"]), helper.make_node("MatMul", ["a0", "w1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["a2"]),
             helper.make_node("Loop", ["n", "", "a2"], ["y"], body=body)]
    model = make_model(nodes, {"x": [1, 64]}, {"y": [1, 64]}, initializers={**weights, "n": np.array(2, np.int64)})
    gp.save(gp.load(model).graph, tmp_path / "s.onnx")
    back = onnx.load(tmp_path / "s.onnx")
    onnx.checker.check_model(back, full_check=True)
    got = {t.name: onnx.numpy_helper.to_array(t) for t in back.graph.initializer}
    for k, v in weights.items():
        np.testing.assert_array_equal(got[k], v)
    body_back = back.graph.node[-1].attribute[0].g
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(body_back.initializer[0]), w_body)
    assert_equivalent(model, back, exact=True)


@pytest.mark.parametrize("dtype", ["INT4", "UINT4", "FLOAT4E2M1", "FLOAT8E4M3FNUZ", "FLOAT8E5M2FNUZ", "BFLOAT16"])
def test_a_constant_nodes_exotic_value_survives_being_read(dtype):
    """A pass reading a Constant node's INT4 value (CSE keys it) made the export fail ('Raw data
    size does not match tensor's size', exit 2 blaming the input); a FLOAT8E4M3FNUZ value read
    was written back as FLOAT8E4M3FN (the numpy dtype's ONNX type), an invalid model."""
    _onnx, _T, _h = onnx, TensorProto, helper
    dt = getattr(_T, dtype)
    nbytes = {"INT4": 2, "UINT4": 2, "FLOAT4E2M1": 2, "BFLOAT16": 8}.get(dtype, 4)
    value = _h.make_tensor("v", dt, [4], vals=bytes([0x3C, 0x40, 0x01, 0x82, 5, 6, 7, 8][:nbytes]), raw=True)
    g = _h.make_graph([_h.make_node("Constant", [], ["c"], value=value), _h.make_node("Cast", ["c"], ["y"], to=_T.FLOAT)],
                      "g", [], [_h.make_tensor_value_info("y", _T.FLOAT, [4])])
    m = _h.make_model(g, opset_imports=[_h.make_opsetid("", 23)])
    m.ir_version = 11
    graph = gp.load(m).graph
    const = graph.nodes[0].attrs["value"]
    before = np.asarray(const.values).copy()  # what any pass keying or folding it does
    out = gp.to_proto(graph)
    _onnx.checker.check_model(out, full_check=True)
    t = out.graph.node[0].attribute[0].t
    assert t.data_type == dt and t.raw_data == value.raw_data
    assert np.array_equal(_onnx.numpy_helper.to_array(t).view(np.uint8), before.view(np.uint8))
