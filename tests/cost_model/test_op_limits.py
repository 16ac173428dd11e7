import pytest
import onnx_graphsurgeon as gs
import numpy as np

from graphpass.cost_model.op_limits import load_op_limits, parse_op_limits
from graphpass.cost_model.profiles import DATA_DIR
from graphpass.errors import UsageError


def _node(op, attrs=None, x_shape=(1, 3, 8, 8), w_shape=None, domain=None):
    x = gs.Variable("x", dtype=np.float32, shape=list(x_shape))
    inputs = [x]
    if w_shape is not None:
        inputs.append(gs.Constant("w", np.zeros(w_shape, np.float32)))
    return gs.Node(op, attrs=attrs or {}, inputs=inputs, outputs=[gs.Variable("y", dtype=np.float32)], domain=domain)


def test_every_row_has_a_source_and_tags():
    limits = load_op_limits()
    assert {"AveragePool", "Conv", "Pad", "Slice"} <= set(limits.rows)
    for row in limits.rows.values():
        assert row.src and row.tag in "PDTE" and row.fallback_tag in "PDTE"


@pytest.mark.parametrize("node,expected", [
    (_node("AveragePool", {"kernel_shape": [16, 16]}), None),
    (_node("AveragePool", {"kernel_shape": [16, 17]}), "16x17 = 272 > 256"),
    (_node("AveragePool", {"kernel_shape": [256, 1]}), "a side above 255"),
    (_node("AveragePool", {"kernel_shape": [2, 2], "strides": [64, 1]}), "stride 64 > 63"),
    (_node("Conv", {}, w_shape=(2, 3, 1, 300)), "a side above 255"),
    (_node("Conv", {}, x_shape=(1, 3, 1, 4097), w_shape=(2, 3, 1, 3)), "input W 4097 > 4096"),
    (_node("Conv", {}, x_shape=(1, 3, 4097), w_shape=(2, 3, 3)), "input W 4097 > 4096"),
    (_node("FusedConvRelu", {}, w_shape=(2, 3, 1, 300), domain="graphpass.ascend"), "a side above 255"),
    (_node("Pad", {"mode": "reflect"}), "mode=reflect runs on AI CPU"),
    (_node("Pad", {"mode": b"reflect"}), "mode=reflect runs on AI CPU"),
    (_node("Pad", {"mode": "constant"}), None),
    (_node("Pad", {}), None),
    (_node("Pad", {"mode": "reflect"}, domain="other"), None),
])
def test_aicpu_reason(node, expected):
    got = load_op_limits().aicpu_reason(node)
    if expected is None:
        assert got is None
    else:
        assert expected in got and "P)" in got


def _slice(axes, steps, shape=(1, 2, 5, 6)):
    x = gs.Variable("x", dtype=np.float32, shape=list(shape))
    c = [gs.Constant(f"c{i}", np.asarray(v, np.int64)) for i, v in enumerate(([0] * len(axes), [2] * len(axes), axes, steps))]
    return gs.Node("Slice", inputs=[x, *c], outputs=[gs.Variable("y", dtype=np.float32)])


def test_a_slice_with_a_step_other_than_1_on_the_last_axis_leaves_ai_core():
    limits = load_op_limits()
    assert "step -1 on the last axis" in limits.aicpu_reason(_slice([3], [-1]))
    assert "step 2 on the last axis" in limits.aicpu_reason(_slice([2, -1], [1, 2]))
    assert limits.aicpu_reason(_slice([2], [-1])) is None
    assert limits.aicpu_reason(_slice([3], [1])) is None


def test_only_a_row_that_reads_input_values_says_so():
    # the estimate decides such a node's engine per node, not once per signature
    limits = load_op_limits()
    assert limits.reads_values(_slice([3], [2]))
    conv = gs.Node("Conv", inputs=[gs.Variable("x", dtype=np.float32, shape=[1, 3, 8, 8])],
                   outputs=[gs.Variable("y", dtype=np.float32)], attrs={"kernel_shape": [3, 3]})
    assert not limits.reads_values(conv)
    assert not limits.reads_values(gs.Node("Relu", inputs=[gs.Variable("x")], outputs=[gs.Variable("y")]))


def test_a_malformed_file_names_file_and_key(tmp_path):
    text = (DATA_DIR / "op_limits.toml").read_text()
    for old, new, key in (("max_stride = 63", "max_stride = -1", "ops.AveragePool.max_stride"),
                          ("max_stride = 63", "max_strde = 63", "ops.AveragePool.max_strde"),
                          ('tag = "P"', 'tag = "X"', "ops.AveragePool.tag")):
        bad = tmp_path / "op_limits.toml"
        bad.write_text(text.replace(old, new, 1))
        with pytest.raises(UsageError, match=f"op_limits.toml: key '{key}'"):
            parse_op_limits(bad)


def _int_node(op, dtype, out_dtype=None, domain=None):
    ins = [gs.Variable("a", dtype=dtype, shape=[4]), gs.Variable("b", dtype=dtype, shape=[4])]
    return gs.Node(op, inputs=ins, outputs=[gs.Variable("y", dtype=out_dtype or dtype, shape=[4])], domain=domain)


def test_int64_rows_name_known_targets_with_sources():
    limits = load_op_limits()
    assert {"Add", "Range", "Equal"} <= set(limits.int64)
    for row in limits.int64.values():
        assert row.src and row.tag in "PDTE" and set(row.aicpu_on) <= {"ascend910a", "ascend910b2", "ascend310p3"}
    for target in ("ascend910a", "ascend910b2", "ascend310p3"):
        assert limits.max_tensor_bytes(target) >= 2 ** 34
    assert limits.max_tensor_bytes("no-such-target") is None


@pytest.mark.parametrize("node,target,expected", [
    (_int_node("Add", np.int64), "ascend910a", "int64 Add has no AI Core kernel on ascend910a"),
    (_int_node("Add", np.int64), "ascend310p3", "int64 Add has no AI Core kernel on ascend310p3"),
    (_int_node("Add", np.int64), "ascend910b2", None),  # ops-math's Add takes INT64 on Atlas A2
    (_int_node("Add", np.int32), "ascend910a", None),
    (_int_node("Less", np.int64, np.bool_), "ascend910a", "int64 Less"),  # a comparison: its input's dtype
    (_int_node("Concat", np.int64), "ascend910a", None),  # movement ops take any dtype
    (_int_node("Add", np.int64, domain="other"), "ascend910a", None),
])
def test_int64_reason(node, target, expected):
    got = load_op_limits().int64_reason(node, target)
    if expected is None:
        assert got is None
    else:
        assert expected in got


def test_a_malformed_int64_row_names_file_and_key(tmp_path):
    text = (DATA_DIR / "op_limits.toml").read_text()
    for old, new, key in (('aicpu_on = ["ascend910a", "ascend310p3"]', 'aicpu_on = ["ascend910x"]', "int64.Add.aicpu_on"),
                          ('aicpu_on = ["ascend910a", "ascend310p3"]', 'aicpu_on = []', "int64.Add.aicpu_on"),
                          ("max_tensor_bytes = 34359738368", "max_tensor_bytes = 0", "tensor_limits.ascend910a.max_tensor_bytes"),
                          ("[tensor_limits.ascend910a]", "[tensor_limits.ascend999]", "tensor_limits.ascend999")):
        bad = tmp_path / "op_limits.toml"
        bad.write_text(text.replace(old, new, 1))
        with pytest.raises(UsageError, match=f"op_limits.toml: key '{key}'"):
            parse_op_limits(bad)
