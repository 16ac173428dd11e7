"""Review corpus for ``graphpass verify`` (issue 17): pairs of models whose outputs differ in one
known way must fail (exit 1); pairs that compute the same values must pass (exit 0)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graphpass as gp
from graphpass.cli import main
from graphpass.testing import make_model

F32 = np.float32


def _add_const(c, in_type=T.FLOAT, shape=None):
    """y = x + c, with x of c's shape (a tiny model whose output carries c's values)."""
    c = np.asarray(c)
    shape = list(c.shape) if shape is None else shape
    return make_model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": (in_type, shape)}, {"y": (in_type, shape)},
                      initializers={"c": c})


def _unary(op, in_type=T.FLOAT, out_type=T.FLOAT, shape=(2, 3), **attrs):
    return make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (in_type, list(shape))},
                      {"y": (out_type, None)})


def _ids(values):
    return _add_const(np.array(values, np.int64), T.INT64)


def _detector(prob_delta=0.0):
    """det[k] = (x1, y1, x2, y2, prob) + 1e-3 * x: boxes up to 640, probabilities below 1."""
    c = np.array([[12.0, 40.0, 320.0, 640.0, 0.91], [100.0, 7.0, 600.0, 480.0, 0.45]], F32)
    c[1, 4] += prob_delta
    nodes = [helper.make_node("Mul", ["x", "k"], ["s"]), helper.make_node("Add", ["s", "c"], ["y"])]
    return make_model(nodes, {"x": [2, 5]}, {"y": [2, 5]}, initializers={"c": c, "k": np.array(1e-3, F32)})


def _special(value):
    c = np.zeros((2, 3), F32)
    c[1, 2] = value
    return _add_const(c)


def _signed_zero(negative):
    """y = |x * 0| (+0.0 everywhere) or its negation (-0.0 everywhere)."""
    nodes = [helper.make_node("Mul", ["x", "z"], ["m"]), helper.make_node("Abs", ["m"], ["a" if negative else "y"])]
    if negative:
        nodes.append(helper.make_node("Neg", ["a"], ["y"]))
    return make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, initializers={"z": np.array(0.0, F32)})


def _two_heads(swap):
    a, b = ("Neg", "Relu") if swap else ("Relu", "Neg")
    nodes = [helper.make_node(a, ["x"], ["y1"]), helper.make_node(b, ["x"], ["y2"])]
    return make_model(nodes, {"x": [2, 3]}, {"y1": [2, 3], "y2": [2, 3]})


def _batch_mean(buggy):
    """Per-sample identity, or (the bug) every sample replaced by the batch mean: equal when N = 1."""
    if not buggy:
        return make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [None, 4]}, {"y": [None, 4]})
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Expand", ["m", "s"], ["y"])]
    m = make_model(nodes, {"x": [None, 4]}, {"y": [None, 4]})
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return m


def _named_batch(model):
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return model


def _stack():
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
             helper.make_node("Transpose", ["b"], ["c"], perm=[1, 0]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Identity", ["d"], ["y"])]
    return make_model(nodes, {"x": [3, 4]}, {"y": [3, 4]})


def _exact_passes(model):
    return gp.to_proto(gp.optimize(model, passes=["eliminate_identity", "merge_transposes", "eliminate_dead_nodes"],
                                   target="none").graph)


def _reserialized(model):
    """The same model stored another way: weights as float_data instead of raw_data."""
    m = onnx.ModelProto()
    m.ParseFromString(model.SerializeToString())
    for t in m.graph.initializer:
        if t.data_type == T.FLOAT:
            vals = onnx.numpy_helper.to_array(t).ravel().tolist()
            t.ClearField("raw_data")
            t.float_data.extend(vals)
    return m


# (name, A, B, extra CLI args)
DIFFERENT = [
    ("int ids changed", _ids([0, 5, 100000]), _ids([3, 12, 99991]), []),
    ("int64 2^60 vs 2^60+100, exact", _ids([2**60, 1, 2]), _ids([2**60 + 100, 1, 2]), ["--rtol", "0", "--atol", "0"]),
    ("int64 2^60 vs 2^60+100, default", _ids([2**60, 1, 2]), _ids([2**60 + 100, 1, 2]), []),
    ("bool mask flipped under --atol 1", _unary("Greater", out_type=T.BOOL, shape=(2, 3)).__class__(), None, None),
    ("probability +0.03 beside boxes of 640", _detector(), _detector(0.03), []),
    ("NaN where the original has a number", _special(1.0), _special(np.nan), []),
    ("a number where the original has NaN", _special(np.nan), _special(1.0), []),
    ("+inf vs -inf", _special(np.inf), _special(-np.inf), []),
    ("inf where the original has a number", _special(3.0e38), _special(np.inf), ["--rtol", "1"]),
    ("-0.0 vs +0.0, exact", _signed_zero(False), _signed_zero(True), ["--rtol", "0", "--atol", "0"]),
    ("shape changed", _unary("Identity"), make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": [2, 3]}, {"y": [3, 2]},
        initializers={"s": np.array([3, 2], np.int64)}), []),
    ("dtype changed", _unary("Identity"), _unary("Cast", out_type=T.DOUBLE, to=T.DOUBLE), ["--rtol", "1", "--atol", "1"]),
    ("outputs swapped", _two_heads(False), _two_heads(True), []),
    ("mean over the batch axis", _batch_mean(False), _batch_mean(True), []),
]


def _bool_pair():
    greater = make_model([helper.make_node("Greater", ["x", "z"], ["y"])], {"x": [2, 3]}, {"y": (T.BOOL, [2, 3])},
                         initializers={"z": np.array(0.0, F32)})
    less_eq = make_model([helper.make_node("LessOrEqual", ["x", "z"], ["y"])], {"x": [2, 3]}, {"y": (T.BOOL, [2, 3])},
                         initializers={"z": np.array(0.0, F32)})
    return greater, less_eq


DIFFERENT[3] = ("bool mask flipped under --atol 1", *_bool_pair(), ["--atol", "1"])

SAME = [
    ("the same model", _detector(), _detector(), []),
    ("re-serialized (float_data instead of raw_data)", _detector(), _reserialized(_detector()), ["--rtol", "0", "--atol", "0"]),
    ("optimized by exact passes, bitwise", _stack(), _exact_passes(_stack()), ["--rtol", "0", "--atol", "0"]),
    ("int ids", _ids([0, 5, 100000]), _ids([0, 5, 100000]), ["--rtol", "0", "--atol", "0"]),
    ("bool mask", *_bool_pair()[:1] * 2, ["--rtol", "0", "--atol", "0"]),
    ("NaN at the same place", _special(np.nan), _special(np.nan), ["--rtol", "0", "--atol", "0"]),
    ("-inf at the same place", _special(-np.inf), _special(-np.inf), []),
    ("+0.0 vs -0.0 under a tolerance", _signed_zero(False), _signed_zero(True), []),
    ("symbolic batch, per-sample", _named_batch(_batch_mean(False)), _named_batch(_batch_mean(False)), []),
]


def _save(tmp_path, name, model):
    p = tmp_path / name
    onnx.save(model, str(p))
    return str(p)


@pytest.mark.parametrize("name,a,b,args", DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_verify_fails_every_pair_whose_outputs_differ(tmp_path, capsys, name, a, b, args):
    pa, pb = _save(tmp_path, "a.onnx", a), _save(tmp_path, "b.onnx", b)
    assert main(["verify", pa, pb, *args]) == 1, name
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "outputs differ" in captured.err


@pytest.mark.parametrize("name,a,b,args", SAME, ids=[s[0] for s in SAME])
def test_verify_passes_every_pair_that_computes_the_same_values(tmp_path, capsys, name, a, b, args):
    pa, pb = _save(tmp_path, "a.onnx", a), _save(tmp_path, "b.onnx", b)
    assert main(["verify", pa, pb, *args]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "FAIL" not in out and "ok" in out


def test_the_reserialized_pair_really_is_stored_differently():
    a, b = _detector(), _reserialized(_detector())
    assert a.SerializeToString() != b.SerializeToString()
    assert b.graph.initializer[0].float_data and not b.graph.initializer[0].raw_data


def test_the_batch_mean_bug_hides_at_batch_1(tmp_path, capsys):
    """Why symbolic dims are fed as 2: at 1 the buggy model computes the same values."""
    pa, pb = _save(tmp_path, "a.onnx", _named_batch(_batch_mean(False))), _save(tmp_path, "b.onnx", _batch_mean(True))
    assert main(["verify", pa, pb, "--symbolic-dim", "1"]) == 0
    assert main(["verify", pa, pb, "--input-shape", "x:1,4"]) == 0
    capsys.readouterr()
    assert main(["verify", pa, pb]) == 1
    out = capsys.readouterr().out
    assert "x float32[2(N), 4]" in out and "symbolic dims (N) fed as 2" in out
