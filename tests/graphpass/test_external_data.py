"""External data kept external, in the layout the input chose (issue 20): one file or one per
tensor, the input's size threshold, written beside the output, never over the input's data."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh
from onnx.external_data_helper import _get_all_tensors

import graphpass as gp
from graphpass.cli import main
from graphpass.testing import assert_equivalent


def _model(opset=18):
    """x @ W1 + b (864 bytes, as the dynamo exporter's smallest external tensor) -> @ W2; a
    Transpose of W2 folds (same size: the folded weight is a new array to write)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((64, 216)).astype(np.float32), "W1"),
             nh.from_array(rng.standard_normal(216).astype(np.float32), "b"),
             nh.from_array(rng.standard_normal((16, 216)).astype(np.float32), "W2"),
             nh.from_array(np.arange(16, dtype=np.float32), "tiny")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Transpose", ["W2"], ["W2t"], perm=[1, 0]),
             helper.make_node("MatMul", ["hb", "W2t"], ["y0"]),
             helper.make_node("Mul", ["y0", "tiny"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 16])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _external(path):
    m = onnx.load(path, load_external_data=False)
    return {t.name: {e.key: e.value for e in t.external_data} for t in _get_all_tensors(m)
            if t.data_location == onnx.TensorProto.EXTERNAL}


def test_a_dynamo_style_model_keeps_its_one_data_file_and_small_external_tensors(tmp_path):
    """opset 18, every tensor but a tiny one in one .data file, the smallest 864 bytes (< 1 KiB)."""
    src = tmp_path / "model.onnx"
    onnx.save(_model(), src, save_as_external_data=True, location="model.onnx.data", size_threshold=100)
    assert set(_external(src)) == {"W1", "b", "W2"}
    data_before = (tmp_path / "model.onnx.data").read_bytes()
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    ext = _external(out)
    assert set(ext) == {"W1", "b", "W2t"}  # the folded transpose too; 'tiny' stays in the model
    assert {v["location"] for v in ext.values()} == {"out.onnx.data"}
    assert (tmp_path / "model.onnx.data").read_bytes() == data_before
    assert_equivalent(onnx.load(src), onnx.load(out), exact=True)
    onnx.checker.check_model(str(out), full_check=True)


def test_one_file_per_tensor_stays_one_file_per_tensor(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src, save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=1024)
    assert set(_external(src)) == {"W1", "W2"}  # b (864 bytes) under onnx.save's threshold
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    ext = _external(out)
    assert set(ext) == {"W1", "W2t"}  # the input's threshold: b stays in the model
    assert len({v["location"] for v in ext.values()}) == 2
    assert all(v["location"].startswith("o.onnx.") for v in ext.values())
    assert_equivalent(onnx.load(src), onnx.load(out), exact=True)


def test_an_output_beside_the_input_never_writes_over_the_data_the_input_reads(tmp_path):
    src = tmp_path / "a.onnx"
    onnx.save(_model(), src, save_as_external_data=True, location="b.onnx.data", size_threshold=0)
    before = (tmp_path / "b.onnx.data").read_bytes()
    out = tmp_path / "b.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    assert (tmp_path / "b.onnx.data").read_bytes() == before
    assert {v["location"] for v in _external(out).values()} == {"b.onnx.1.data"}
    assert_equivalent(onnx.load(src), onnx.load(out), exact=True)
    # in place: refused (issue 23), the new data would go beside the old one and orphan it; all stays
    model_before = src.read_bytes()
    assert main(["optimize", str(src), "-o", str(src), "--pipeline", "neutral", "-q"]) == 2
    assert (tmp_path / "b.onnx.data").read_bytes() == before and src.read_bytes() == model_before
    assert not (tmp_path / "a.onnx.data").exists()


def test_the_api_keeps_the_layout_and_external_data_false_writes_one_file(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src, save_as_external_data=True, location="w.bin", size_threshold=0)
    model = gp.load(str(src))
    model.save(tmp_path / "kept.onnx")
    assert set(_external(tmp_path / "kept.onnx")) == {"W1", "b", "W2", "tiny"}
    model.save(tmp_path / "inline.onnx", external_data=False)
    assert _external(tmp_path / "inline.onnx") == {}
    assert not os.path.exists(tmp_path / "inline.onnx.data")
    for name in ("kept.onnx", "inline.onnx"):
        assert_equivalent(onnx.load(src), onnx.load(tmp_path / name), exact=True)


def test_a_model_without_external_data_is_written_as_one_file(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    assert _external(out) == {} and not os.path.exists(str(out) + ".data")
