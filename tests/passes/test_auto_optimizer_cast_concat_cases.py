"""The cases auto_optimizer's KnowledgeMergeCasts and KnowledgeMergeConsecutiveConcat handle
(auto_optimizer/pattern/knowledges/, issue 25), held against graphpass's cleanup (the default
pipeline under --target none): each fires where it is exact and leaves alone what would change a
value (auto_optimizer merges a Cast chain whatever the types in between)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.testing import make_model, ops

F, I32, I64, F16, D = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.DOUBLE

SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 0.5, -0.5, 1.5, 2.5,
                    65504.0, 65520.0, 1.0000001, -7.99], np.float32)


def _run(model, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _cleanup(model):
    out = gp.to_proto(gp.optimize(model, target="none").model)
    onnx.checker.check_model(out, full_check=True)
    return out


def _same(a, b, x):
    for u, v in zip(_run(a, x), _run(b, x)):
        assert u.dtype == v.dtype and u.shape == v.shape and u.tobytes() == v.tobytes()


def test_sibling_casts_to_one_type_become_one():
    """auto_optimizer's case 1: Add -> Cast(to=fp16) twice -> two readers: one Cast."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Cast", ["a"], ["c1"], to=F16),
             helper.make_node("Cast", ["a"], ["c2"], to=F16), helper.make_node("Neg", ["c1"], ["y1"]),
             helper.make_node("Abs", ["c2"], ["y2"])]
    model = make_model(nodes, {"x": [len(SPECIAL)]}, {"y1": (F16, [len(SPECIAL)]), "y2": (F16, [len(SPECIAL)])})
    out = _cleanup(model)
    assert ops(out).count("Cast") == 1
    _same(model, out, SPECIAL)


@pytest.mark.parametrize("mid, last, merges", [
    (D, F, True),     # float -> double -> float: the round trip is exact
    (F, F16, True),   # float -> float -> float16: the first Cast is the identity
    (I32, F, False),  # float -> int32 -> float truncates: merging would keep 1.5
    (F16, F, False),  # float -> float16 -> float rounds (and overflows 65520): not the identity
    (I64, I32, False),  # float -> int64 -> int32: not one Cast to int32 (out-of-range values differ)
])
def test_a_cast_chain_merges_only_where_the_middle_type_loses_nothing(mid, last, merges):
    """auto_optimizer's case 2 merges Cast1 -> Cast2 into Cast2 always; graphpass only where exact."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["c1"], to=mid),
             helper.make_node("Cast", ["c1"], ["y"], to=last)]
    model = make_model(nodes, {"x": [len(SPECIAL)]}, {"y": (last, [len(SPECIAL)])})
    out = _cleanup(model)
    assert (ops(out).count("Cast") == 1) == merges, ops(out)
    x = SPECIAL if last != I32 else np.clip(SPECIAL, -100, 100).astype(np.float32)
    _same(model, out, np.nan_to_num(x, nan=0.0, posinf=1e9, neginf=-1e9).astype(np.float32) if mid in (I32, I64) else x)


def test_a_cast_to_the_type_it_already_has_is_removed():
    """auto_optimizer's case 3: Cast(to=int32) of an int32 tensor."""
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=I32), helper.make_node("Cast", ["i"], ["j"], to=I32),
             helper.make_node("Neg", ["j"], ["y"])]
    model = make_model(nodes, {"x": [4]}, {"y": (I32, [4])})
    out = _cleanup(model)
    assert ops(out) == ["Cast", "Neg"]
    _same(model, out, np.array([1.5, -2.5, 7.0, -0.0], np.float32))


def test_consecutive_concats_on_one_axis_become_one():
    """KnowledgeMergeConsecutiveConcat: Concat(Concat(a, b), c) on one axis -> Concat(a, b, c); not
    across axes, and not when the inner Concat is read elsewhere."""
    def model(axis2, shared):
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
                 helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
                 helper.make_node("Concat", ["ab", "ab2" if axis2 == 0 else "x"], ["y"], axis=axis2)]
        outs = {"y": [2, 9] if axis2 == 1 else [4, 6]}
        if axis2 == 0:
            nodes.append(helper.make_node("Concat", ["b", "a"], ["ab2"], axis=1))
        if shared:
            nodes.append(helper.make_node("Abs", ["ab"], ["z"]))
            outs["z"] = [2, 6]
        return make_model(nodes, {"x": [2, 3]}, outs)

    x = SPECIAL[:6].reshape(2, 3)
    for axis2, shared, concats in ((1, False, 1), (1, True, 2), (0, False, 3)):
        m = model(axis2, shared)
        out = _cleanup(m)
        assert ops(out).count("Concat") == concats, (axis2, shared, ops(out))
        _same(m, out, x)
