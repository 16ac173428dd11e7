"""Storage forms survive optimize (issue 16 item 10): tiny external tensors, sparse, string and
int4/uint4 initializers. Before, each came out corrupt (exit 0), wrong (dense float64) or was
refused (exit 2)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphpass.cli import main
from graphpass.testing import check_full, make_model, ort_run


def _optimize(tmp_path, save):
    src = tmp_path / "m.onnx"
    save(src)
    out = tmp_path / "o.onnx"
    code = main(["optimize", str(src), "-o", str(out), "-q", "--target", "none"])
    assert code == 0
    back = onnx.load(str(out))
    check_full(back)
    return onnx.load(str(src)), back


def test_tiny_external_tensors_stay_valid(tmp_path):
    # Identity and a duplicate constant: eliminate_identity and CSE touch the tiny external weights
    m = make_model([helper.make_node("Identity", ["w"], ["w1"]), helper.make_node("Add", ["x", "w1"], ["a"]),
                    helper.make_node("Add", ["a", "w2"], ["b"]), helper.make_node("Mul", ["b", "v"], ["y"])],
                   {"x": [4]}, {"y": [4]},
                   initializers={"w": np.arange(4, dtype=np.float32), "w2": np.arange(4, dtype=np.float32),
                                 "v": np.array([-0.0, np.inf, np.nan, 3.5], np.float32)})
    before, after = _optimize(tmp_path, lambda p: onnx.save_model(m, str(p), save_as_external_data=True,
                                                                   location="m.data", size_threshold=0))
    for t in after.graph.initializer:
        assert t.data_location != TensorProto.EXTERNAL or any(e.key == "location" and e.value for e in t.external_data)
    x = np.array([1, -2, 0.5, np.nan], np.float32)
    np.testing.assert_array_equal(ort_run(after, {"x": x})["y"], ort_run(before, {"x": x})["y"])


def test_sparse_initializer_keeps_dtype_and_values(tmp_path):
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})
    vals = onnx.numpy_helper.from_array(np.array([5.0, -2.0], np.float32), "w")
    idx = onnx.numpy_helper.from_array(np.array([1, 4], np.int64), "w_idx")
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(vals, idx, [2, 3]))
    before, after = _optimize(tmp_path, lambda p: onnx.save(m, str(p)))
    w = {t.name: t for t in after.graph.initializer}.get("w")
    if w is not None:
        assert w.data_type == TensorProto.FLOAT
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ort_run(after, {"x": x})["y"]
    np.testing.assert_array_equal(got, ort_run(before, {"x": x})["y"])
    np.testing.assert_array_equal(got, x + np.array([[0, 5, 0], [0, -2, 0]], np.float32))


def test_sparse_initializer_with_coordinate_indices(tmp_path):
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})
    vals = onnx.numpy_helper.from_array(np.array([7, 9], np.int32), "w")
    idx = onnx.numpy_helper.from_array(np.array([[0, 2], [1, 0]], np.int64), "w_idx")
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(vals, idx, [2, 3]))
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    before, after = _optimize(tmp_path, lambda p: onnx.save(m, str(p)))
    x = np.zeros((2, 3), np.int32)
    np.testing.assert_array_equal(ort_run(after, {"x": x})["y"], [[0, 0, 7], [9, 0, 0]])


def test_sparse_index_out_of_range_exits_2(tmp_path, capsys):
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})
    vals = onnx.numpy_helper.from_array(np.array([5.0], np.float32), "w")
    idx = onnx.numpy_helper.from_array(np.array([6], np.int64), "w_idx")
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(vals, idx, [2, 3]))
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    assert main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "-q"]) == 2
    assert "sparse initializer 'w'" in capsys.readouterr().err


def test_string_initializer_round_trips(tmp_path):
    m = make_model([helper.make_node("Identity", ["w"], ["w1"]), helper.make_node("Concat", ["x", "w1"], ["y"], axis=0)],
                   {"x": (TensorProto.STRING, [1])}, {"y": (TensorProto.STRING, [3])},
                   initializers={"w": np.array(["a", "b\u00e9\0c"], dtype=object)})
    before, after = _optimize(tmp_path, lambda p: onnx.save(m, str(p)))
    x = np.array(["z"], dtype=object)
    assert list(ort_run(after, {"x": x})["y"]) == list(ort_run(before, {"x": x})["y"])


@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4])
def test_int4_initializer_round_trips_exactly(tmp_path, elem):
    vals = [1, -2, 3, -8, 7] if elem == TensorProto.INT4 else [1, 2, 15, 0, 9]
    w = helper.make_tensor("w", elem, [5], vals)
    m = make_model([helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
                    helper.make_node("Add", ["x", "wf"], ["y"])], {"x": [5], "s": []}, {"y": [5]}, opset=21)
    m.graph.initializer.append(w)
    before, after = _optimize(tmp_path, lambda p: onnx.save(m, str(p)))
    out_w = next(t for t in after.graph.initializer if t.data_type == elem)
    assert list(onnx.numpy_helper.to_array(out_w).astype(np.int64)) == vals
    feeds = {"x": np.zeros(5, np.float32), "s": np.array(0.5, np.float32)}
    np.testing.assert_array_equal(ort_run(after, feeds)["y"], ort_run(before, feeds)["y"])
