"""fuse_attention under attack (hostile review of 4f089af): tiny graphs the exporters can write or a
user can feed, each checked against the pass's EXACT promise, ONNX/onnxruntime validity in the
portable and the device form, the target's limits (cost_model/data/transformer_ops.toml
[ops.Attention]) and the rule that a left attention says why.

The first section holds the findings (each failed on main at 4f089af); the second, attacks the
pass survived that the sibling test file does not cover."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.passes.fusion.fuse_attention import FuseAttention
from graphpass.testing import assert_equivalent, check_full, make_model, ops, ort_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
import _corpus  # noqa: E402  (the real-exporter corpus' manifest and its valid inputs)

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
NP = {F: np.float32, H: np.float16}
RNG = np.random.default_rng(2611)


def _run(model, target="ascend910b2", **cost_options):
    m = gp.load(model)
    ctx = PassContext(target=target, cost_options=cost_options)
    return m, FuseAttention()(m, ctx), ctx


def _reasons(ctx):
    return " ".join(e.reason if hasattr(e, "reason") else str(e) for e in ctx.explanations)


def _attention_nodes(m):
    return [n for n in m.graph.nodes if n.domain == "graphpass.ascend" and n.op.startswith("Attention")]


def _exact_both_forms(model, m, feeds):
    """The portable form (body inlined) and the device form (the op through its function) both
    give the original's outputs bit for bit."""
    assert_equivalent(model, gp.to_proto(m), feeds, exact=True)
    assert_equivalent(model, gp.to_proto(m, emit="device"), feeds, exact=True)


def _rand(shape, elem=F, specials=True):
    x = RNG.standard_normal(shape).astype(NP[elem])
    flat = x.reshape(-1)
    if specials and flat.size >= 8:
        vals = [np.nan, np.inf, -np.inf, -0.0, float(np.finfo(NP[elem]).tiny) / 4]
        flat[2: 2 + len(vals)] = np.array(vals, np.float64).astype(NP[elem])
    return x


def _bnsd(q, k, v, mask=None, axis=-1, opset=18, elem=F, div=2.0):
    """Q, K, V (and an additive mask) of the given shapes: Softmax(Q K^T / c [+ M], axis) V."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Div", ["s0", "c"], ["s1"])]
    inputs = {"q": (elem, q), "k": (elem, k), "v": (elem, v)}
    s = "s1"
    if mask is not None:
        inputs["m"] = (elem, mask)
        nodes.append(helper.make_node("Add", [s, "m"], ["s2"]))
        s = "s2"
    nodes += [helper.make_node("Softmax", [s], ["p"], axis=axis), helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, inputs, {"y": (elem, None)}, initializers={"c": np.array(div, NP[elem])}, opset=opset)
    static = all(isinstance(e, int) for _, shape in inputs.values() for e in shape)
    feeds = {name: _rand(shape, elem) for name, (_, shape) in inputs.items()} if static else None
    return model, feeds


def _bsh(xq, xkv, n, d, merge, split_q=None, split_kv=None, mask=None):
    """Head split of Xq and Xk/Xv (Reshape [B,S,n,d] + Transpose [0,2,1,3]), Softmax(Q K^T [+ M]) V,
    head merge Transpose [0,2,1,3] + Reshape ``merge``: what the dynamo exporter writes."""
    inits = {"sq": np.array(split_q or [*xq[:2], n, d], np.int64),
             "skv": np.array(split_kv or [*xkv[:2], n, d], np.int64), "merge": np.array(merge, np.int64)}
    nodes = []
    for x, tgt in (("q", "sq"), ("k", "skv"), ("v", "skv")):
        nodes += [helper.make_node("Reshape", [f"x{x}", tgt], [f"{x}4"]),
                  helper.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"])]
    inputs = {"xq": (F, xq), "xk": (F, xkv), "xv": (F, xkv)}
    s = "s0"
    if mask is not None:
        inputs["m"] = (F, mask)
        nodes.append(helper.make_node("Add", [s, "m"], ["s1"]))
        s = "s1"
    nodes += [helper.make_node("Softmax", [s], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    model = make_model(nodes, inputs, {"y": (F, merge)}, initializers=inits, opset=18)
    return model, {name: _rand(shape) for name, (_, shape) in inputs.items()}


def _bsh_dynamic(n=2, d=4):
    """Projections + head split [0,0,n,d] + SDPA + head merge [0,0,n*d] over x: ['B', 'S', n*d]."""
    h = n * d
    inits = {"split": np.array([0, 0, n, d], np.int64), "merge": np.array([0, 0, h], np.int64),
             "c": np.array(0.5, np.float32)}
    nodes = []
    for x in "qkv":
        inits[f"w{x}"] = (RNG.standard_normal((h, h)) * 0.3).astype(np.float32)
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}p"]),
                  helper.make_node("Reshape", [f"{x}p", "split"], [f"{x}4"]),
                  helper.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    return make_model(nodes, {"x": (F, ["B", "S", h])}, {"y": (F, ["B", "S", h])}, initializers=inits, opset=18)


def _probs_variant(kind, elem=F):
    """Softmax(Q K^T / 2) V with the probabilities written another way: ``output`` (P is also a
    graph output: HF's output_attentions), ``not_isnan`` (the guard as Where(Not(IsNaN(P)), P, 0)),
    ``float32_softmax`` (HF eager in float16: Cast to float32, Softmax, Cast back)."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Div", ["s0", "c"], ["s1"])]
    inits = {"c": np.array(2.0, NP[elem])}
    outputs = {"y": (elem, [2, 4, 5, 8])}
    if kind == "float32_softmax":
        nodes += [helper.make_node("Cast", ["s1"], ["s1f"], to=F), helper.make_node("Softmax", ["s1f"], ["pf"], axis=-1),
                  helper.make_node("Cast", ["pf"], ["p"], to=elem)]
    else:
        nodes.append(helper.make_node("Softmax", ["s1"], ["p"], axis=-1))
    pv = "p"
    if kind == "not_isnan":
        inits["z"] = np.zeros((1,), NP[elem])
        nodes += [helper.make_node("IsNaN", ["p"], ["isn"]), helper.make_node("Not", ["isn"], ["keep"]),
                  helper.make_node("Where", ["keep", "p", "z"], ["pg"])]
        pv = "pg"
    if kind == "output":
        outputs["p"] = (elem, [2, 4, 5, 5])
    nodes.append(helper.make_node("MatMul", [pv, "v"], ["y"]))
    return make_model(nodes, {x: (elem, [2, 4, 5, 8]) for x in "qkv"}, outputs, initializers=inits, opset=18)


# ==========================================================================================
# findings: each of these failed on main (4f089af)


def test_softmax_axis_3_is_not_the_last_axis_once_a_mask_raises_the_scores_rank():
    # breaks (a): axis=3 is accepted as "the last axis" from Q's rank, but a rank-5 mask makes the
    # scores rank 5; the body's Softmax(axis=-1) normalizes another axis: all 48 values differ
    model, feeds = _bnsd([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], mask=[2, 1, 2, 3, 3], axis=3)
    m, res, ctx = _run(model)
    _exact_both_forms(model, m, feeds)


@pytest.mark.parametrize("case", ["kv_batch", "mask_batch", "mask_query_length"])
def test_bsh_head_merge_keeps_the_output_shape_when_k_v_or_the_mask_broadcast(case):
    # breaks (a): AttentionBSH's body merges the heads to [Q's B, Q's S, -1]; the export merges
    # the MatMul's output, whose B (K/V or mask batch 2 over Q's 1) or Sq (a mask [1,1,3,3] over
    # a one-token query) broadcasting made larger: y becomes [1,3,16] / [1,1,24] instead of
    # [2,3,8] / [1,3,8]
    if case == "kv_batch":  # cross-attention whose memory has batch 2, queries batch 1
        model, feeds = _bsh([1, 3, 8], [2, 3, 8], 2, 4, merge=[2, 3, 8])
    elif case == "mask_batch":
        model, feeds = _bsh([1, 3, 8], [1, 3, 8], 2, 4, merge=[2, 3, 8], mask=[2, 1, 3, 3])
    else:
        model, feeds = _bsh([1, 1, 8], [1, 3, 8], 2, 4, merge=[1, 3, 8], mask=[1, 1, 3, 3])
    m, res, ctx = _run(model)
    _exact_both_forms(model, m, feeds)


@pytest.mark.parametrize("shape", [[2, 0, 8], [0, 3, 8]])
def test_bsh_with_an_empty_sequence_or_batch_still_runs(shape):
    # breaks (b): the body's head split Reshape(x, [B, S, heads, -1]) (and the merge's [B, S, -1])
    # cannot infer -1 from 0 elements: onnxruntime fails ("size != 0"), where the export's
    # [0, 0, heads, d] runs; the CLI's --verify (random non-empty inputs) does not see it
    model = _bsh_dynamic()
    m, res, ctx = _run(model)
    assert res.modified  # the dynamic-shape BSH attention is fused ...
    _exact_both_forms(model, m, {"x": np.zeros(shape, np.float32)})  # ... and must run on every shape


@pytest.mark.parametrize("static", [False, True])
def test_bnsd_with_an_empty_key_sequence_still_runs(static):
    # breaks (b): the body's repeat_kv Reshape(Expand(...), [B, N, Skv, D]) has allowzero=0, so
    # Skv=0 copies the 5-D input's dim 2 (rep=1): dynamic shapes fail at run time ("Input shape:
    # {1,2,1,0,4}, requested shape:{1,2,1,4}"), static ones with a mask at load ("[ShapeInferenceError]
    # Incompatible dimensions for matrix multiplication"); also with N == Nkv, where the export
    # has no repeat_kv at all
    if static:
        model, _ = _bnsd([1, 2, 3, 4], [1, 2, 0, 4], [1, 2, 0, 4], mask=[1, 1, 3, 0])
    else:
        model, _ = _bnsd([1, 2, "S", 4], [1, 2, "T", 4], [1, 2, "T", 4])
    feeds = {"q": _rand([1, 2, 3, 4]), "k": np.zeros([1, 2, 0, 4], np.float32), "v": np.zeros([1, 2, 0, 4], np.float32)}
    if static:
        feeds["m"] = np.zeros([1, 1, 3, 0], np.float32)
    ort_run(model, feeds)  # the export runs: y is [1, 2, 3, 4] of zeros
    m, res, ctx = _run(model)
    _exact_both_forms(model, m, feeds)


def test_a_value_head_dim_over_the_kernel_limit_is_refused():
    # breaks (d): only Q's head dim is checked against head_dim_max = 512; V's D (1024, and != Q's 8)
    # is never looked at, so PromptFlashAttention is asked for Dv = 1024 (and the cost model
    # prices it with dv = d)
    model, feeds = _bnsd([1, 2, 3, 8], [1, 2, 3, 8], [1, 2, 3, 1024])
    m, res, ctx = _run(model)
    assert not _attention_nodes(m), "fused an attention whose value head dim exceeds the kernel's 512"
    assert _reasons(ctx)


@pytest.mark.parametrize("qb, kvb", [(1, 2), (2, 1)])
def test_a_batch_broadcast_between_query_and_key_value_is_refused(qb, kvb):
    # breaks (d): K/V broadcast over the query heads is refused ("the MatMuls broadcast them"), but
    # a batch broadcast (Q batch 1, K/V batch 2, or the reverse) is fused: the kernel has one B
    model, feeds = _bnsd([qb, 2, 3, 8], [kvb, 2, 3, 8], [kvb, 2, 3, 8])
    m, res, ctx = _run(model)
    assert not _attention_nodes(m), "fused an attention whose Q and K/V batches differ (MatMul broadcast)"
    assert _reasons(ctx)


@pytest.mark.parametrize("q, mask", [
    ([1, 2, 3, 8], [2, 1, 2, 3, 3]),  # a rank-5 mask: scores, P and Y become rank 5
    ([1, 1, 3, 8], [1, 4, 3, 3]),     # a 4-head mask over a 1-head query: Y gets 4 heads, num_heads says 1
])
def test_a_mask_that_raises_the_scores_shape_is_refused(q, mask):
    # breaks (d): the mask is any Add operand; one that broadcasts the scores to a larger shape
    # makes the "attention" output a shape PromptFlashAttention cannot produce ([B,N,Sq,D] of Q)
    model, feeds = _bnsd(q, q, q, mask=mask)
    m, res, ctx = _run(model)
    assert not _attention_nodes(m), "fused an attention whose mask broadcasts the scores beyond Q K^T's shape"
    assert _reasons(ctx)


def test_guarded_probabilities_that_are_a_graph_output_keep_the_attention():
    # breaks (d): unguarded, P as a graph output leaves the attention (the sibling file's
    # test_scores_read_elsewhere_keep_the_attention); with torch's NaN guard the check is
    # len(P.outputs) == 2, which ignores graph outputs: it fuses and keeps Q K^T, the mask and the
    # Softmax for P, so the device computes the scores and the softmax twice
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Div", ["s0", "c"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["isn"]), helper.make_node("Where", ["isn", "z", "p"], ["pg"]),
             helper.make_node("MatMul", ["pg", "v"], ["y"])]
    model = make_model(nodes, {x: (F, [2, 4, 5, 8]) for x in "qkv"}, {"y": (F, [2, 4, 5, 8]), "p": (F, [2, 4, 5, 5])},
                       initializers={"c": np.array(2.0, np.float32), "z": np.zeros((1,), np.float32)}, opset=18)
    m, res, ctx = _run(model)
    assert not res.modified and not _attention_nodes(m), ops(m)


@pytest.mark.parametrize("kind, elem", [("output", F), ("not_isnan", F), ("float32_softmax", H)])
def test_an_attention_left_says_why(kind, elem):
    # breaks (e): each is Softmax(Q K^T / c) V that the pass leaves with no entry in
    # ctx.explanations (match returns None): P also a graph output (output_attentions), torch's
    # guard spelled Where(Not(IsNaN(P)), P, 0), HF eager's float32 softmax of a float16 model
    model = _probs_variant(kind, elem)
    m, res, ctx = _run(model)
    if _attention_nodes(m):  # fusing it is fine when bit for bit
        feeds = {x: _rand([2, 4, 5, 8], elem) for x in "qkv"}
        _exact_both_forms(model, m, feeds)
    else:
        assert _reasons(ctx), f"the {kind} attention was left without a reason"


# ==========================================================================================
# attacks the pass survived (coverage the sibling file lacks)


@pytest.mark.parametrize("opset", [15, 16, 17, 19, 20, 21, 22, 23, 24])
def test_every_opset_from_15_fuses_bit_for_bit(opset):
    model, feeds = _bnsd([2, 2, 3, 8], [2, 2, 4, 8], [2, 2, 4, 8], mask=[2, 1, 3, 4], opset=opset)
    m, res, ctx = _run(model)
    assert [n.op for n in _attention_nodes(m)] == ["Attention"], _reasons(ctx)
    check_full(gp.to_proto(m, emit="device"))
    _exact_both_forms(model, m, feeds)


@pytest.mark.parametrize("shape", [[2, 3, 8], [2, 1, 8]])
def test_bsh_with_symbolic_batch_and_sequence_is_exact_on_nonempty_shapes(shape):
    model = _bsh_dynamic()
    m, res, ctx = _run(model)
    assert [n.op for n in _attention_nodes(m)] == ["AttentionBSH"]
    _exact_both_forms(model, m, {"x": _rand(shape)})


@pytest.mark.parametrize("b, s", [(2, 0), (0, 3)])
def test_bnsd_with_an_empty_query_sequence_or_batch_runs(b, s):
    model, _ = _bnsd(["B", 2, "S", 4], ["B", 2, "T", 4], ["B", 2, "T", 4], mask=["B", 1, "S", "T"])
    feeds = {"q": _rand([b, 2, s, 4]), "k": _rand([b, 2, 5, 4]), "v": _rand([b, 2, 5, 4]), "m": _rand([b, 1, s, 5])}
    m, res, ctx = _run(model)
    assert res.modified
    _exact_both_forms(model, m, feeds)


def test_an_all_masked_row_and_nan_in_the_mask_stay_nan_without_the_guard():
    # no guard: a fully -inf row is NaN in the export and must stay NaN; a NaN mask entry too
    model, feeds = _bnsd([1, 2, 3, 8], [1, 2, 4, 8], [1, 2, 4, 8], mask=[1, 1, 3, 4])
    feeds["m"][0, 0, 0, :] = -np.inf
    feeds["m"][0, 0, 1, 2] = np.nan
    ref = ort_run(model, feeds)["y"]
    assert np.isnan(ref[0, :, 0]).all() and np.isnan(ref[0, 0, 1]).all()  # the attack reaches the output
    m, res, ctx = _run(model)
    assert res.modified
    _exact_both_forms(model, m, feeds)


def test_the_mask_as_first_add_operand_and_a_rank_4_ones_scale_fuse_exactly():
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("Mul", ["s", "q"], ["qs"]),  # the constant first
             helper.make_node("MatMul", ["qs", "kt"], ["s0"]),
             helper.make_node("Add", ["m", "s0"], ["s1"]),  # the mask first
             helper.make_node("Softmax", ["s1"], ["p"], axis=3),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, {"q": (F, [2, 2, 3, 8]), "k": (F, [2, 2, 3, 8]), "v": (F, [2, 2, 3, 8]), "m": (F, [3, 3])},
                       {"y": (F, [2, 2, 3, 8])}, initializers={"s": np.full((1, 1, 1, 1), 0.375, np.float32)}, opset=18)
    m, res, ctx = _run(model)
    att = _attention_nodes(m)
    assert len(att) == 1 and att[0].attrs["scale_q"] == 0.375 and att[0].attrs["mask_kind"] == "additive"
    _exact_both_forms(model, m, {x: _rand(s) for x, s in (("q", [2, 2, 3, 8]), ("k", [2, 2, 3, 8]),
                                                           ("v", [2, 2, 3, 8]), ("m", [3, 3]))})


def test_a_per_head_scale_stays_outside_and_q_shared_with_k_fuses_exactly():
    # a [1, N, 1, 1] scale on Q is not one element: it stays a Mul before the op; K is Q itself
    nodes = [helper.make_node("Mul", ["x", "s"], ["qs"]),
             helper.make_node("Transpose", ["x"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["s0"]),
             helper.make_node("Softmax", ["s0"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = make_model(nodes, {"x": (F, [2, 2, 3, 8]), "v": (F, [2, 2, 3, 8])}, {"y": (F, [2, 2, 3, 8])},
                       initializers={"s": np.array([0.5, 0.25], np.float32).reshape(1, 2, 1, 1)}, opset=18)
    m, res, ctx = _run(model)
    att = _attention_nodes(m)
    assert len(att) == 1 and "Mul" in ops(m) and att[0].attrs["scale_q"] == 1.0
    _exact_both_forms(model, m, {"x": _rand([2, 2, 3, 8]), "v": _rand([2, 2, 3, 8])})


def _in_if(inner):
    """``inner``'s graph as the then-branch of an If reading the outer inputs (else: Identity)."""
    body, out = inner.graph, inner.graph.output[0]
    et = out.type.tensor_type.elem_type
    shp = [d.dim_value for d in out.type.tensor_type.shape.dim]
    then = helper.make_graph(list(body.node), "then", [], [helper.make_tensor_value_info(out.name, et, shp)],
                             initializer=list(body.initializer))
    other = helper.make_graph([helper.make_node("Identity", [body.input[0].name], ["y_else"])], "else", [],
                              [helper.make_tensor_value_info("y_else", et, shp)])
    g = helper.make_graph([helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=other)], "g",
                          list(body.input) + [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("out", et, shp)])
    model = helper.make_model(g, opset_imports=list(inner.opset_import))
    model.ir_version = inner.ir_version
    return model


def test_an_attention_inside_an_if_branch_fuses_exactly():
    inner, feeds = _bnsd([2, 2, 3, 8], [2, 2, 3, 8], [2, 2, 3, 8], mask=[2, 1, 3, 3])
    inner.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, [2, 2, 3, 8]))
    model = _in_if(inner)
    onnx.checker.check_model(model, full_check=True)
    m, res, ctx = _run(model)
    assert res.modified
    branch = m.graph.nodes[0].attrs["then_branch"]
    assert [n.op for n in branch.nodes if n.domain == "graphpass.ascend"] == ["Attention"]
    _exact_both_forms(model, m, {**feeds, "cond": np.array(True)})


def test_an_attention_inside_a_loop_body_reading_the_carried_state_fuses_exactly():
    sh = [2, 2, 3, 8]
    nodes = [helper.make_node("Add", ["acc", "q"], ["qq"]),  # Q mixes the loop-carried value
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qq", "kt"], ["s0"]), helper.make_node("Div", ["s0", "c"], ["s1"]),
             helper.make_node("Add", ["s1", "m"], ["s2"]), helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"]),
             helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Identity", ["y"], ["acc_out"])]
    body = helper.make_graph(
        nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                        helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("acc", F, sh)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, sh)],
        initializer=[onnx.numpy_helper.from_array(np.array(2.0, np.float32), "c")])
    g = helper.make_graph([helper.make_node("Loop", ["trip", "", "acc0"], ["out"], body=body)], "g",
                          [helper.make_tensor_value_info(x, F, sh) for x in ("q", "k", "v", "acc0")]
                          + [helper.make_tensor_value_info("m", F, [2, 1, 3, 3]),
                             helper.make_tensor_value_info("trip", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("out", F, sh)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    m, res, ctx = _run(model)
    assert [n.op for n in m.graph.nodes[0].attrs["body"].nodes if n.domain == "graphpass.ascend"] == ["Attention"]
    feeds = {x: _rand(sh) for x in ("q", "k", "v", "acc0")}
    feeds.update(m=_rand([2, 1, 3, 3]), trip=np.array(3, np.int64))
    _exact_both_forms(model, m, feeds)


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
@pytest.mark.parametrize("flat", [False, True])
def test_float16_bsh_with_grouped_heads_and_special_values_is_exact(kv_heads, flat):
    n, d, b, s = 4, 8, 2, 6
    h, kvh = n * d, kv_heads or n
    inits = {f"w{x}": (RNG.standard_normal((h, (n if x == "q" else kvh) * d)) * 0.3).astype(np.float16) for x in "qkv"}
    inits.update(sq=np.array([b, s, n, d], np.int64), skv=np.array([0, 0, kvh, d], np.int64),
                 merge=np.array([-1, h] if flat else [b, s, h], np.int64), c=np.array(0.5, np.float16))
    nodes = []
    for x in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}p"]),
                  helper.make_node("Reshape", [f"{x}p", "sq" if x == "q" else "skv"], [f"{x}4"]),
                  helper.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    k, v = "kh", "vh"
    if kv_heads:  # HF's repeat_kv
        inits.update(ax2=np.array([2], np.int64), e5=np.array([b, kvh, n // kvh, s, d], np.int64),
                     r4=np.array([b, n, s, d], np.int64))
        for x in ("kh", "vh"):
            nodes += [helper.make_node("Unsqueeze", [x, "ax2"], [f"{x}_u"]),
                      helper.make_node("Expand", [f"{x}_u", "e5"], [f"{x}_e"]),
                      helper.make_node("Reshape", [f"{x}_e", "r4"], [f"{x}_r"])]
        k, v = "kh_r", "vh_r"
    nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "c"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", v], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    model = make_model(nodes, {"x": (H, [b, s, h])}, {"y": (H, [b * s, h] if flat else [b, s, h])},
                       initializers=inits, opset=18)
    m, res, ctx = _run(model, target="ascend310p3")
    att = _attention_nodes(m)
    assert [a.op for a in att] == ["AttentionBSH"] and att[0].attrs["num_key_value_heads"] == kvh, _reasons(ctx)
    _exact_both_forms(model, m, {"x": _rand([b, s, h], H)})


# ------------------------------------------------------------------------------------------
# the real-exporter corpus with extreme inputs: the pass alone, on the pipeline's output without it

_TRANSFORMERS = [e for e in _corpus.exported() if e["model"] in ("bert", "gpt2", "vit", "whisper", "llama", "llama_static")]


@pytest.mark.parametrize("entry", _TRANSFORMERS, ids=lambda e: e["file"])
def test_corpus_attentions_stay_exact_on_nan_inf_and_all_masked_rows(entry):
    before = gp.to_proto(gp.optimize(str(_corpus.DATA / entry["file"]), target="ascend910b2",
                                     disable=["fuse_attention"]).model)
    m = gp.load(before)
    res = FuseAttention()(m, PassContext(target="ascend910b2"))
    if entry["file"] != "llama_static.dynamo.onnx":  # (its attention is fused earlier in the pipeline only)
        assert res.modified and _attention_nodes(m)
    feeds = _corpus.feeds_for(entry)
    for name, x in feeds.items():
        if x.dtype.kind == "f":
            x.reshape(-1)[:7] = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38, -3e38]
        elif name == "attention_mask":
            x[0, :] = 0  # a fully masked sequence: every row -inf (or finfo.min)
            x[1, ::2] = 0
    _exact_both_forms(before, m, feeds)


@pytest.mark.parametrize("b, s, t", [(2, 3, 5), (1, 1, 7)])
def test_repeat_kv_with_shape_built_expand_targets_over_symbolic_dims_fuses_exactly(b, s, t):
    # HF's repeat_kv as the dynamo exporter writes it for symbolic B/S: the Expand and Reshape
    # targets are Concats of Shape slices of K/V itself
    n, kvh, d = 4, 2, 8
    inits = {"ax2": np.array([2], np.int64), "rep": np.array([n // kvh], np.int64), "nh": np.array([n], np.int64),
             "c": np.array(0.25, np.float32)}
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
              helper.make_node("Add", ["s1", "m"], ["s2"]), helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v_r"], ["y"])]
    model = make_model(nodes, {"q": (F, ["B", n, "S", d]), "k": (F, ["B", kvh, "T", d]), "v": (F, ["B", kvh, "T", d]),
                               "m": (F, ["B", 1, "S", "T"])}, {"y": (F, ["B", n, "S", d])}, initializers=inits, opset=18)
    m, res, ctx = _run(model)
    att = _attention_nodes(m)
    assert len(att) == 1 and att[0].attrs["num_key_value_heads"] == kvh and "Expand" not in ops(m), _reasons(ctx)
    feeds = {"q": _rand([b, n, s, d]), "k": _rand([b, kvh, t, d]), "v": _rand([b, kvh, t, d]), "m": _rand([b, 1, s, t])}
    _exact_both_forms(model, m, feeds)
