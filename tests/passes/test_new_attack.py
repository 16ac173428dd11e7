"""Hostile review (session 9, atk2) of three things new on main at 434319e: ``graphpass concat``,
the portable expansion of the attention device op (device_ops_attention.expand) and
fuse_rms_norm's mixed form (a float32 norm cast down before a float16 weight).

The first section holds the findings: each test FAILS on main at 434319e (none is xfail); the
second, attacks that held and add coverage the sibling files lack."""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphpass as gp
from graphpass.cli import main
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion.fuse_attention import FuseAttention
from graphpass.passes.fusion.fuse_rms_norm import FuseRmsNorm
from graphpass.testing import assert_equivalent, make_model, ops, ort_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuse_attention import _sdpa  # noqa: E402

F, H, BF = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
BOOL = TensorProto.BOOL
RNG = np.random.default_rng(2609)


# ------------------------------------------------------------------------------------------
# helpers

def _save(path: Path, nodes, ins, outs, inits=(), opset=17, funcs=(), extra_opsets=(), external=None):
    """A model file; ``ins``: (name, shape) or (name, elem, shape); ``external``: a location."""
    def vi(spec):
        name, *rest = spec
        elem, shape = (F, rest[0]) if len(rest) == 1 else rest
        return helper.make_tensor_value_info(name, elem, shape)
    g = helper.make_graph(nodes, path.stem, [vi(i) for i in ins], [vi(o) for o in outs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra_opsets], functions=list(funcs))
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=external,
                  size_threshold=0)
    else:
        onnx.save(m, str(path))
    return str(path)


def _concat(tmp_path, a, b, io_map, *extra, name="j.onnx"):
    out = tmp_path / name
    rc = main(["concat", a, b, "--io-map", io_map, "-o", str(out), "-q", *extra])
    return rc, out


def _files(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _fuse_attention(model):
    m = gp.load(model)
    ctx = PassContext(target="ascend910b2")
    return m, FuseAttention()(m, ctx), ctx


def _attention_nodes(m):
    return [n for n in m.graph.nodes if n.domain == "graphpass.ascend" and n.op.startswith("Attention")]


def _rand(shape, elem=F):
    dt = {F: np.float32, H: np.float16}[elem]
    x = RNG.standard_normal(shape).astype(dt)
    flat = x.reshape(-1)
    if flat.size >= 8:
        flat[2:7] = np.array([np.nan, np.inf, -np.inf, -0.0, float(np.finfo(dt).tiny) / 4]).astype(dt)
    return x


def _gqa_symbolic(v_batch="B", elem=F):
    """GQA (4 query heads, 2 KV heads) over symbolic dims, repeat_kv as the dynamo exporter writes
    it (targets built from Shape slices of K/V); V's batch dim named ``v_batch``."""
    n, kvh, d = 4, 2, 8
    np_t = np.float32 if elem == F else np.float16
    inits = {"ax2": np.array([2], np.int64), "rep": np.array([n // kvh], np.int64), "nh": np.array([n], np.int64),
             "c": np.array(0.25, np_t)}
    nodes = []
    for x in "kv":
        nodes += [helper.make_node("Shape", [x], [f"{x}_s01"], start=0, end=2),
                  helper.make_node("Shape", [x], [f"{x}_s23"], start=2),
                  helper.make_node("Shape", [x], [f"{x}_s0"], start=0, end=1),
                  helper.make_node("Concat", [f"{x}_s01", "rep", f"{x}_s23"], [f"{x}_t5"], axis=0),
                  helper.make_node("Concat", [f"{x}_s0", "nh", f"{x}_s23"], [f"{x}_t4"], axis=0),
                  helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}_u"]),
                  helper.make_node("Expand", [f"{x}_u", f"{x}_t5"], [f"{x}_e"]),
                  helper.make_node("Reshape", [f"{x}_e", f"{x}_t4"], [f"{x}_r"])]
    nodes += [helper.make_node("Transpose", ["k_r"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v_r"], ["y"])]
    return make_model(nodes, {"q": (elem, ["B", n, "S", d]), "k": (elem, ["B", kvh, "T", d]),
                              "v": (elem, [v_batch, kvh, "T", d])},
                      {"y": (elem, ["B", n, "S", d])}, initializers=inits, opset=18)


def _mixed_norm(x, w, out, tag, to=H, gamma_first=True):
    """A float32 RMSNorm cast down (to ``to``) before its weight: the mixed form."""
    return [helper.make_node("Pow", [x, "two"], [f"{tag}sq"]),
            helper.make_node("ReduceMean", [f"{tag}sq"], [f"{tag}ms"], axes=[-1]),
            helper.make_node("Add", [f"{tag}ms", "eps"], [f"{tag}mse"]),
            helper.make_node("Sqrt", [f"{tag}mse"], [f"{tag}s"]),
            helper.make_node("Reciprocal", [f"{tag}s"], [f"{tag}r"]),
            helper.make_node("Mul", [x, f"{tag}r"], [f"{tag}n"]),
            helper.make_node("Cast", [f"{tag}n"], [f"{tag}nd"], to=to),
            helper.make_node("Mul", [w, f"{tag}nd"] if gamma_first else [f"{tag}nd", w], [out])]


def _norm_inits(w):
    return {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "w": w}


def _fuse_rms(model, target="ascend910b2"):
    m = gp.load(model)
    ctx = PassContext(target=target)
    return m, FuseRmsNorm()(m, ctx), ctx


def _special32(shape=(2, 5, 8)):
    x = RNG.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:7] = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38, 1e-3]
    x[1, 4, :] = -0.0
    return x


# ==========================================================================================
# findings: each fails on main at 434319e


def test_concat_functions_with_one_name_and_op_list_but_other_wiring_are_not_merged_silently(tmp_path):
    # _fn_key compares only input names and op types: B's f = Sub(b, a) is dropped for A's Sub(a, b)
    def f(order):
        return helper.make_function("local", "f", ["a", "b"], ["c"], [helper.make_node("Sub", list(order), ["c"])],
                                    [helper.make_opsetid("", 17)])
    lo = helper.make_opsetid("local", 1)
    a = _save(tmp_path / "a.onnx", [helper.make_node("f", ["x", "x2"], ["y"], domain="local")], [("x", [4]), ("x2", [4])],
              [("y", [4])], funcs=[f("ab")], extra_opsets=[lo])
    b = _save(tmp_path / "b.onnx", [helper.make_node("f", ["p", "q"], ["z"], domain="local")], [("p", [4]), ("q", [4])],
              [("z", [4])], funcs=[f("ba")], extra_opsets=[lo])
    rc, out = _concat(tmp_path, a, b, "y:p")
    x = np.array([1, 2, 3, 4], np.float32)
    if rc == 0:  # refusing (exit 2) is right too; joining must keep B's own body
        got = ort_run(onnx.load(str(out)), {"x": x, "x2": np.zeros(4, np.float32), "q": 10 * x})["z"]
        assert np.array_equal(got, 10 * x - x), got  # B computes q - p; the join gives p - q
    else:
        assert rc == 2


def test_concat_of_two_models_with_a_large_weight_of_one_name_is_valid_and_computes_both(tmp_path):
    # B's 'w' (>= 1 KiB) is renamed 'b/w' in the graph, but the weightless export writes its original
    # TensorProto, still named 'w': two initializers 'w', B's MatMul reads a missing 'b/w' (exit 0)
    wa = numpy_helper.from_array(np.full((64, 64), 0.5, np.float32), "w")
    wb = numpy_helper.from_array(np.full((64, 64), -0.25, np.float32), "w")
    a = _save(tmp_path / "a.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], [("y", [1, 64])], [wa])
    b = _save(tmp_path / "b.onnx", [helper.make_node("MatMul", ["p", "w"], ["z"])], [("p", [1, 64])], [("z", [1, 64])], [wb])
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    got = ort_run(model, {"x": np.ones((1, 64), np.float32)})["z"]
    assert np.array_equal(got, np.full((1, 64), 0.5 * 64 * -0.25 * 64, np.float32))


def test_concat_max_memory_budgets_the_join_not_each_model(tmp_path):
    # each model is read under the whole budget and the budgets are never added: two 16 KB models
    # join under --max-memory 20K
    w = numpy_helper.from_array(np.full((64, 64), 0.5, np.float32), "w")
    a = _save(tmp_path / "a.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], [("y", [1, 64])], [w])
    b = _save(tmp_path / "b.onnx", [helper.make_node("MatMul", ["p", "w"], ["z"])], [("p", [1, 64])], [("z", [1, 64])], [w])
    rc, out = _concat(tmp_path, a, b, "y:p", "--max-memory", "20K")
    assert rc == 2 and not out.exists()


def test_concat_prefixed_name_colliding_with_another_name_of_the_second_is_refused_or_renamed(tmp_path):
    # B has 't' and 'b/t'; A has 't': B's 't' becomes 'b/t' too, a model with two 'b/t' is written (exit 0)
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])],
              [("x", [4])], [("y", [4])])
    b = _save(tmp_path / "b.onnx", [helper.make_node("Relu", ["p"], ["t"]), helper.make_node("Neg", ["t"], ["b/t"]),
                                    helper.make_node("Add", ["t", "b/t"], ["z"])], [("p", [4])], [("z", [4])])
    rc, out = _concat(tmp_path, a, b, "y:p")
    if rc == 0:
        onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    else:
        assert rc == 2 and not out.exists()


def test_concat_feeding_an_input_that_is_also_an_output_of_the_second_writes_a_valid_model(tmp_path):
    # B's output 'p' is its input 'p'; fed by A, 'p' is left as a graph output nothing produces (exit 0)
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])])
    b = _save(tmp_path / "b.onnx", [helper.make_node("Neg", ["p"], ["z"])], [("p", [4])], [("z", [4]), ("p", [4])])
    rc, out = _concat(tmp_path, a, b, "y:p")
    if rc == 0:
        model = onnx.load(str(out))
        onnx.checker.check_model(model, full_check=True)
        x = np.array([1, -2, 3, -4], np.float32)
        got = ort_run(model, {"x": x})
        assert np.array_equal(got[model.graph.output[0].name], -np.maximum(x, 0))
    else:
        assert rc == 2 and not out.exists()


def test_concat_keeps_the_default_of_an_initializer_input_of_the_second(tmp_path):
    # B's input 'q' has an initializer default (IR >= 4): the join drops it (b.input_defaults lost)
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])])
    b = _save(tmp_path / "b.onnx", [helper.make_node("Add", ["p", "q"], ["z"])], [("p", [4]), ("q", [4])], [("z", [4])],
              inits=[numpy_helper.from_array(np.full(4, 5, np.float32), "q")])
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    model = onnx.load(str(out))
    assert "q" in {i.name for i in model.graph.initializer}, [i.name for i in model.graph.initializer]
    x = np.array([1, -2, 3, -4], np.float32)
    assert np.array_equal(ort_run(model, {"x": x})["z"], np.maximum(x, 0) + 5)


def test_concat_writes_external_data_when_only_the_second_model_had_it(tmp_path):
    # "external data where either model had it": only the first's layout is read, B's weight goes inline
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["h"])], [("x", [1, 64])], [("h", [1, 64])])
    w = numpy_helper.from_array(np.full((64, 64), -0.25, np.float32), "w")
    b = _save(tmp_path / "b" / "b.onnx", [helper.make_node("MatMul", ["h", "w"], ["y"])], [("h", [1, 64])],
              [("y", [1, 64])], [w], external="b.weights")
    rc, out = _concat(tmp_path, a, b, "h:h")
    assert rc == 0
    j = onnx.load(str(out), load_external_data=False)
    assert [i.data_location for i in j.graph.initializer] == [TensorProto.EXTERNAL]


def test_portable_attention_with_v_batch_broadcast_over_symbolic_dims_runs():
    # K batch B, V batch 1 (broadcast by the second MatMul): the expansion reshapes V with K's
    # runtime target ("K and V share B"), so the portable model fails where device and original run
    model = _gqa_symbolic(v_batch="VB")
    m, res, ctx = _fuse_attention(model)
    assert len(_attention_nodes(m)) == 1
    feeds = {"q": _rand([2, 4, 3, 8]), "k": _rand([2, 2, 5, 8]), "v": _rand([1, 2, 5, 8])}
    assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)  # holds
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)  # fails: Reshape size mismatch


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_the_portable_output_reloaded_and_reoptimized_is_a_valid_model(kv_heads):
    # re-fused from its own portable output, the expansion names its constants y__c1... again:
    # they already exist (initializer name not unique)
    model = _sdpa(kv_heads=kv_heads)
    m, _, _ = _fuse_attention(model)
    m2, res2, _ = _fuse_attention(gp.to_proto(m))
    assert res2.modified
    onnx.checker.check_model(gp.to_proto(m2), full_check=True)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_optimize_run_again_on_its_own_output_exits_0(tmp_path, kv_heads):
    # the CLI form of the above: the second `graphpass optimize` is an internal error (exit 3,
    # InvalidOutputError "y__c1 initializer name is not unique")
    src, once, twice = tmp_path / "m.onnx", tmp_path / "once.onnx", tmp_path / "twice.onnx"
    onnx.save(_sdpa(kv_heads=kv_heads), str(src))
    assert main(["optimize", str(src), "-o", str(once), "-q", "--target", "ascend910b2"]) == 0
    assert main(["optimize", str(once), "-o", str(twice), "-q", "--target", "ascend910b2"]) == 0
    onnx.checker.check_model(onnx.load(str(twice)), full_check=True)


def test_the_portable_repeat_kv_is_recognized_when_reoptimized():
    # the expansion's repeat_kv (Expand by [1,1,rep,1,1], static Reshape) is not the fusion's:
    # re-optimizing the portable output forms an op with K repeated and scaled outside it
    model = _sdpa(kv_heads=1)
    m, _, _ = _fuse_attention(model)
    m2, _, _ = _fuse_attention(gp.to_proto(m))
    att = _attention_nodes(m2)
    assert len(att) == 1 and att[0].attrs["num_key_value_heads"] == 1, att[0].attrs
    assert "Expand" not in ops(m2)


def test_a_mixed_norm_whose_cast_down_is_also_an_output_fuses_or_says_why():
    # the mixed form keeps the Cast down outside the op, yet a second reader of it makes the
    # match give up silently: no fusion and no explanation
    model = make_model(_mixed_norm("x", "w", "y", "a"), {"x": (F, [2, 5, 8])}, {"y": (H, [2, 5, 8]), "and": (H, [2, 5, 8])},
                       initializers=_norm_inits(RNG.uniform(0.5, 1.5, 8).astype(np.float16)), opset=17)
    m, res, ctx = _fuse_rms(model)
    assert res.modified or any("RMSNorm" in str(e) for e in ctx.explanations), ops(m)


def test_concat_keeps_the_metadata_of_the_second_model(tmp_path):
    # metadata_props of the second model are dropped silently (only the first's Model facts are kept)
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])])
    b = _save(tmp_path / "b.onnx", [helper.make_node("Neg", ["p"], ["z"])], [("p", [4])], [("z", [4])])
    mb = onnx.load(b)
    helper.set_model_props(mb, {"tokenizer": "b-vocab"})
    onnx.save(mb, b)
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    assert {p.key: p.value for p in onnx.load(str(out)).metadata_props}.get("tokenizer") == "b-vocab"


def test_a_float16_attention_with_a_float64_softmax_is_not_taken_as_the_kernel():
    # the slot types are checked against no hardware fact: Softmax(Cast(S, DOUBLE)) of a float16
    # attention becomes PromptFlashAttention on 910B2 (query/key/value float16/bfloat16, no float64)
    b, n, s, d = 2, 4, 5, 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Div", ["s0", "c"], ["s1"]), helper.make_node("Cast", ["s1"], ["s2"], to=TensorProto.DOUBLE),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1), helper.make_node("Cast", ["p"], ["ph"], to=H),
             helper.make_node("MatMul", ["ph", "v"], ["y"])]
    model = make_model(nodes, {x: (H, [b, n, s, d]) for x in "qkv"}, {"y": (H, [b, n, s, d])},
                       initializers={"c": np.array(2.0, np.float16)}, opset=17)
    m, res, ctx = _fuse_attention(model)
    att = _attention_nodes(m)
    assert not att, att[0].attrs


def test_a_mixed_norm_before_an_upcast_norm_fuses_too():
    # the float32-body fallback works only one way: the pass (reverse) first gives the later upcast
    # norm a float16 body, then the earlier mixed norm is refused ("body typed for FLOAT16")
    inits = _norm_inits(RNG.uniform(0.5, 1.5, 8).astype(np.float16))
    inits["w1"] = RNG.uniform(0.5, 1.5, 8).astype(np.float16)
    nodes = _mixed_norm("xf", "w", "y0", "a") + [helper.make_node("Cast", ["y0"], ["ef"], to=F)]
    nodes += _mixed_norm("ef", "w1", "y1", "b")
    # the second norm is the upcast form: its X is the float16 y0, upcast by the Cast above
    model = make_model(nodes, {"xf": (F, [2, 5, 8])}, {"y1": (H, [2, 5, 8])}, initializers=inits, opset=17)
    m, res, ctx = _fuse_rms(model)
    assert ops(m).count("RmsNorm") == 2, (ops(m), [str(e) for e in ctx.explanations])
    assert_equivalent(model, gp.to_proto(m), {"xf": _special32()}, exact=True)


def _typed(path: Path, op, inp, out, elem, seq=False, opset=21):
    vi = helper.make_tensor_sequence_value_info if seq else helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node(op, [inp], [out])], path.stem, [helper.make_tensor_value_info(inp, elem, [4])],
                          [vi(out, elem, [4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return str(path)


@pytest.mark.parametrize("elem", [BF, TensorProto.FLOAT8E4M3FN])
def test_concat_of_bfloat16_or_float8_models_is_no_internal_error(tmp_path, elem):
    # the type check calls np.dtype on gs's int for bfloat16/float8: TypeError, exit 3
    a = _typed(tmp_path / "a.onnx", "Identity", "x", "y", elem)
    b = _typed(tmp_path / "b.onnx", "Identity", "p", "z", elem)
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_concat_of_a_sequence_output_into_a_tensor_input_is_refused(tmp_path):
    # a sequence has no gs dtype, so the type check passes it: an invalid model is written, exit 0
    a = _typed(tmp_path / "a.onnx", "SequenceConstruct", "x", "y", F, seq=True, opset=17)
    b = _typed(tmp_path / "b.onnx", "Neg", "p", "z", F, opset=17)
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 2 and not out.exists()


def test_concat_of_a_float16_and_a_bfloat16_device_form_model_keeps_each_rms_norm_body(tmp_path):
    # both define graphpass.ascend::RmsNorm with Cast(to=FLOAT16) / Cast(to=BFLOAT16): one op list for
    # _fn_key, so B's bfloat16 calls get A's float16 body: an invalid model is written, exit 0
    from test_fuse_rms_norm import _rms

    paths = []
    for tag, elem in (("a", H), ("b", BF)):
        m = gp.load(_rms(elem=elem, opset=18))
        assert FuseRmsNorm()(m, PassContext(target="ascend910b2")).modified
        p = gp.to_proto(m, emit="device")
        p.graph.input.append(helper.make_tensor_value_info(f"f{tag}", F, [2]))  # a float32 link between the two
        p.graph.node.append(helper.make_node("Identity", [f"f{tag}"], [f"o{tag}"]))
        p.graph.output.append(helper.make_tensor_value_info(f"o{tag}", F, [2]))
        paths.append(str(tmp_path / f"{tag}.onnx"))
        onnx.save(p, paths[-1])
    rc, out = _concat(tmp_path, *paths, "oa:fb")
    if rc == 0:
        onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    else:
        assert rc == 2 and not out.exists()


# ==========================================================================================
# attacks that held (coverage the sibling files lack)


def test_concat_if_bodies_with_the_same_local_names_in_both_models_compute_each_model(tmp_path):
    def if_node(outer, out):
        then = helper.make_graph([helper.make_node("Neg", [outer], ["t"]), helper.make_node("Relu", ["t"], ["t_o"])],
                                 "then", [], [helper.make_tensor_value_info("t_o", F, [4])])
        other = helper.make_graph([helper.make_node("Relu", [outer], ["t2"]), helper.make_node("Neg", ["t2"], ["t_e"])],
                                  "else", [], [helper.make_tensor_value_info("t_e", F, [4])])
        return helper.make_node("If", ["c"], [out], then_branch=then, else_branch=other)
    a = _save(tmp_path / "a.onnx", [if_node("x", "y")], [("c", BOOL, []), ("x", [4])], [("y", [4])])
    b = _save(tmp_path / "b.onnx", [if_node("p", "z")], [("c", BOOL, []), ("p", [4])], [("z", [4])])
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["c", "x", "b/c"]
    x = np.array([1, -2, 3, -0.0], np.float32)
    for ca in (True, False):
        for cb in (True, False):
            y = ort_run(onnx.load(a), {"c": np.array(ca), "x": x})["y"]
            z = ort_run(onnx.load(b), {"c": np.array(cb), "p": y})["z"]
            got = ort_run(model, {"c": np.array(ca), "x": x, "b/c": np.array(cb)})["z"]
            assert got.tobytes() == z.tobytes()


def test_concat_loop_bodies_reading_the_fed_input_by_outer_name_compute_the_chain(tmp_path):
    i64 = TensorProto.INT64

    def loop_model(path, inp, out):
        body = helper.make_graph(
            [helper.make_node("Add", ["acc", inp], ["t"]), helper.make_node("Identity", ["cond"], ["co"]),
             helper.make_node("Identity", ["t"], ["acc_o"])], "body",
            [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("cond", BOOL, []),
             helper.make_tensor_value_info("acc", F, [4])],
            [helper.make_tensor_value_info("co", BOOL, []), helper.make_tensor_value_info("acc_o", F, [4])])
        return _save(path, [helper.make_node("Loop", ["trip", "", inp], [out], body=body)],
                     [(inp, [4]), ("trip", i64, [])], [(out, [4])])
    a, b = loop_model(tmp_path / "a.onnx", "x", "y"), loop_model(tmp_path / "b.onnx", "p", "z")
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    x = np.array([1, -2, 3, -0.0], np.float32)
    y = ort_run(onnx.load(a), {"x": x, "trip": np.array(2)})["y"]
    want = ort_run(onnx.load(b), {"p": y, "trip": np.array(3)})["z"]
    got = ort_run(model, {"x": x, "trip": np.array(2), "b/trip": np.array(3)})["z"]
    assert got.tobytes() == want.tobytes()


def test_concat_of_opsets_7_and_17_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], [("y", [4])], opset=7)
    b = _save(tmp_path / "b.onnx", [helper.make_node("Neg", ["p"], ["z"])], [("p", [4])], [("z", [4])], opset=17)
    before = _files(tmp_path)
    rc, out = _concat(tmp_path, a, b, "y:p")
    assert rc == 2 and _files(tmp_path) == before
    assert "opset 7 and 17" in capsys.readouterr().err


def test_concat_second_models_unused_inputs_fed_or_not_and_a_clashing_one_prefixed(tmp_path):
    a = _save(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y2"])],
              [("x", [4])], [("y", [4]), ("y2", [4])])
    b = _save(tmp_path / "b.onnx", [helper.make_node("Neg", ["p"], ["z"])], [("p", [4]), ("u", [4]), ("x", [4])],
              [("z", [4])])
    rc, out = _concat(tmp_path, a, b, "y:p,y2:u")
    assert rc == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["x", "b/x"] and [o.name for o in model.graph.output] == ["z"]


def test_portable_gqa_over_symbolic_dims_in_float16_with_an_empty_batch_is_exact():
    model = _gqa_symbolic(elem=H)
    m, _, _ = _fuse_attention(model)
    assert len(_attention_nodes(m)) == 1
    for b in (2, 0):
        feeds = {"q": _rand([b, 4, 3, 8], H), "k": _rand([b, 2, 5, 8], H), "v": _rand([b, 2, 5, 8], H)}
        assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
        assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)


def _bsh_gqa_symbolic(n=4, kvh=2, d=8, elem=F, static=None):
    """Projections, head split [0,0,heads,d], dynamo-style repeat_kv, SDPA, head merge [0,0,H] over x: [B, S, H]."""
    h, npt = n * d, (np.float32 if elem == F else np.float16)
    inits = {"wq": (RNG.standard_normal((h, h)) * 0.3).astype(npt),
             "wk": (RNG.standard_normal((h, kvh * d)) * 0.3).astype(npt),
             "wv": (RNG.standard_normal((h, kvh * d)) * 0.3).astype(npt),
             "sq": np.array([0, 0, n, d], np.int64), "skv": np.array([0, 0, kvh, d], np.int64),
             "merge": np.array([0, 0, h], np.int64), "c": np.array(0.5, npt), "ax2": np.array([2], np.int64),
             "rep": np.array([n // kvh], np.int64), "nh": np.array([n], np.int64)}
    nodes = []
    for x in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}p"]),
                  helper.make_node("Reshape", [f"{x}p", "sq" if x == "q" else "skv"], [f"{x}4"]),
                  helper.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    for x in ("kh", "vh"):
        nodes += [helper.make_node("Shape", [x], [f"{x}_s01"], start=0, end=2),
                  helper.make_node("Shape", [x], [f"{x}_s23"], start=2),
                  helper.make_node("Shape", [x], [f"{x}_s0"], start=0, end=1),
                  helper.make_node("Concat", [f"{x}_s01", "rep", f"{x}_s23"], [f"{x}_t5"], axis=0),
                  helper.make_node("Concat", [f"{x}_s0", "nh", f"{x}_s23"], [f"{x}_t4"], axis=0),
                  helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}_u"]),
                  helper.make_node("Expand", [f"{x}_u", f"{x}_t5"], [f"{x}_e"]),
                  helper.make_node("Reshape", [f"{x}_e", f"{x}_t4"], [f"{x}_r"], allowzero=1)]
    nodes += [helper.make_node("Transpose", ["kh_r"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh_r"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    shp = static or ["B", "S", h]
    return make_model(nodes, {"x": (elem, shp)}, {"y": (elem, shp)}, initializers=inits, opset=18)


@pytest.mark.parametrize("elem", [F, H])
@pytest.mark.parametrize("static", [None, [2, 0, 32], [0, 3, 32]])
def test_portable_bsh_gqa_over_symbolic_or_empty_dims_is_exact(elem, static):
    model = _bsh_gqa_symbolic(elem=elem, static=static)
    m = gp.load(model)
    assert FuseAttention()(m, PassContext(target="ascend310p3" if elem == H else "ascend910b2")).modified
    assert [a.op for a in _attention_nodes(m)] == ["AttentionBSH"]
    for shape in [static] if static else [[2, 3, 32], [2, 0, 32], [0, 3, 32], [1, 1, 32]]:
        feeds = {"x": _rand(shape, elem)}
        assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
        assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)


@pytest.mark.parametrize("gamma_shape", [(8,), (1, 8), (1, 1, 8), (), (1,)])
def test_mixed_norm_with_weights_of_other_shapes_is_exact(gamma_shape):
    model = make_model(_mixed_norm("x", "w", "y", "a"), {"x": (F, [2, 5, 8])}, {"y": (H, [2, 5, 8])},
                       initializers=_norm_inits(RNG.uniform(0.5, 1.5, gamma_shape).astype(np.float16)), opset=17)
    m, res, _ = _fuse_rms(model)
    assert ops(m) == ["RmsNorm", "Cast", "Mul"]
    for emit in ("portable", "device"):
        p = gp.to_proto(m, emit=emit)
        onnx.checker.check_model(p, full_check=True)
        assert_equivalent(model, p, {"x": _special32()}, exact=True)


def test_mixed_norm_with_a_symbolic_width_or_a_weight_across_rows_is_left_with_the_reason():
    w = RNG.uniform(0.5, 1.5, 8).astype(np.float16)
    model = make_model(_mixed_norm("x", "w", "y", "a"), {"x": (F, [2, 5, "W"])}, {"y": (H, [2, 5, "W"])},
                       initializers=_norm_inits(w), opset=17)
    m, res, ctx = _fuse_rms(model)
    assert not res.modified and "width of a float32 norm cast down before its weight is not static" in str(ctx.explanations)
    model = make_model(_mixed_norm("x", "w", "y", "a"), {"x": (F, [2, 5, 8])}, {"y": (H, [2, 5, 8])},
                       initializers=_norm_inits(RNG.uniform(0.5, 1.5, (5, 8)).astype(np.float16)), opset=17)
    m, res, ctx = _fuse_rms(model)
    assert not res.modified and "not along the last axis only" in str(ctx.explanations)


def test_two_mixed_norms_sharing_input_and_weight_and_a_bfloat16_one_fuse():
    w = RNG.uniform(0.5, 1.5, 8).astype(np.float16)
    nodes = _mixed_norm("x", "w", "y", "a") + _mixed_norm("x", "w", "y2", "b", gamma_first=False)
    model = make_model(nodes, {"x": (F, [2, 5, 8])}, {"y": (H, [2, 5, 8]), "y2": (H, [2, 5, 8])},
                       initializers=_norm_inits(w), opset=17)
    m, res, _ = _fuse_rms(model)
    assert ops(m).count("RmsNorm") == 2
    assert_equivalent(model, gp.to_proto(m), {"x": _special32()}, exact=True)
    model = make_model(_mixed_norm("x", "w", "y", "a", to=BF), {"x": (F, [2, 5, 8])}, {"y": (BF, [2, 5, 8])},
                       initializers=_norm_inits(RNG.uniform(0.5, 1.5, 8).astype(ml_dtypes.bfloat16)), opset=17)
    m, res, _ = _fuse_rms(model)
    assert ops(m) == ["RmsNorm", "Cast", "Mul"]
    for emit in ("portable", "device"):
        onnx.checker.check_model(gp.to_proto(m, emit=emit), full_check=True)
