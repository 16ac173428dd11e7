"""fuse_attention: scaled dot-product attention as exporters write it -> graphpass.ascend::Attention
(BNSD) / AttentionBSH (issue 26). Exact: the device op's body computes the export's ops."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion.fuse_attention import FuseAttention
from graphpass.testing import assert_equivalent, check_full, make_model, ops

RNG = np.random.default_rng(2600)
NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}


def _run(model, target="ascend910b2", **cost_options):
    m = gp.load(model)
    ctx = PassContext(target=target, cost_options=cost_options)
    return m, FuseAttention()(m, ctx), ctx


def _c(inits, name, value, elem=TensorProto.FLOAT, shape=()):
    """A constant as the cleanup pipeline leaves it (an initializer); returns nothing to add."""
    inits[name] = np.full(shape, value, NP[elem])
    return []


def _sdpa(b=2, n=4, sq=5, skv=5, d=8, elem=TensorProto.FLOAT, scale="sdpa", mask="bool", guard=True, kt="bnsd",
          kv_heads=None, softmax_axis=-1, opset=18, zero=0.0, scale_value=None):
    """An attention over BNSD Q, K, V as the exporters write it.

    scale: "sdpa" (Q*s, K^T*s, torch's SDPA export), "div" (S / sqrt(d)), "mul" (S * 1/sqrt(d)),
    "none"; mask: "bool" (Where(m, 0, -inf) added), "add" (a float mask input), None;
    kt: "bnsd" (Transpose(K, [0,1,3,2])), "bsnd" (K given as [B,S,N,D]: Transpose [0,2,3,1]),
    "dynamo" (Reshape/Transpose/Reshape); kv_heads: K and V with fewer heads, repeated (repeat_kv)."""
    kvh = kv_heads or n
    nodes, inits = [], {}
    k_shape = [b, skv, kvh, d] if kt == "bsnd" else [b, kvh, skv, d]
    inputs = {"q": (elem, [b, n, sq, d]), "k": (elem, k_shape), "v": (elem, [b, kvh, skv, d])}
    k, v = "k", "v"
    if kv_heads:
        rep = n // kv_heads
        inits["ax2"] = np.array([2], np.int64)
        inits["e5"] = np.array([b, kv_heads, rep, skv, d], np.int64)
        inits["r4"] = np.array([b, n, skv, d], np.int64)
        for x in ("k", "v"):
            nodes += [helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}_u"]),
                      helper.make_node("Expand", [f"{x}_u", "e5"], [f"{x}_e"]),
                      helper.make_node("Reshape", [f"{x}_e", "r4"], [f"{x}_r"])]
        k, v = "k_r", "v_r"
    if kt == "bnsd":
        nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]))
    elif kt == "bsnd":
        nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=[0, 2, 3, 1]))
    else:  # the dynamo exporter's 3-D transpose
        inits["flat"] = np.array([-1, skv, d], np.int64)
        inits["back"] = np.array([b, n, d, skv], np.int64)
        nodes += [helper.make_node("Reshape", [k, "flat"], ["k3"]),
                  helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", ["k3t", "back"], ["kt"])]
    # scale values as float32 holds them (a float64 model's constant must be one for the op)
    sv = scale_value if scale_value is not None else float(np.float32(np.sqrt(1.0 / np.sqrt(d))))
    q, ktt = "q", "kt"
    if scale == "sdpa":
        nodes += _c(inits, "s", sv, elem) + [helper.make_node("Mul", ["q", "s"], ["qs"]),
                  helper.make_node("Mul", ["kt", "s"], ["kts"])]
        q, ktt = "qs", "kts"
    nodes.append(helper.make_node("MatMul", [q, ktt], ["s0"]))
    s = "s0"
    if scale in ("div", "mul"):
        val = float(np.float32(np.sqrt(d) if scale == "div" else 1.0 / np.sqrt(d)))
        nodes += _c(inits, "sc", val, elem) + [helper.make_node("Div" if scale == "div" else "Mul", ["s0", "sc"], ["s1"])]
        s = "s1"
    if mask == "bool":
        inputs["m"] = (TensorProto.BOOL, [b, 1, sq, skv])
        nodes += _c(inits, "zf", 0.0, elem) + _c(inits, "ninf", float("-inf"), elem) + [
                  helper.make_node("Where", ["m", "zf", "ninf"], ["madd"]),
                  helper.make_node("Add", [s, "madd"], ["s2"])]
        s = "s2"
    elif mask == "add":
        inputs["m"] = (elem, [b, 1, sq, skv])
        nodes.append(helper.make_node("Add", [s, "m"], ["s2"]))
        s = "s2"
    nodes.append(helper.make_node("Softmax", [s], ["p"], axis=softmax_axis))
    p = "p"
    if guard:
        nodes += _c(inits, "z", zero, elem, (1,)) + [helper.make_node("IsNaN", ["p"], ["isn"]),
                  helper.make_node("Where", ["isn", "z", "p"], ["pg"])]
        p = "pg"
    nodes.append(helper.make_node("MatMul", [p, v], ["y"]))
    return make_model(nodes, inputs, {"y": (elem, [b, n, sq, d])}, initializers=inits, opset=opset)


def _feeds(model, specials=True):
    out = {}
    for i in model.graph.input:
        t = i.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TensorProto.BOOL:
            m = RNG.random(shape) < 0.3
            m[..., 0, :] = False  # a fully masked row: -inf everywhere, softmax NaN, the guard's 0
            out[i.name] = m
            continue
        dt = NP[t.elem_type]
        x = RNG.standard_normal(shape).astype(dt)
        if specials and i.name in ("q", "v"):
            flat = x.reshape(-1)
            vals = [np.nan, np.inf, -np.inf, -0.0, float(np.finfo(dt).tiny) / 4]
            flat[3: 3 + len(vals)] = np.array(vals, np.float64).astype(dt)
        out[i.name] = x
    return out


def _device(m):
    return gp.to_proto(m, emit="device")


def _attention_nodes(m):
    return [n for n in m.graph.nodes if n.domain == "graphpass.ascend" and n.op.startswith("Attention")]


# ------------------------------------------------------------------------------------------
# fired, structure, bitwise


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE])
@pytest.mark.parametrize("scale, mask, guard, kt", [
    ("sdpa", "bool", True, "bnsd"),     # torch's SDPA export (torchscript and dynamo)
    ("sdpa", "bool", True, "dynamo"),   # the dynamo exporter's 3-D K^T
    ("div", "add", False, "bsnd"),      # HF eager: scores / sqrt(d) + an additive mask, K^T of [B,S,N,D]
    ("mul", None, False, "bnsd"),       # scores * 1/sqrt(d), no mask
    ("none", None, False, "bnsd"),      # Whisper: Q scaled before the head split (outside)
])
def test_an_exported_attention_becomes_one_op_bit_for_bit(elem, scale, mask, guard, kt):
    model = _sdpa(elem=elem, scale=scale, mask=mask, guard=guard, kt=kt)
    # CANN has no float64 attention (the target refuses it, below): the exactness of the op's
    # body is checked in float64 too, without a hardware target
    m, res, _ = _run(model, target="none" if elem == TensorProto.DOUBLE else "ascend910b2")
    assert res.modified
    att = _attention_nodes(m)
    assert [n.op for n in att] == ["Attention"]
    left = set(ops(m)) - {"Attention", "Transpose", "Constant", "Where"}
    assert not left & {"Softmax", "MatMul", "IsNaN"}, ops(m)
    a = att[0].attrs
    assert a["num_heads"] == 4 and a["num_key_value_heads"] == 4 and a["input_layout"] == "BNSD"
    assert a["nan_to_zero"] == int(guard)
    assert a["mask_kind"] == {"bool": "boolean", "add": "additive", None: "none"}[mask]
    expect = {"sdpa": 1 / np.sqrt(8), "div": 1 / np.sqrt(8), "mul": 1 / np.sqrt(8), "none": 1.0}[scale]
    assert abs(a["scale"] - expect) < 1e-3
    feeds = _feeds(model)
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)  # portable: the body inlined
    device = _device(m)
    check_full(device)
    assert_equivalent(model, device, feeds, exact=True)  # the device op through its function


def test_grouped_and_multi_query_attention_take_k_and_v_before_repeat_kv():
    for kvh in (2, 1):
        model = _sdpa(n=4, kv_heads=kvh)
        m, res, _ = _run(model)
        att = _attention_nodes(m)
        assert len(att) == 1 and att[0].attrs["num_key_value_heads"] == kvh
        assert att[0].inputs[1].name == "k" and att[0].inputs[2].name == "v"  # the op repeats them itself
        assert not {"Expand", "Unsqueeze"} & set(ops(m))
        assert res.stats["rules"]["attention_bnsd"]["kv_heads_absorbed"] == 1
        assert_equivalent(model, gp.to_proto(m), _feeds(model), exact=True)


def test_a_kv_cache_concat_feeds_the_op_and_a_one_token_query_fuses():
    b, n, past, d = 2, 4, 6, 8
    nodes = [helper.make_node("Concat", ["past_k", "k_new"], ["k"], axis=2),
             helper.make_node("Concat", ["past_v", "v_new"], ["v"], axis=2),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "sc"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    f = TensorProto.FLOAT
    model = make_model(nodes, {"q": (f, [b, n, 1, d]), "k_new": (f, [b, n, 1, d]), "v_new": (f, [b, n, 1, d]),
                               "past_k": (f, [b, n, past, d]), "past_v": (f, [b, n, past, d])},
                       {"y": (f, [b, n, 1, d]), "k": (f, [b, n, past + 1, d]), "v": (f, [b, n, past + 1, d])},
                       initializers={"sc": np.float32(1 / np.sqrt(d))}, opset=18)
    m, res, _ = _run(model)
    assert [n.op for n in _attention_nodes(m)] == ["Attention"]
    assert ops(m).count("Concat") == 2  # the present K/V stay outputs
    assert_equivalent(model, gp.to_proto(m), _feeds(model), exact=True)


def _bsh(b=2, s=6, n=4, d=8, kv_heads=None, flat=False, elem=TensorProto.FLOAT):
    """Projections, head split, SDPA, head merge (what the dynamo exporter writes for ViT/GPT-2)."""
    kvh = kv_heads or n
    h = n * d
    w = {x: RNG.standard_normal((h, (kvh if x != "q" else n) * d)).astype(NP[elem]) * 0.3 for x in "qkv"}
    inits = {f"w{x}": w[x] for x in "qkv"}
    inits.update({"sq": np.array([b, s, n, d], np.int64), "skv": np.array([0, 0, kvh, d], np.int64),
                  "merge": np.array([-1, h] if flat else [b, s, h], np.int64),
                  "s": np.array(np.sqrt(1 / np.sqrt(d)), NP[elem])})
    nodes = []
    for x in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}p"]),
                  helper.make_node("Reshape", [f"{x}p", "sq" if x == "q" else "skv"], [f"{x}4"]),
                  helper.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    k, v = "kh", "vh"
    if kv_heads:  # HF's repeat_kv
        inits.update({"ax2": np.array([2], np.int64), "e5": np.array([b, kvh, n // kvh, s, d], np.int64),
                      "r4": np.array([b, n, s, d], np.int64)})
        for x in ("kh", "vh"):
            nodes += [helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}_u"]),
                      helper.make_node("Expand", [f"{x}_u", "e5"], [f"{x}_e"]),
                      helper.make_node("Reshape", [f"{x}_e", "r4"], [f"{x}_r"])]
        k, v = "kh_r", "vh_r"
    nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("Mul", ["qh", "s"], ["qs"]), helper.make_node("Mul", ["kt", "s"], ["kts"]),
              helper.make_node("MatMul", ["qs", "kts"], ["s0"]),
              helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", v], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    out = [b * s, h] if flat else [b, s, h]
    return make_model(nodes, {"x": (elem, [b, s, h])}, {"y": (elem, out)}, initializers=inits, opset=18)


@pytest.mark.parametrize("flat", [False, True])
def test_the_head_split_and_merge_go_inside_the_op_in_the_bsh_layout(flat):
    model = _bsh(flat=flat)
    m, res, _ = _run(model)
    att = _attention_nodes(m)
    assert [n.op for n in att] == ["AttentionBSH"] and att[0].attrs["input_layout"] == "BSH"
    assert "Transpose" not in ops(m)
    assert ops(m).count("Reshape") == int(flat)  # a [B*S, H] view of the merged heads stays
    assert [t.name for t in att[0].inputs[:3]] == ["qp", "kp", "vp"]
    assert_equivalent(model, gp.to_proto(m), _feeds(model), exact=True)
    assert_equivalent(model, _device(m), _feeds(model), exact=True)


@pytest.mark.parametrize("kvh", [2, 1])
def test_bsh_with_grouped_and_multi_query_heads(kvh):
    model = _bsh(n=4, kv_heads=kvh)
    m, res, _ = _run(model)
    att = _attention_nodes(m)
    assert [n.op for n in att] == ["AttentionBSH"] and att[0].attrs["num_key_value_heads"] == kvh
    assert not {"Expand", "Transpose"} & set(ops(m))
    assert_equivalent(model, gp.to_proto(m), _feeds(model), exact=True)


# ------------------------------------------------------------------------------------------
# not fired, with the reason


def _reasons(ctx):
    return " ".join(e.reason if hasattr(e, "reason") else str(e) for e in ctx.explanations)


@pytest.mark.parametrize("kwargs, target, options, reason", [
    ({"d": 640}, "ascend910b2", {}, "head dim up to 512, not 640"),
    ({}, "ascend910a", {}, "has no PromptFlashAttention"),
    ({}, "ascend910b2", {"precision_mode": "must_keep_origin_dtype"}, "not float32 (float32 under precision mode must_keep_origin_dtype)"),
    ({}, "ascend310p3", {"precision_mode": "allow_fp32_to_bf16"}, "takes float16, not bfloat16"),
    ({"n": 300, "b": 1, "sq": 2, "skv": 2}, "ascend910b2", {}, "up to 256 heads, not 300"),
    ({"softmax_axis": 2}, "ascend910b2", {}, "a Softmax over axis 2"),
    ({"zero": -0.0}, "ascend910b2", {}, "writes another value than +0.0"),
    ({"opset": 14}, "ascend910b2", {}, "needs opset 15+"),
    ({"elem": TensorProto.DOUBLE}, "ascend910b2", {}, "takes float16, bfloat16, not float64"),
])
def test_an_attention_the_target_or_the_body_cannot_take_is_left_with_the_reason(kwargs, target, options, reason):
    model = _sdpa(**kwargs)
    m, res, ctx = _run(model, target=target, **options)
    assert not res.modified and not _attention_nodes(m)
    assert reason in _reasons(ctx), _reasons(ctx)


def test_a_float64_scale_that_float32_does_not_hold_is_refused():
    model = _sdpa(elem=TensorProto.DOUBLE, scale="sdpa", scale_value=0.1)
    m, res, ctx = _run(model, target="none")
    assert not res.modified
    assert "is not a float32 value" in _reasons(ctx)


def test_a_float16_attention_on_310p_fuses_and_a_float32_one_too_under_force_fp16():
    for elem in (TensorProto.FLOAT16, TensorProto.FLOAT):
        m, res, ctx = _run(_sdpa(elem=elem), target="ascend310p3")
        assert res.modified, _reasons(ctx)


def test_k_broadcast_over_the_query_heads_is_left():
    # K with one head, broadcast by the MatMul (no repeat_kv): the op would repeat it (another
    # MatMul operand shape), so it is left
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, {"q": (f, [2, 4, 5, 8]), "k": (f, [2, 1, 5, 8]), "v": (f, [2, 1, 5, 8])},
                       {"y": (f, [2, 4, 5, 8])}, opset=18)
    m, res, ctx = _run(model)
    assert not res.modified
    assert "do not have the query's 4 heads" in _reasons(ctx)


def test_scores_read_elsewhere_keep_the_attention():
    model = _sdpa(mask=None, guard=False)
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4, 5, 5]))
    m, res, _ = _run(model)
    assert not res.modified and not _attention_nodes(m)


def test_a_target_without_hardware_facts_forms_it():
    m, res, _ = _run(_sdpa(), target="none")
    assert res.modified


# ------------------------------------------------------------------------------------------
# cost


def test_the_estimate_prices_the_fused_op_below_the_decomposition():
    model = _bsh(b=1, s=128, n=8, d=64)
    before = gp.estimate(model, target="ascend910b2")
    m, res, _ = _run(model)
    after = gp.estimate(_device(m), target="ascend910b2")
    assert res.modified
    assert after.total_us < before.total_us
    rec = [r for r in after.nodes if r.get("op") == "graphpass.ascend::AttentionBSH"]
    assert rec and rec[0]["engine"] == "AICORE" and rec[0]["cube_us"] > 0 and rec[0]["vector_us"] > 0


def test_the_report_says_why_an_attention_was_left(tmp_path):
    # a head dim of 640 (> PromptFlashAttention's 512) through the whole pipeline: the attention
    # stays decomposed and the report's explanations carry the reason
    model = _sdpa(b=1, n=2, sq=3, skv=3, d=640)
    result = gp.optimize(model, target="ascend910b2")
    assert not any(n.op.startswith("Attention") for n in result.graph.nodes)
    reasons = [e.reason if hasattr(e, "reason") else str(e) for e in result.report.explanations]
    assert any("PromptFlashAttention / IncreFlashAttention on ascend910b2 takes a head dim up to 512, not 640" in r
               for r in reasons), reasons


@pytest.mark.parametrize("spelling", ["torch_sdpa", "hf_eager"])
def test_float16_attentions_that_softmax_in_float32_fuse_bit_for_bit(spelling):
    """torch's SDPA export of a float16 model in TorchScript: the scores upcast after the MatMul,
    V upcast, a float32 result; HF's eager attention: the masked scores upcast for the softmax,
    the probabilities cast back to float16."""
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    b, n, s, d = 2, 4, 5, 8
    inits = {"c": np.array(0.5946, np.float16)}
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    if spelling == "torch_sdpa":
        inits["z"] = np.zeros((1,), np.float32)
        nodes += [helper.make_node("Mul", ["q", "c"], ["qs"]), helper.make_node("Mul", ["kt", "c"], ["kts"]),
                  helper.make_node("MatMul", ["qs", "kts"], ["s16"]), helper.make_node("Cast", ["s16"], ["s32"], to=f),
                  helper.make_node("Add", ["s32", "m"], ["sm"]), helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
                  helper.make_node("IsNaN", ["p"], ["isn"]), helper.make_node("Where", ["isn", "z", "p"], ["pg"]),
                  helper.make_node("Cast", ["v"], ["v32"], to=f), helper.make_node("MatMul", ["pg", "v32"], ["y"])]
        mask, out = (f, [b, 1, s, s]), f
    else:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["s16"]), helper.make_node("Mul", ["s16", "c"], ["sc"]),
                  helper.make_node("Add", ["sc", "m"], ["sm16"]), helper.make_node("Cast", ["sm16"], ["sm"], to=f),
                  helper.make_node("Softmax", ["sm"], ["p32"], axis=-1), helper.make_node("Cast", ["p32"], ["p"], to=h),
                  helper.make_node("MatMul", ["p", "v"], ["y"])]
        mask, out = (h, [b, 1, s, s]), h
    model = make_model(nodes, {"q": (h, [b, n, s, d]), "k": (h, [b, n, s, d]), "v": (h, [b, n, s, d]), "m": mask},
                       {"y": (out, [b, n, s, d])}, initializers=inits, opset=17)
    m, res, ctx = _run(model)
    att = _attention_nodes(m)
    assert [a.op for a in att] == ["Attention"], [str(e) for e in ctx.explanations]
    assert not {"Cast", "Softmax", "MatMul"} & set(ops(m))
    a = att[0].attrs
    want = {"torch_sdpa": (f, f, f), "hf_eager": (h, f, h)}[spelling]
    assert (a["scores_type"], a["softmax_type"], a["output_type"]) == want
    feeds = _feeds(model)
    feeds["m"] = np.where(RNG.random(mask[1]) < 0.3, -np.inf, 0.0).astype(np.float32 if mask[0] == f else np.float16)
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
    assert_equivalent(model, _device(m), feeds, exact=True)


@pytest.mark.parametrize("build", [lambda: _sdpa(), lambda: _sdpa(kv_heads=2, scale="div", mask="add", guard=False),
                                   lambda: _bsh(), lambda: _bsh(kv_heads=2, flat=True)],
                         ids=["sdpa", "gqa-eager", "bsh", "bsh-gqa-flat"])
def test_the_portable_output_is_the_decomposition_not_the_generic_body(build):
    """The portable form (what ATC gets by default) expands each call into the plain ops it stands
    for: no more nodes than the export wrote, no identity slots (Mul by 1, Cast to the same type,
    the absent mask's Add), bit for bit the device form."""
    model = build()
    m, res, _ = _run(model)
    assert res.modified
    portable = gp.to_proto(m)
    kinds = [n.op_type for n in portable.graph.node]
    # the [B*S, H] view of a flattened merge stays after the op's own [B, S, H] merge: one Reshape more
    flat = any("attention_flat" in n.name for n in portable.graph.node)
    assert len(kinds) <= len(model.graph.node) + int(flat), kinds
    assert "CastLike" not in kinds and "Cast" not in kinds
    assert not any(n.domain == "graphpass.ascend" for n in portable.graph.node) and not portable.functions
    feeds = _feeds(model)
    assert_equivalent(model, portable, feeds, exact=True)
    assert_equivalent(_device(m), portable, feeds, exact=True)


def test_attentions_in_a_graph_and_in_its_if_branch_both_reach_the_portable_output():
    """The portable expansion rebuilds each graph's node list: a body inside a node of a graph
    that is rebuilt too must be expanded first (else its edits are lost with the copy)."""
    f = TensorProto.FLOAT
    shape = [1, 2, 3, 4]

    def att(prefix):
        return [helper.make_node("Transpose", ["k"], [f"{prefix}kt"], perm=[0, 1, 3, 2]),
                helper.make_node("MatMul", ["q", f"{prefix}kt"], [f"{prefix}s"]),
                helper.make_node("Softmax", [f"{prefix}s"], [f"{prefix}p"], axis=-1),
                helper.make_node("MatMul", [f"{prefix}p", "v"], [f"{prefix}y"])]

    then = helper.make_graph(att("t_"), "then", [], [helper.make_tensor_value_info("t_y", f, shape)])
    other = helper.make_graph([helper.make_node("Neg", ["v"], ["e_y"])], "else", [],
                              [helper.make_tensor_value_info("e_y", f, shape)])
    nodes = att("m_") + [helper.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other),
                         helper.make_node("Add", ["m_y", "b"], ["y"])]
    model = make_model(nodes, {"q": (f, shape), "k": (f, shape), "v": (f, shape), "c": (TensorProto.BOOL, [])},
                       {"y": (f, shape)}, opset=18)
    m, res, _ = _run(model)
    assert res.stats["fired"] == 2
    portable = gp.to_proto(m)
    assert not any(n.domain == "graphpass.ascend" for g in [portable.graph, portable.graph.node[-2].attribute[0].g]
                   for n in g.node)
    for c in (True, False):
        feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n in "qkv"}
        feeds["c"] = np.array(c)
        assert_equivalent(model, portable, feeds, exact=True)
