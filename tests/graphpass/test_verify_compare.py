"""verify's one comparison rule (graphpass.verify.compare_arrays) on the values that break rules."""

import numpy as np
import pytest

from graphpass.check import verify as V


def _ok(ref, got, rtol=V.DEFAULT_RTOL, atol=V.DEFAULT_ATOL, **kw):
    return V.compare_arrays("t", np.asarray(ref), np.asarray(got), rtol, atol, **kw).ok


def test_integers_compare_exactly_whatever_the_tolerance():
    assert not _ok(np.array([0, 5, 100000]), np.array([3, 12, 99991]), rtol=1, atol=100)
    big = np.array([2**60], np.int64)
    assert not _ok(big, big + 100, rtol=0, atol=0) and not _ok(big, big + 1, rtol=1, atol=1e9)
    u = np.array([2**64 - 1], np.uint64)
    assert not _ok(u, u - np.uint64(1), rtol=1, atol=10) and _ok(u, u.copy(), rtol=0, atol=0)
    c = V.compare_arrays("ids", np.array([0, 5, 100000]), np.array([3, 12, 99991]))
    assert c.mismatched == 3 and c.max_abs == 9 and "first at [0]: 3 vs 0" in c.note


def test_bools_and_strings_compare_exactly():
    m = np.array([True, False, True])
    assert not _ok(m, ~m, atol=1) and _ok(m, m.copy(), atol=0)
    s = np.array(["cat", "dog"], dtype=object)
    assert _ok(s, np.array(["cat", "dog"], dtype=object)) and not _ok(s, np.array(["cat", "dot"], dtype=object), rtol=1)


def test_floats_element_by_element_not_scaled_by_the_largest_value():
    ref = np.array([640.0, 480.0, 0.5], np.float32)
    got = ref + np.array([0, 0, 0.03], np.float32)
    assert not _ok(ref, got)  # the old rule allowed 1e-5 + 1e-4 * 640 = 0.064
    assert _ok(ref, ref * (1 + 5e-5))  # within rtol of each element


def test_nan_and_inf_positions_and_signs_are_exact():
    nan, inf = np.float32("nan"), np.float32("inf")
    assert not _ok([1.0, nan], [1.0, 1.0], rtol=1e9, atol=1e9)  # number where the original has NaN
    assert not _ok([1.0, 1.0], [1.0, nan], rtol=1e9, atol=1e9)  # NaN where the original has a number
    assert not _ok([inf], [-inf], rtol=1e9, atol=1e9)
    assert not _ok([3e38], [inf], rtol=1e9, atol=1e9)
    assert _ok([nan, inf, -inf], [nan, inf, -inf], rtol=0, atol=0)


def test_sign_of_zero_counts_only_in_exact_comparison():
    assert not _ok(np.array([0.0]), np.array([-0.0]), rtol=0, atol=0)
    assert _ok(np.array([0.0]), np.array([-0.0]))


def test_float16_outputs_compare_in_their_own_values():
    ref = np.array([1.0, 65504.0], np.float16)
    assert not _ok(ref, np.array([1.0, np.inf], np.float16), rtol=1, atol=1)
    assert _ok(ref, ref.copy(), rtol=0, atol=0)


@pytest.mark.parametrize("ref,got,why", [
    (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), "shape [3, 2] != [2, 3]"),
    (np.zeros(3, np.float32), np.zeros(3, np.float64), "dtype float64 != float32"),
    (np.zeros(3, np.int32), np.zeros(3, np.int64), "dtype int64 != int32"),
])
def test_shape_and_dtype_mismatches_fail(ref, got, why):
    c = V.compare_arrays("t", ref, got, rtol=1e9, atol=1e9)
    assert not c.ok and c.note == why


def test_intermediates_may_meet_another_float_dtype_but_not_another_kind():
    assert _ok(np.ones(3, np.float32), np.ones(3, np.float16), strict_dtype=False)
    assert not _ok(np.ones(3, np.float32), np.ones(3, np.int32), strict_dtype=False)


def test_empty_tensors_are_equal_when_shapes_match():
    assert _ok(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), rtol=0, atol=0)
    assert not _ok(np.zeros((0, 4), np.float32), np.zeros((0, 5), np.float32))


def test_missing_output_fails():
    [c] = V.compare({"y": np.ones(2)}, {})
    assert not c.ok and c.note == "missing output"


def test_assert_equivalent_uses_the_same_rule():
    from onnx import TensorProto as T
    from onnx import helper

    from graphpass.testing import assert_equivalent, make_model

    def signed_zero(neg):
        nodes = [helper.make_node("Mul", ["x", "z"], ["m"]), helper.make_node("Abs", ["m"], ["a"]),
                 helper.make_node("Neg" if neg else "Identity", ["a"], ["y"])]
        return make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, initializers={"z": np.array(0.0, np.float32)})

    assert_equivalent(signed_zero(False), signed_zero(True))  # within a tolerance: -0.0 == +0.0
    with pytest.raises(AssertionError, match="sign of zero differs"):
        assert_equivalent(signed_zero(False), signed_zero(True), exact=True)
    ids = [make_model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": (T.INT64, [3])}, {"y": (T.INT64, [3])},
                      initializers={"c": np.array(v, np.int64)}) for v in ([0, 5, 100000], [0, 5, 100001])]
    with pytest.raises(AssertionError, match="1 of 3 values differ"):
        assert_equivalent(ids[0], ids[1], rtol=1, atol=10)
