"""fold_constants sizes every tensor from its inputs before onnxruntime computes it.

Before: ConstantOfShape/Expand/Tile whose shape operand onnx's inference could not see were
evaluated first and measured after (a 50,000 x 50,000 Expand used 10 GB); a Cast of NaN was
folded into a Reshape's shape operand.
"""

import resource

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.ir import model_io
from graphpass.passes.cleanup import fold_constants as fc
from graphpass.testing import check_full, make_model, ort_run


@pytest.fixture(autouse=True)
def bounded_memory():
    """A regression here must fail with MemoryError, not take the machine down."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    cap = vm + (3 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def evaluated(monkeypatch):
    """The ops of every node fold_constants hands to onnxruntime."""
    seen = []
    real = fc._evaluate

    def spy(nodes, wanted, opsets, ir_version):
        seen.extend(n.op for n in nodes)
        return real(nodes, wanted, opsets, ir_version)

    monkeypatch.setattr(fc, "_evaluate", spy)
    return seen


def _abs_shape(values):
    """A shape operand onnx's inference cannot see through (Abs is not data-propagated)."""
    return [helper.make_node("Constant", [], ["s0"], value=helper.make_tensor("v", TensorProto.INT64, [len(values)], values)),
            helper.make_node("Abs", ["s0"], ["s"])]


BOMBS = {
    "ConstantOfShape": lambda: make_model(_abs_shape([50000, 50000]) + [helper.make_node("ConstantOfShape", ["s"], ["z"]),
                                                                        helper.make_node("Add", ["x", "z"], ["y"])],
                                          {"x": [1]}, {"y": None}),
    "Expand": lambda: make_model(_abs_shape([50000, 50000]) + [helper.make_node("Expand", ["w", "s"], ["z"]),
                                                               helper.make_node("Add", ["x", "z"], ["y"])],
                                 {"x": [1]}, {"y": None}, initializers={"w": np.ones(1, np.float32)}),
    "Tile": lambda: make_model(_abs_shape([50000, 50000]) + [helper.make_node("Tile", ["w", "s"], ["z"]),
                                                             helper.make_node("Add", ["x", "z"], ["y"])],
                               {"x": [1]}, {"y": None}, initializers={"w": np.ones((1, 1), np.float32)}),
    "Range": lambda: make_model([helper.make_node("Abs", ["l0"], ["l"]), helper.make_node("Range", ["a", "l", "d"], ["z"]),
                                 helper.make_node("Add", ["x", "z"], ["y"])], {"x": [1]}, {"y": None},
                                initializers={"a": np.array(0, np.float32), "l0": np.array(2.5e9, np.float32),
                                              "d": np.array(1, np.float32)}),
    "Pad": lambda: make_model(_abs_shape([50000, 50000, 0, 0]) + [helper.make_node("Pad", ["w", "s"], ["z"]),
                                                                  helper.make_node("Add", ["x", "z"], ["y"])],
                              {"x": [1]}, {"y": None}, initializers={"w": np.ones((1, 1), np.float32)}),
    "Resize": lambda: make_model([helper.make_node("Abs", ["sc0"], ["sc"]),
                                  helper.make_node("Resize", ["w", "", "sc"], ["z"]),
                                  helper.make_node("Add", ["x", "z"], ["y"])], {"x": [1]}, {"y": None},
                                 initializers={"w": np.ones((1, 1), np.float32), "sc0": np.array([50000, 50000], np.float32)}),
    "Reshape of a broadcast": lambda: make_model(
        [helper.make_node("Add", ["a", "b"], ["z0"]), helper.make_node("Reshape", ["z0", "s"], ["z"]),
         helper.make_node("Add", ["x", "z"], ["y"])], {"x": [1]}, {"y": None},
        initializers={"a": np.ones((50000, 1), np.float32), "b": np.ones((1, 50000), np.float32),
                      "s": np.array([-1], np.int64)}),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_bomb_is_never_evaluated(case, evaluated):
    model = BOMBS[case]()
    out = model_io.to_proto(gp.optimize(model, passes=["fold_constants"]).graph)
    big = case.split()[0] if case != "Reshape of a broadcast" else "Add"
    assert big not in evaluated or case == "Reshape of a broadcast" and evaluated.count("Add") == 0, evaluated
    assert all(t.ByteSize() < 1 << 20 for t in out.graph.initializer)


def test_small_expand_behind_an_abs_is_still_folded(evaluated):
    model = make_model(_abs_shape([2, 3]) + [helper.make_node("Expand", ["w", "s"], ["z"]),
                                            helper.make_node("Add", ["x", "z"], ["y"])],
                       {"x": [2, 3]}, {"y": [2, 3]}, initializers={"w": np.ones(1, np.float32)})
    out = model_io.to_proto(gp.optimize(model, passes=["fold_constants"]).graph)
    assert [n.op_type for n in out.graph.node] == ["Add"]
    check_full(out)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ort_run(out, {"x": x})["y"], ort_run(model, {"x": x})["y"])


def test_cast_of_nan_is_not_folded_into_a_reshape_shape():
    model = make_model([helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64),
                        helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": [4]}, {"y": None},
                       initializers={"f": np.array([np.nan, 2], np.float32)})
    result = gp.optimize(model, passes=["fold_constants"])
    out = model_io.to_proto(result.graph)
    assert [n.op_type for n in out.graph.node] == ["Cast", "Reshape"]
    assert result.report.passes[0].stats["invalid_shape"] == 1


def test_valid_cast_into_a_reshape_is_folded():
    model = make_model([helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64),
                        helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": [4]}, {"y": None},
                       initializers={"f": np.array([-1, 2], np.float32)})
    out = model_io.to_proto(gp.optimize(model, passes=["fold_constants"]).graph)
    assert [n.op_type for n in out.graph.node] == ["Reshape"]
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(ort_run(out, {"x": x})["y"], ort_run(model, {"x": x})["y"])


def test_folds_stop_at_the_memory_budget(tmp_path):
    model = make_model([helper.make_node("Tile", ["w", "r"], ["z"]), helper.make_node("Add", ["x", "z"], ["y"])],
                       {"x": [256, 256]}, {"y": [256, 256]},
                       initializers={"w": np.ones((1, 1), np.float32), "r": np.array([256, 256], np.int64)})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    size = src.stat().st_size
    g = model_io.load(str(src), max_memory=size + 64 * 1024)  # the 256 KiB fold does not fit
    grow = {"fold_constants": {"fold_growing": True}}  # the Tile grows the file: folded only when asked
    stats = gp.optimize(g, passes=["fold_constants"], options=grow).report.passes[0].stats
    assert stats["folded"] == 0 and stats["too_large"] + stats["over_memory"] >= 1
    g = model_io.load(str(src), max_memory=size + 4 * 1024 * 1024)
    assert gp.optimize(g, passes=["fold_constants"], options=grow).report.passes[0].stats["folded"] == 1


def test_loop_with_a_huge_trip_count_is_never_evaluated(evaluated):
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        initializer=[onnx.numpy_helper.from_array(np.ones(1, np.float32), "one")])
    model = make_model([helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=body), helper.make_node("Add", ["x", "v"], ["y"])],
                       {"x": [1]}, {"y": [1]},
                       initializers={"M": np.array(10 ** 12, np.int64), "c": np.array(True), "v0": np.zeros(1, np.float32)})
    out = model_io.to_proto(gp.optimize(model, passes=["fold_constants"]).graph)
    assert "Loop" not in evaluated
    assert [n.op_type for n in out.graph.node] == ["Loop", "Add"]


def test_bfloat16_constant_chain_does_not_crash():
    """Before: fold_constants raised TypeError on the ONNX-only dtype (exit 3)."""
    w = helper.make_tensor("w", TensorProto.BFLOAT16, [4], [1.0, -2.5, 3.0, 0.0])
    model = make_model([helper.make_node("Identity", ["w"], ["w1"]), helper.make_node("Add", ["x", "w1"], ["y"])],
                       {"x": (TensorProto.BFLOAT16, [4])}, {"y": (TensorProto.BFLOAT16, [4])})
    model.graph.initializer.append(w)
    out = model_io.to_proto(gp.optimize(model, passes=["fold_constants"]).graph)
    check_full(out)
    bf = [t for t in out.graph.initializer if t.data_type == TensorProto.BFLOAT16]
    assert len(bf) == 1 and list(onnx.numpy_helper.to_array(bf[0]).astype(np.float32)) == [1.0, -2.5, 3.0, 0.0]
