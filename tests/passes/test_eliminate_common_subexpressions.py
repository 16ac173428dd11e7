import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.passes import eliminate_common_subexpressions
from graphpass.testing import assert_equivalent, make_model, ops


def test_duplicate_chains_merge():
    model = make_model([helper.make_node("Relu", ["x"], ["a1"]), helper.make_node("Relu", ["x"], ["a2"]),
                        helper.make_node("Exp", ["a1"], ["b1"]), helper.make_node("Exp", ["a2"], ["b2"]),
                        helper.make_node("Add", ["b1", "b2"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert result.modified and result.stats["nodes_merged"] == 2
    assert ops(graph) == ["Relu", "Exp", "Add"]
    add = graph.nodes[-1]
    assert add.inputs[0] is add.inputs[1]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_different_attributes_do_not_merge():
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
                        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
                        helper.make_node("Add", ["a", "b"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified


def test_among_nodes_of_one_op_and_inputs_the_attributes_decide_and_the_first_stays():
    # the attributes are keyed only once a second node reads the same inputs: the first is keyed
    # then, and a later node equal to it (not to the one between) merges into it
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
                        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
                        helper.make_node("LeakyRelu", ["x"], ["c"], alpha=0.1),
                        helper.make_node("Sum", ["a", "b", "c"], ["y"])],
                       {"x": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    first = graph.nodes[0]
    result = eliminate_common_subexpressions(graph)
    assert result.stats["nodes_merged"] == 1
    assert ops(graph) == ["LeakyRelu", "LeakyRelu", "Sum"] and graph.nodes[0] is first
    total = graph.nodes[-1]
    assert total.inputs[0] is first.outputs[0] and total.inputs[2] is first.outputs[0]
    assert total.inputs[1] is graph.nodes[1].outputs[0]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_random_ops_and_graph_outputs_never_merge():
    model = make_model([helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=1.0),
                        helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0),
                        helper.make_node("Neg", ["x"], ["y1"]), helper.make_node("Neg", ["x"], ["y2"])],
                       {"x": [3]}, {"r1": [3], "r2": [3], "y1": [3], "y2": [3]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    assert ops(graph).count("RandomUniformLike") == 2 and ops(graph).count("Neg") == 2


def test_equal_constants_merge_then_nodes_merge():
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Add", ["x", "c2"], ["b"]),
                        helper.make_node("Mul", ["a", "b"], ["y"])],
                       {"x": [3]}, {"y": [3]},
                       initializers={"c1": np.array([1, 2, 3], np.float32), "c2": np.array([1, 2, 3], np.float32)})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert result.stats["constants_merged"] == 1 and result.stats["nodes_merged"] == 1
    assert ops(graph) == ["Add", "Mul"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_duplicates_with_list_attributes_merge():
    model = make_model([helper.make_node("Transpose", ["x"], ["a"], perm=[1, 0]),
                        helper.make_node("Transpose", ["x"], ["b"], perm=[1, 0]),
                        helper.make_node("Add", ["a", "b"], ["y"])],
                       {"x": [2, 3]}, {"y": [3, 2]})
    graph = gp.load(model).graph
    assert eliminate_common_subexpressions(graph).stats["nodes_merged"] == 1
    assert ops(graph) == ["Transpose", "Add"]
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_float_attributes_differing_only_in_the_sign_of_zero_do_not_merge():
    # LeakyRelu(alpha=0.0) of a negative x is -0.0, with alpha=-0.0 it is +0.0: not the same node
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.0),
                        helper.make_node("LeakyRelu", ["x"], ["b"], alpha=-0.0),
                        helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
                       {"x": [3]}, {"y": [6]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    out = assert_equivalent(model, gp.to_proto(graph), feeds={"x": np.array([-1.0, 2.0, -0.0], np.float32)}, exact=True)
    assert np.signbit(out["y"][0]) != np.signbit(out["y"][3])


def test_random_ops_never_merge():
    model = make_model([helper.make_node("RandomUniformLike", ["x"], ["a"]),
                        helper.make_node("RandomUniformLike", ["x"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["y"])],
                       {"x": [64]}, {"y": [64]})
    graph = gp.load(model).graph
    assert not eliminate_common_subexpressions(graph).modified
    assert ops(graph).count("RandomUniformLike") == 2


def test_nodes_reading_different_tensors_do_not_merge():
    # same op, same attributes, other inputs (or the same inputs in another order): not duplicates
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["z"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["s1"]), helper.make_node("Sub", ["b", "a"], ["s2"]),
                        helper.make_node("Add", ["s1", "s2"], ["y"])],
                       {"x": [3], "z": [3]}, {"y": [3]})
    graph = gp.load(model).graph
    result = eliminate_common_subexpressions(graph)
    assert not result.modified and result.stats["nodes_merged"] == 0
    assert ops(graph) == ["Relu", "Relu", "Sub", "Sub", "Add"]
    feeds = {"x": np.array([1.0, -0.0, np.nan], np.float32), "z": np.array([2.0, 0.0, -np.inf], np.float32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


# -- identical initializers shared (issue 20) ----------------------------------------------------

import onnx  # noqa: E402
from onnx import TensorProto as T, numpy_helper as nh  # noqa: E402


def _sum_model(values: dict, inputs_with_default=(), dtype_of=None):
    """y = x + c0 + c1 + ...; every constant an initializer (some also graph inputs)."""
    names = list(values)
    nodes, prev = [], "x"
    for k, n in enumerate(names):
        nodes.append(helper.make_node("Add", [prev, n], [f"s{k}"]))
        prev = f"s{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    shape = list(next(iter(values.values())).shape)
    elem = helper.np_dtype_to_tensor_dtype(next(iter(values.values())).dtype)
    inputs = [helper.make_tensor_value_info("x", elem, shape)]
    inputs += [helper.make_tensor_value_info(n, elem, shape) for n in inputs_with_default]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", elem, shape)],
                          initializer=[nh.from_array(v, k) for k, v in values.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_equal_weights_of_any_size_are_stored_once():
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)  # 256 KiB: past the old 64 KiB
    model = _sum_model({"a": w, "b": w.copy(), "c": w + 1})
    graph = gp.load(model).graph
    assert eliminate_common_subexpressions(graph).stats["constants_merged"] == 1
    out = gp.to_proto(graph)
    assert sorted(t.name for t in out.graph.initializer) == ["a", "c"]
    assert_equivalent(model, out, exact=True)


def test_constants_that_differ_in_sign_of_zero_nan_payload_dtype_or_shape_stay_apart():
    nan2 = np.array([np.nan, 1.0], np.float32)
    nan2.view(np.uint32)[0] = 0x7FC00001  # another NaN payload
    cases = [
        {"a": np.array([0.0, 1.0], np.float32), "b": np.array([-0.0, 1.0], np.float32)},
        {"a": np.array([np.nan, 1.0], np.float32), "b": nan2},
    ]
    for values in cases:
        graph = gp.load(_sum_model(values)).graph
        assert eliminate_common_subexpressions(graph).stats["constants_merged"] == 0, values
    # same bytes, another dtype or shape
    model = make_model([helper.make_node("Cast", ["i"], ["ic"], to=T.FLOAT), helper.make_node("Add", ["f", "ic"], ["y"]),
                        helper.make_node("Reshape", ["x", "s1"], ["r1"]), helper.make_node("Reshape", ["x", "s2"], ["r2"])],
                       {"x": [6]}, {"y": [2], "r1": [2, 3], "r2": [6]},
                       initializers={"f": np.zeros(2, np.float32), "i": np.zeros(2, np.int32),
                                     "s1": np.array([2, 3], np.int64), "s2": np.array([6], np.int64)})
    graph = gp.load(model).graph
    assert eliminate_common_subexpressions(graph).stats["constants_merged"] == 0


def test_a_graph_input_with_a_default_initializer_is_never_merged():
    """An initializer that is also a graph input is a default the caller may override."""
    w = np.ones((4,), np.float32)
    model = _sum_model({"a": w, "b": w.copy()}, inputs_with_default=("b",))
    graph = gp.load(model).graph
    assert eliminate_common_subexpressions(graph).stats["constants_merged"] == 0
    out = gp.to_proto(graph)
    assert "b" in [i.name for i in out.graph.input]
    from graphpass.check import verify as V
    feeds = {"x": np.zeros(4, np.float32), "b": np.full(4, 5.0, np.float32)}
    np.testing.assert_array_equal(V.run(V.session(out), feeds)["y"], V.run(V.session(model), feeds)["y"])
    # frozen on request: then they are constants and merge
    graph = gp.load(model, freeze_initializer_inputs=True).graph
    assert eliminate_common_subexpressions(graph).stats["constants_merged"] == 1


def test_equal_weights_across_if_branches_become_one_in_the_main_graph(tmp_path):
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)

    def body(tag):
        return helper.make_graph([helper.make_node("MatMul", ["x", f"{tag}_w"], [f"{tag}_y"])], tag, [],
                                 [helper.make_tensor_value_info(f"{tag}_y", T.FLOAT, [2, 64])],
                                 initializer=[nh.from_array(w, f"{tag}_w")])

    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=body("then"), else_branch=body("else")),
                           helper.make_node("MatMul", ["y", "main_w"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 64]), helper.make_tensor_value_info("c", T.BOOL, [])],
                          [helper.make_tensor_value_info("z", T.FLOAT, [2, 64])], initializer=[nh.from_array(w, "main_w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    m = gp.load(str(src))
    assert eliminate_common_subexpressions(m.graph).stats["constants_merged"] == 2
    m.save(tmp_path / "o.onnx")
    out = onnx.load(tmp_path / "o.onnx")
    from graphpass.ir.graph import graph_protos
    assert [t.name for g in graph_protos(out.graph) for t in g.initializer] == ["main_w"]
    assert (tmp_path / "o.onnx").stat().st_size < src.stat().st_size - 2 * w.nbytes + 1024
    for c in (True, False):
        assert_equivalent(model, out, feeds={"x": np.ones((2, 64), np.float32), "c": np.array(c)}, exact=True)


# --- hostile review (attack2): the sub-byte and 8-bit float types numpy sees as one void dtype ---

import onnx  # noqa: E402
import pytest  # noqa: E402
from onnx import TensorProto  # noqa: E402

_T = TensorProto
#: pairs of ONNX types whose numpy (ml_dtypes) dtypes share ``dtype.str`` ('<V1'), with raw bytes
#: that unpack to the same bytes under both
_SAME_STR = [(_T.INT4, _T.UINT4, [0x9A, 0x7F], 4), (_T.INT4, _T.FLOAT4E2M1, [0x12, 0x34], 4),
             (_T.UINT4, _T.FLOAT4E2M1, [0x12, 0x34], 4),
             (_T.FLOAT8E4M3FN, _T.FLOAT8E4M3FNUZ, [0x3C, 0x40, 0x01, 0x02], 4),
             (_T.FLOAT8E4M3FNUZ, _T.FLOAT8E5M2FNUZ, [0x3C, 0x40, 0x01, 0x02], 4)]


def _two_constants(dt_a, dt_b, raw, n, as_nodes):
    tensors = [helper.make_tensor(name, dt, [n], vals=bytes(raw), raw=True) for name, dt in (("a", dt_a), ("b", dt_b))]
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in tensors] if as_nodes else []
    nodes += [helper.make_node("Cast", ["a"], ["ya"], to=_T.FLOAT), helper.make_node("Cast", ["b"], ["yb"], to=_T.FLOAT)]
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(y, _T.FLOAT, [n]) for y in ("ya", "yb")],
                          [] if as_nodes else tensors)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 11
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("as_nodes", [False, True], ids=["initializers", "constant_nodes"])
@pytest.mark.parametrize("dt_a,dt_b,raw,n", _SAME_STR,
                         ids=[f"{_T.DataType.Name(a)}-{_T.DataType.Name(b)}" for a, b, _, _ in _SAME_STR])
def test_constants_of_types_numpy_spells_alike_stay_apart(dt_a, dt_b, raw, n, as_nodes):
    """An INT4 and a UINT4 initializer of equal bytes were merged into the INT4 one (both are
    '<V1' to numpy): the UINT4 reader then read signed values, and the model changed."""
    model = _two_constants(dt_a, dt_b, raw, n, as_nodes)
    graph = gp.load(model).graph
    eliminate_common_subexpressions(graph)
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    casts = [n for n in graph.nodes if n.op == "Cast"]
    assert casts[0].inputs[0] is not casts[1].inputs[0]
    types = {i.name: i.data_type for i in out.graph.initializer}
    types.update({n.output[0]: n.attribute[0].t.data_type for n in out.graph.node if n.op_type == "Constant"})
    assert types == {"a": dt_a, "b": dt_b}


@pytest.mark.parametrize("arr", [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4) * -0.0, np.array([np.nan, -0.0, 1, np.inf], np.float16),
    np.array([np.iinfo(np.int64).min, 0, 7], np.int64), np.array([True, False]), np.zeros((0, 3), np.float32),
    np.array(3.5, np.float64), np.arange(100, dtype=np.uint16), np.arange(-8, 8, dtype=np.int8),
    np.arange(4096, dtype=np.float32),  # over the 64-byte key: a digest
], ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_a_weight_is_keyed_from_its_stored_bytes_as_from_its_values(arr):
    """A weight not read yet is keyed from its TensorProto's raw bytes (no decode): the key is the
    one its decoded array gets, so equal constants merge whichever form each is in."""
    import onnx
    import onnx_graphsurgeon as gs
    from onnx import numpy_helper

    from graphpass.passes.cleanup import eliminate_common_subexpressions as cse

    tp = numpy_helper.from_array(arr, "w")
    stored = gs.Constant("w", gs.ir.tensor.LazyValues(tp))
    assert cse._stored_bytes(stored) is not None
    assert cse._value_key(stored) == cse._value_key(gs.Constant("w", numpy_helper.to_array(tp)))
    # the same values stored as float_data/int32_data etc. (not raw): decoded, same key
    typed = onnx.helper.make_tensor("w", tp.data_type, arr.shape, arr.ravel().tolist()) if arr.dtype.kind != "f" or \
        arr.dtype == np.float32 else None
    if typed is not None and arr.dtype != np.float16:
        lazy = gs.Constant("w", gs.ir.tensor.LazyValues(typed))
        assert cse._stored_bytes(lazy) is None and cse._value_key(lazy) == cse._value_key(stored)


def test_a_constant_written_in_place_between_two_runs_is_keyed_by_its_bytes_now():
    """attack14: the value key cached on a constant (issue 22) must not outlive an in-place write
    into its array (a user's pass may write ``c.values[...] = ...``; the journal docstring asks
    graphpass's own passes not to). Before the fix the second run read c1's stale small key
    ([1, 2, 3, 4]), merged a new constant of those values into c1 (now 9s) and changed y."""
    import onnx_graphsurgeon as gs

    c1 = np.array([1, 2, 3, 4], np.float32)
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Mul", ["x", "c2"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["y"])],
                       {"x": [4]}, {"y": [4]}, {"c1": c1, "c2": np.array([5, 6, 7, 8], np.float32)})
    graph = gp.load(model).graph
    const = {t.name: t for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    for t in const.values():
        t.values  # read (as an earlier pass reads them): arrays, no longer lazy
    assert not eliminate_common_subexpressions(graph).modified  # keys read (and cached) here
    const["c1"].values[...] = 9.0  # a user's pass writes into the array
    c3 = gs.Constant("c3", np.array([1, 2, 3, 4], np.float32))  # and reads a new constant of c1's old values
    sub = graph.nodes[-1]
    z = gs.Variable("z", dtype=np.float32, shape=[4])
    graph.nodes.append(gs.Node("Add", inputs=[sub.outputs[0], c3], outputs=[z]))
    graph.outputs = [z]
    expected = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Mul", ["x", "c2"], ["b"]),
                           helper.make_node("Sub", ["a", "b"], ["y"]), helper.make_node("Add", ["y", "c3"], ["z"])],
                          {"x": [4]}, {"z": [4]}, {"c1": np.full(4, 9.0, np.float32),
                                                   "c2": np.array([5, 6, 7, 8], np.float32), "c3": c1})
    eliminate_common_subexpressions(graph)
    assert_equivalent(expected, gp.to_proto(graph), exact=True)
    add = graph.nodes[-1]
    assert add.inputs[1] is c3  # nothing equal to it: it stays


def test_a_small_writable_constant_s_key_is_reused_only_while_its_bytes_dtype_and_shape_hold():
    import onnx_graphsurgeon as gs
    from graphpass.passes.cleanup import eliminate_common_subexpressions as cse

    arr = np.array([1.0, -0.0, 3.0, 4.0], np.float32)  # writable, 16 bytes: keyed by its bytes
    c = gs.Constant("c", arr)
    first = cse._value_key(c)
    assert c.__dict__["_gp_small"][0] is arr and "_gp_digest" not in c.__dict__
    assert cse._value_key(c) == first  # (the bytes compared, the key reused)
    arr[1] = 0.0  # -0.0 -> +0.0 in place: other bytes, another key
    assert cse._value_key(c) != first and cse._value_key(c)[2] == np.array([1, 0, 3, 4], np.float32).tobytes()
    arr.shape = (2, 2)  # the same bytes, another shape
    assert cse._value_key(c)[1] == (2, 2)
    assert cse._value_key(c) == cse._value_key(gs.Constant("d", np.array([[1, 0], [3, 4]], np.float32)))
