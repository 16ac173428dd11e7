"""Scaled dot-product attention, as exporters write it, becomes one ``graphpass.ascend::Attention``
(layout BNSD) or ``AttentionBSH`` device op: CANN's PromptFlashAttention (IncreFlashAttention for
a one-token query).

    S  = MatMul(Q [* cq], K^T [* ck])        K^T: Transpose(K, [0,1,3,2]); Transpose(K', [0,2,3,1])
                                              of K' = [B,S,N,D]; torch's dynamo spelling
                                              Reshape(Transpose(Reshape(K, [-1,S,D]), [0,2,1]), [B,N,D,S])
    S' = S [* c | / c]  [+ Mask]
    P  = Softmax(S', axis=-1)  [then Where(IsNaN(P), 0, P): torch's guard of a fully masked row]
    Y  = MatMul(P, V)
        =>  Attention(Q, K, V, Mask)          K, V before HF's repeat_kv (grouped/multi-query)
    and when Q, K, V come from the head split Transpose(Reshape(X, [B,S,heads,D]), [0,2,1,3]) and
    Y goes only to the head merge Reshape(Transpose(Y, [0,2,1,3]), [B,S,H]):
        =>  AttentionBSH(Xq, Xk, Xv, Mask)    the splits and the merge inside the op

Exact: the body (graphpass/ir/device_ops_attention.py) computes the export's ops in the export's
order; a scale slot the export does not use is 1.0 (``x * 1`` is ``x``), an absent mask the
constant -0.0 (``x + -0.0`` is ``x``). A scale constant Q's type holds but float32 does not (a
float64 constant) refuses the fusion, as does anything the body would not reproduce: a scale
that is not one constant element, a Softmax over another axis, a guard that writes another
value than +0.0, a head dim or head count that is not static. The target decides the rest
(cost_model/data/transformer_ops.toml: the SoC has the kernel, the dtype the precision mode
gives a float32 graph, D <= 512, N <= 256, N a multiple of the KV heads); the report says why
an attention was left.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphpass.cost_model.transformer_ops import attention_refusal
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function
from graphpass.ir.device_ops_attention import MIN_OPSET, OPS, SCALE_SLOTS, attention_function
from graphpass.passes.framework import MatchResult, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, apply_rules
from graphpass.passes.fusion._match import dtype_name, np_dtype

__all__ = ["FuseAttention"]

_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _std(n: gs.Node | None, op: str) -> bool:
    return n is not None and n.op == op and n.domain in (None, "", "ai.onnx")


def _writer(t: gs.Tensor, scope: Scope, op: str) -> gs.Node | None:
    p = t.inputs[0] if len(t.inputs) == 1 else None
    return p if _std(p, op) and id(p) in scope.local else None


def _perm_is(node: gs.Node, perm: list[int]) -> bool:
    """``node`` (a Transpose) permutes by ``perm``."""
    return [int(p) for p in node.attrs.get("perm", [])] == perm


def _only_reader(t: gs.Tensor, scope: Scope) -> bool:
    return scope.single_reader(t)


def _feeds_only(t: gs.Tensor, scope: Scope) -> bool:
    """t is read by one node besides Shape nodes (the dynamo exporter reads the K and V it
    repeats, and the heads it splits, for the shape vectors of later Reshapes): the fused op
    takes the values before; what still reads t keeps its producer until eliminate_dead_nodes
    finds the Shape unread."""
    return not scope.is_output(t) and sum(1 for c in t.outputs if c.op != "Shape") == 1


def _scalar(t: gs.Tensor, like: gs.Tensor) -> float | None:
    """The value of a one-element constant of ``like``'s type that does not raise ``like``'s rank."""
    if not isinstance(t, gs.Constant):
        return None
    v = np.asarray(t.values)
    if v.size != 1 or elem_type(t.dtype) != elem_type(like.dtype):
        return None
    if v.ndim and (like.shape is None or v.ndim > len(like.shape)):
        return None
    return float(v.ravel()[0])


def _scaled(t: gs.Tensor, scope: Scope) -> tuple[gs.Tensor, float, list[gs.Node]]:
    """t = x * c (c a scalar constant, either order) read only here: (x, c, [Mul]); else (t, 1.0, [])."""
    mul = _writer(t, scope, "Mul")
    if mul is not None and len(mul.inputs) == 2 and _only_reader(t, scope):
        for x, c in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            v = _scalar(c, x)
            if v is not None and not isinstance(x, gs.Constant):
                return x, v, [mul]
    return t, 1.0, []


def _int(e) -> int | None:
    return int(e) if isinstance(e, (int, np.integer)) and not isinstance(e, bool) else None


@dataclasses.dataclass
class _Core:
    q: gs.Tensor
    k: gs.Tensor  # [B, Nkv, Skv, D] (before repeat_kv), or [B, Skv, Nkv, D] when k_bsnd
    v: gs.Tensor
    mask: gs.Tensor | None
    scales: dict[str, float]
    nan_to_zero: bool
    nodes: list[gs.Node]
    k_bsnd: bool = False  # K^T was Transpose(K', [0,2,3,1]): the op reads Transpose(K', [0,2,1,3])
    kv_heads: int | None = None  # the heads K and V have (repeat_kv absorbed), None: as Q
    mask_kind: str = "none"
    why_not: str = ""
    scores_type: int | None = None  # TensorProto type of the scores (after an upcast of the MatMul's)
    softmax_type: int | None = None  # TensorProto type of the softmax (after an upcast of the masked scores)
    output_type: int | None = None  # TensorProto type of the second MatMul


#: graphpass device ops through which this pass takes a dim of the output as the first input's
#: (the shape analysis follows the norms and GELU itself, and the rotary embedding only as a
#: broadcast it cannot resolve on symbolic cos/sin; the rotary's cos/sin and AddRmsNorm's operands
#: have the input's dims in every export: the bodies read the dims as they run, so this only
#: decides what the pattern is, never a value)
_KEEP_SHAPE = frozenset({"RotaryEmbedding", "RotaryEmbeddingInterleaved", "AddRmsNorm"})


class _Shapes:
    """simplify_shapes' analysis of the graph, built on the first question (one walk per run)."""

    def __init__(self, root: gs.Graph):
        self.root = root
        self._sa = None
        self._inputs: set[int] | None = None

    @property
    def sa(self):
        if self._sa is None:
            from graphpass.passes.cleanup._shape_analysis import ShapeAnalysis

            self._sa = ShapeAnalysis(self.root)
        return self._sa

    def dims(self, t: gs.Tensor) -> list | None:
        try:
            return self.sa.dims(t)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError, RecursionError):
            return None

    def same(self, a, b) -> bool:
        """Two dims (ints or Dims) are one: equal, or dims of two graph inputs that the model
        declares with one dim_param name (the ONNX IR's meaning of a shared name)."""
        if a is None or b is None:
            return False
        a, b = self._through_device_ops(a), self._through_device_ops(b)
        if a == b:
            return True
        if self._inputs is None:
            self._inputs = {id(t) for t in self.root.inputs}
        names = []
        for e in (a, b):
            t = getattr(e, "tensor", None)
            if t is None or id(t) not in self._inputs or t.shape is None or e.axis >= len(t.shape):
                return False
            names.append(t.shape[e.axis])
        return isinstance(names[0], str) and bool(names[0]) and names[0] == names[1]

    def _through_device_ops(self, e):
        """A Dim of a device op's output that keeps its first input's shape (the analysis stops
        at graphpass's own ops): that input's dim."""
        for _ in range(8):
            t = getattr(e, "tensor", None)
            p = t.inputs[0] if t is not None and len(t.inputs) == 1 else None
            if p is None or p.domain != DOMAIN or p.op not in _KEEP_SHAPE or not p.inputs or (
                    p.outputs[0] is not t and p.op != "AddRmsNorm"):  # both of AddRmsNorm's outputs have X1's shape
                return e
            try:
                e = self.sa.dim(p.inputs[0], e.axis)
            except (TypeError, ValueError, IndexError, KeyError, OverflowError, RecursionError):
                return e
        return e

    def target(self, t: gs.Tensor) -> list | None:
        """The elements of a shape operand (int or the Dim it equals), or None."""
        v = self.sa.value(t)
        return None if v is None or v.scalar else list(v.elems)


#: an entry of :func:`_reshape_is`'s ``want`` that only the target's -1 may give
_FREE = object()


def _reshape_is(shapes: _Shapes, node: gs.Node, want: list) -> bool:
    """``node`` (a Reshape) gives ``want`` (ints or Dims, one per output axis): each target entry
    is that value, a 0 copying it (allowzero 0) from the input's same axis, or the one -1 (the
    element count fixes it once the other entries are proven)."""
    if len(node.inputs) != 2:
        return False
    tgt = shapes.target(node.inputs[1])
    src = shapes.dims(node.inputs[0])
    if tgt is None or len(tgt) != len(want):
        return False
    allowzero = int(node.attrs.get("allowzero", 0))
    minus = 0
    for i, (e, w) in enumerate(zip(tgt, want)):
        if e == -1:
            minus += 1
            continue
        if w is None or w is _FREE:
            return False
        if e == 0 and not allowzero:
            if src is None or i >= len(src) or not shapes.same(src[i], w):
                return False
            continue
        if not shapes.same(e, w):
            return False
    return minus <= 1


def _k_transposed(kt: gs.Tensor, scope: Scope, shapes: _Shapes) -> tuple[gs.Tensor, bool, list[gs.Node], int | None] | None:
    """kt = K with its last two axes swapped: (K, K is [B,S,N,D], nodes, the KV heads when
    repeat_kv was taken in too: K is then the tensor before it)."""
    tr = _writer(kt, scope, "Transpose")
    if tr is not None and _only_reader(kt, scope):
        perm = [int(p) for p in tr.attrs.get("perm", [])]
        if perm == [0, 1, 3, 2]:
            return tr.inputs[0], False, [tr], None
        if perm == [0, 2, 3, 1]:
            return tr.inputs[0], True, [tr], None
        return None
    # Reshape(Transpose(Reshape(K, [-1, S, D]), [0, 2, 1]), [B, N, D, S])
    r2 = _writer(kt, scope, "Reshape")
    if r2 is None or not _only_reader(kt, scope):
        return None
    mid = r2.inputs[0]
    t3 = _writer(mid, scope, "Transpose")
    if t3 is None or not _only_reader(mid, scope) or not _perm_is(t3, [0, 2, 1]):
        return None
    flat = t3.inputs[0]
    r1 = _writer(flat, scope, "Reshape")
    if r1 is None or not _only_reader(flat, scope):
        return None
    k = r1.inputs[0]
    kd = shapes.dims(k)
    if kd is not None and len(kd) == 5:
        # merge_reshapes joined repeat_kv's Reshape into this one: K is [B, Nkv, rep, S, D]
        got = _expand_kv(k, scope, shapes)
        if got is None or _int(kd[1]) is None or _int(kd[2]) is None:
            return None
        x, nkv, rep, kv_nodes = got
        lead = [_int(e) for e in kd[:3]]
        bn = math.prod(lead) if None not in lead else _FREE  # B*Nkv*rep written out (static shapes) or -1
        if not _reshape_is(shapes, r1, [bn, kd[3], kd[4]]):
            return None
        if not _reshape_is(shapes, r2, [kd[0], nkv * rep, kd[4], kd[3]]):
            return None
        return x, False, kv_nodes + [r1, t3, r2], nkv
    if kd is None or len(kd) != 4:
        return None
    bn = kd[0] * kd[1] if _int(kd[0]) is not None and _int(kd[1]) is not None else _FREE
    if not _reshape_is(shapes, r1, [bn, kd[2], kd[3]]):
        return None
    if not _reshape_is(shapes, r2, [kd[0], kd[1], kd[3], kd[2]]):
        return None
    return k, False, [r1, t3, r2], None


def _expand_kv(e: gs.Tensor, scope: Scope, shapes: _Shapes) -> tuple[gs.Tensor, int, int, list[gs.Node]] | None:
    """e = Expand(Unsqueeze(X, 2), [B, Nkv, rep, S, D]) read only by one node (HF's repeat_kv
    before its Reshape): (X, Nkv, rep, nodes)."""
    ex = _writer(e, scope, "Expand")
    if ex is None or not _only_reader(e, scope) or len(ex.inputs) != 2:
        return None
    u = ex.inputs[0]
    un = _writer(u, scope, "Unsqueeze")
    if un is None or not _only_reader(u, scope):
        return None
    axes = un.attrs.get("axes")
    if axes is None and len(un.inputs) > 1 and isinstance(un.inputs[1], gs.Constant):
        axes = [int(a) for a in np.asarray(un.inputs[1].values).ravel()]
    if axes is None or [int(a) for a in axes] != [2]:
        return None
    x = un.inputs[0]
    xd = shapes.dims(x)
    tgt = shapes.target(ex.inputs[1])
    if xd is None or len(xd) != 4 or tgt is None or len(tgt) != 5:
        return None
    if _int(xd[1]) is None and _int(xd[3]) is not None:  # heads from the head split's -1
        xd = [xd[0], _split_heads_of(x, scope, shapes, _int(xd[3])), xd[2], xd[3]]
    nkv, rep = _int(xd[1]), _int(tgt[2])
    if nkv is None or nkv <= 0 or rep is None or rep <= 0:
        return None
    # the new axis (1 in X') becomes rep; every other entry keeps X's dim (itself or 1)
    for e_, d in zip(tgt[:2] + tgt[3:], xd):
        if not (shapes.same(e_, d) or _int(e_) == 1):
            return None
    return x, nkv, rep, [un, ex]


def _repeat_kv(t: gs.Tensor, scope: Scope, shapes: _Shapes, heads: int) -> tuple[gs.Tensor, int, list[gs.Node]] | None:
    """t = Reshape(Expand(Unsqueeze(X, 2), [B, Nkv, rep, S, D]), [B, Nkv*rep, S, D]) (HF's
    repeat_kv), read only here: (X, Nkv, nodes)."""
    rs = _writer(t, scope, "Reshape")
    if rs is None or not _feeds_only(t, scope):
        return None
    got = _expand_kv(rs.inputs[0], scope, shapes)
    if got is None:
        return None
    x, nkv, rep, nodes = got
    xd = shapes.dims(x)
    if nkv * rep != heads or not _reshape_is(shapes, rs, [xd[0], heads, xd[2], xd[3]]):
        return None
    return x, nkv, nodes + [rs]


def _left(mm2: gs.Node, why: str) -> _Core:
    """An attention recognized (a Softmax feeding MatMul(P, V)) that the pass leaves, and why."""
    return _Core(mm2.inputs[0], None, mm2.inputs[1], None, dict.fromkeys(SCALE_SLOTS, 1.0), False, [mm2], why_not=why)


def _probabilities(p_t: gs.Tensor, scope: Scope):
    """P as MatMul(P, V) reads it: (the Softmax node, the guard's nodes), a reason when a softmax
    is there but written otherwise, or None when P is no softmax at all. The guard: torch's
    ``Where(IsNaN(P), 0, P)`` or ``Where(Not(IsNaN(P)), P, 0)``."""
    guard: list[gs.Node] = []
    down = _writer(p_t, scope, "Cast")  # HF eager in float16: softmax(dtype=float32).to(float16)
    if down is not None:
        if not _only_reader(down.inputs[0], scope):
            return "the probabilities are read elsewhere too (a graph output: output_attentions)"
        guard.append(down)
        p_t = down.inputs[0]
    p_sm = p_t
    where = _writer(p_t, scope, "Where")
    if where is not None and len(where.inputs) == 3:
        cond, a, b = where.inputs
        neg = _writer(cond, scope, "Not")
        test = neg.inputs[0] if neg is not None else cond
        isnan = _writer(test, scope, "IsNaN")
        if isnan is None:
            return None
        p_sm, zero = (b, a) if neg is None else (a, b)
        if isnan.inputs[0] is not p_sm:
            return None
        if _writer(p_sm, scope, "Softmax") is None:
            return None
        zv = _scalar(zero, p_sm)
        if zv is None or zv != 0.0 or np.signbit(zv):
            return "the masked-row guard writes another value than +0.0"
        if not _only_reader(p_t, scope) or not _only_reader(test, scope) or (neg is not None and not _only_reader(cond, scope)):
            return "the guarded probabilities are read elsewhere"
        if scope.is_output(p_sm) or len(p_sm.outputs) != 2:
            return "the probabilities are read elsewhere too (a graph output: output_attentions)"
        guard += [where, isnan] + ([neg] if neg is not None else [])
    sm = _writer(p_sm, scope, "Softmax")
    if sm is None:
        return None
    if p_sm is p_t and not _only_reader(p_sm, scope):
        return "the probabilities are read elsewhere too (a graph output: output_attentions)"
    return sm, guard


def _match_core(mm2: gs.Node, scope: Scope, shapes: _Shapes) -> _Core | None:
    """The attention ending in ``mm2`` = MatMul(P, V); None when P is no softmax, a core with
    ``why_not`` when the softmax is there but the rest is not what the op computes."""
    if not _std(mm2, "MatMul") or len(mm2.inputs) != 2:
        return None
    p_t, v = mm2.inputs
    got = _probabilities(p_t, scope)
    if got is None:
        return None
    if isinstance(got, str):
        return _left(mm2, got)
    sm, guard = got
    nodes: list[gs.Node] = [mm2] + guard + [sm]
    s3 = sm.inputs[0]
    if not _only_reader(s3, scope):
        return _left(mm2, "the softmax's input is read elsewhere too")
    softmax_type = elem_type(s3.dtype)
    up = _writer(s3, scope, "Cast")  # HF eager in float16: the masked scores upcast for the softmax
    if up is not None and _product(s3, scope) is None:
        if not _only_reader(up.inputs[0], scope):
            return _left(mm2, "the scores are read elsewhere too")
        nodes.append(up)
        s3 = up.inputs[0]
    axis = int(sm.attrs.get("axis", -1))
    # the mask Add: the scores are the operand that comes from the MatMul (through the post scale)
    mask = None
    s2 = s3
    add = _writer(s3, scope, "Add")
    if add is not None and len(add.inputs) == 2:
        a, b = add.inputs
        for sc, mk in ((a, b), (b, a)):
            if _scores_from(sc, scope) is not None:
                s2, mask = sc, mk
                nodes.append(add)
                break
        if mask is None:
            return _left(mm2, "the softmax's input is not Q·K^T (through one scalar scale and one Add of a mask)")
        if not _only_reader(s2, scope):
            return _left(mm2, "the scores are read elsewhere too")
    scales = dict.fromkeys(SCALE_SLOTS, 1.0)
    s1 = s2
    post = _writer(s2, scope, "Mul") or _writer(s2, scope, "Div")
    if post is not None and len(post.inputs) == 2:
        if post.op == "Div":
            v_ = _scalar(post.inputs[1], post.inputs[0])
            if v_ is not None and _product(post.inputs[0], scope) is not None:
                scales["scale_div"], s1 = v_, post.inputs[0]
                nodes.append(post)
        else:
            for x, c in ((post.inputs[0], post.inputs[1]), (post.inputs[1], post.inputs[0])):
                v_ = _scalar(c, x)
                if v_ is not None and _product(x, scope) is not None:
                    scales["scale_mul"], s1 = v_, x
                    nodes.append(post)
                    break
        if s1 is not s2 and not _only_reader(s1, scope):
            return _left(mm2, "the scores are read elsewhere too")
    mm1 = _product(s1, scope)
    if mm1 is None or len(mm1.inputs) != 2:
        return _left(mm2, "the softmax's input is not Q·K^T (through one scalar scale and one Add of a mask)")
    if mm1.outputs[0] is not s1:
        nodes.append(s1.inputs[0])  # the scores' upcast: the op's softmax_type
    nodes.append(mm1)
    qs, kts = mm1.inputs
    q, scales["scale_q"], qn = _scaled(qs, scope)
    kt, scales["scale_k"], kn = _scaled(kts, scope)
    nodes += qn + kn
    got = _k_transposed(kt, scope, shapes)
    if got is None:
        return _left(mm2, "K^T is not K with its last two axes swapped (a 4-D Transpose, or the dynamo "
                          "exporter's Reshape/Transpose/Reshape)")
    k, k_bsnd, kt_nodes, kv_heads = got
    nodes += kt_nodes
    qd = shapes.dims(q)
    if qd is None or len(qd) != 4:
        return _left(mm2, f"Q is not known to be 4-D (B, N, S, D): {qd!r}")
    why = ""
    rank = _scores_rank(mask, shapes)
    if rank != 4:
        why = (f"the mask makes the scores rank {rank}" if rank else
               "the mask's rank is not known: it may raise the scores' rank")
    elif axis not in (-1, 3):
        why = f"a Softmax over axis {axis}, not the last"
    scores_type, output_type = elem_type(s1.dtype), elem_type(mm2.outputs[0].dtype)
    up = _writer(v, scope, "Cast")
    if up is not None and _feeds_only(v, scope) and int(up.attrs.get("to", 0)) == output_type:
        nodes.append(up)  # V upcast for the second MatMul (torch's float16 SDPA export): the op's output_type
        v = up.inputs[0]
    nan_to_zero = any(n.op == "Where" for n in guard)
    core = _Core(q, k, v, mask, scales, nan_to_zero, nodes, k_bsnd=k_bsnd, kv_heads=kv_heads, why_not=why,
                 scores_type=scores_type, softmax_type=softmax_type, output_type=output_type)
    if mask is not None:
        core.mask_kind = _mask_kind(mask)
    return core


def _scores_rank(mask: gs.Tensor | None, shapes: _Shapes) -> int | None:
    """The rank of the scores after the mask Add (4, or the mask's when higher; None: unknown)."""
    if mask is None:
        return 4
    md = shapes.dims(mask)
    return None if md is None else max(4, len(md))


def _tri(shapes: _Shapes, a, b) -> bool | None:
    """a and b are one dim (True), two different numbers (False), or not known to be either."""
    if shapes.same(a, b):
        return True
    return False if _int(a) is not None and _int(b) is not None else None


def _product(t: gs.Tensor, scope: Scope) -> gs.Node | None:
    """The MatMul that writes t, directly or through one Cast (float16 scores upcast for the
    softmax), the Cast's input read only by it."""
    mm = _writer(t, scope, "MatMul")
    if mm is not None:
        return mm
    up = _writer(t, scope, "Cast")
    if up is not None and _only_reader(up.inputs[0], scope):
        return _writer(up.inputs[0], scope, "MatMul")
    return None


def _scores_from(t: gs.Tensor, scope: Scope) -> gs.Node | None:
    """The MatMul that writes t, directly or through one scalar Mul/Div (and a Cast)."""
    mm = _product(t, scope)
    if mm is not None:
        return mm
    post = _writer(t, scope, "Mul") or _writer(t, scope, "Div")
    if post is None or len(post.inputs) != 2:
        return None
    for x in post.inputs[:1] if post.op == "Div" else post.inputs:
        if _product(x, scope) is not None:
            return _product(x, scope)
    return None


def _mask_kind(mask: gs.Tensor) -> str:
    """boolean: Where(cond, 0, a large negative) -- CANN's attenMask; else additive (pseShift)."""
    w = mask.inputs[0] if len(mask.inputs) == 1 else None
    if w is not None and w.op == "Where" and len(w.inputs) == 3:
        a = np.asarray(w.inputs[1].values) if isinstance(w.inputs[1], gs.Constant) else None
        b = np.asarray(w.inputs[2].values) if isinstance(w.inputs[2], gs.Constant) else None
        if a is not None and b is not None and a.size == 1 and b.size == 1 and a.dtype.kind == "f":
            lo = float(np.finfo(b.dtype).min) if b.dtype.kind == "f" else None
            if float(a.ravel()[0]) == 0.0 and lo is not None and float(b.ravel()[0]) <= min(lo / 2, -1e4):
                return "boolean"
    return "additive"


def _head_split(t: gs.Tensor, scope: Scope, shapes: _Shapes, heads: int, d: int,
                bsnd: bool = False) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """t = Transpose(Reshape(X, [B, S, heads, d]), [0,2,1,3]) (or, ``bsnd``, the Reshape itself),
    each read only here, X of rank 3: (X, nodes)."""
    nodes = []
    if not bsnd:
        tr = _writer(t, scope, "Transpose")
        if tr is None or not _feeds_only(t, scope) or not _perm_is(tr, [0, 2, 1, 3]):
            return None
        nodes.append(tr)
        t = tr.inputs[0]
    rs = _writer(t, scope, "Reshape")
    if rs is None or not _feeds_only(t, scope):
        return None
    x = rs.inputs[0]
    xd = shapes.dims(x)
    if xd is None or len(xd) != 3 or _int(xd[2]) != heads * d:
        return None
    if not _reshape_is(shapes, rs, [xd[0], xd[1], heads, d]):
        return None
    return x, [rs] + nodes


def _head_merge(y: gs.Tensor, scope: Scope, shapes: _Shapes, hd: int) -> tuple[list[gs.Node], gs.Node, bool] | None:
    """y read only by Transpose([0,2,1,3]) read only by Reshape(., [B, S, hd]) or [B*S, hd]:
    (nodes, the Reshape, whether it flattens to 2-D)."""
    if not _only_reader(y, scope):
        return None
    tr = y.outputs[0]
    if not _std(tr, "Transpose") or not _perm_is(tr, [0, 2, 1, 3]):
        return None
    t = tr.outputs[0]
    if not _only_reader(t, scope):
        return None
    rs = t.outputs[0]
    if not _std(rs, "Reshape") or rs.inputs[0] is not t:
        return None
    td = shapes.dims(t)
    if td is None or len(td) != 4:
        return None
    if _reshape_is(shapes, rs, [td[0], td[1], hd]):
        return [tr, rs], rs, False
    bs = td[0] * td[1] if _int(td[0]) is not None and _int(td[1]) is not None else _FREE
    if _reshape_is(shapes, rs, [bs, hd]):  # [B*S, H]: the next Linear's 2-D view (GPT-2's dynamo export)
        return [tr, rs], rs, True
    return None


#: ops whose output has the shape of their first input, through which the head split is found
_SAME_SHAPE = frozenset({"Mul", "Add", "Sub", "Div", "Cast", "RotaryEmbedding", "RotaryEmbeddingInterleaved"})


def _split_heads_of(q: gs.Tensor, scope: Scope, shapes: _Shapes, d: int) -> int | None:
    """The head count of a BNSD tensor whose heads axis shape inference left open: the export's
    head split ``Transpose(Reshape(X, [B', S', -1 or N, d]), [0,2,1,3])`` above it (through
    elementwise ops and the rotary embedding), N = X's last dim / d where B', S' are X's batch
    and sequence (they come from another input's Shape, which the analysis cannot always tie to
    X). The count describes the op for CANN; the BNSD body reads Q's and K's heads as it runs
    (repeat_kv's factor is their ratio), so a count taken from it never changes a value."""
    t = q
    for _ in range(6):
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if p is None or not p.inputs:
            return None
        if p.op == "Transpose" and _perm_is(p, [0, 2, 1, 3]):
            rs = _writer(p.inputs[0], scope, "Reshape")
            if rs is None or len(rs.inputs) != 2:
                return None
            tgt, xd = shapes.target(rs.inputs[1]), shapes.dims(rs.inputs[0])
            if tgt is None or len(tgt) != 4 or xd is None or len(xd) != 3:
                return None
            if _int(tgt[3]) != d:
                return None
            n = _int(tgt[2]) if _int(tgt[2]) and _int(tgt[2]) > 0 else None
            if n is None and tgt[2] == -1 and _int(xd[2]) is not None and _int(xd[2]) % d == 0:
                n = _int(xd[2]) // d  # X = [B, S, n*d] viewed as [B, S, -1, d], as every run of the model has it
            return n if n and n > 0 else None
        if p.op not in _SAME_SHAPE:
            return None
        t = p.inputs[0]
    return None


@dataclasses.dataclass
class _Hit:
    core: _Core
    layout: str
    inputs: list[gs.Tensor]  # Q, K, V as the op reads them (K: None when it must be transposed)
    heads: int
    kv_heads: int
    head_dim: int
    nodes: list[gs.Node]
    flat_shape: gs.Tensor | None = None  # BSH: the head merge flattened to [B*S, H] by this shape


def _match(anchor: gs.Node, scope: Scope, shapes: _Shapes, bsh: bool) -> _Hit | None:
    if bsh:
        if not _std(anchor, "Reshape"):
            return None
        tr = _writer(anchor.inputs[0], scope, "Transpose")
        mm2 = _writer(tr.inputs[0], scope, "MatMul") if tr is not None else None
        if mm2 is None:
            return None
    else:
        mm2 = anchor
    core = _match_core(mm2, scope, shapes)
    if core is None or (core.k is None and bsh):
        return None
    if core.k is None:  # recognized and left: the check says why
        return _Hit(core, "BNSD", [], 0, 0, 0, core.nodes)
    qd = shapes.dims(core.q)
    heads, d = _int(qd[1]), _int(qd[3])
    if heads is None and d is not None:
        heads = _split_heads_of(core.q, scope, shapes, d)
    if heads is None or d is None:
        core.why_not = core.why_not or f"the query's heads and head dim are not static ({qd[1]!r}, {qd[3]!r})"
        heads, d = heads or 0, d or 0
    nodes = list(core.nodes)
    k, v, kv_heads = core.k, core.v, heads
    if core.kv_heads is not None:  # repeat_kv of K already taken in with K^T: V's must be too
        rv = _repeat_kv(v, scope, shapes, heads) if heads else None
        if rv is None or rv[1] != core.kv_heads:
            return None
        v, kv_heads, vn = rv
        nodes += vn
    elif not core.k_bsnd and heads:
        rk = _repeat_kv(k, scope, shapes, heads)
        rv = _repeat_kv(v, scope, shapes, heads)
        if rk is not None and rv is not None and rk[1] == rv[1]:
            k, kv_heads, kn = rk
            v, _, vn = rv
            nodes += kn + vn
    if kv_heads == heads and heads:
        # without repeat_kv, K and V must have Q's heads: a MatMul that broadcasts one KV head
        # over the query heads would become a MatMul of the repeated K (other operand shapes)
        kd, vd = shapes.dims(core.k), shapes.dims(v)
        kh = kd[2 if core.k_bsnd else 1] if kd is not None and len(kd) == 4 else None
        vh = vd[1] if vd is not None and len(vd) == 4 else None
        if _int(kh) is None and not core.k_bsnd and _int(kd[3] if kd and len(kd) == 4 else None) is not None:
            kh = _split_heads_of(core.k, scope, shapes, _int(kd[3])) or kh
        if _int(vh) is None and vd is not None and len(vd) == 4 and _int(vd[3]) is not None:
            vh = _split_heads_of(v, scope, shapes, _int(vd[3])) or vh
        if _int(kh) != heads or _int(vh) != heads:
            core.why_not = core.why_not or (f"K or V do not have the query's {heads} heads ({kh!r}, {vh!r}): the "
                                            "MatMuls broadcast them")
    _shapes_agree(core, v, qd, d, shapes)
    if not bsh:
        return _Hit(core, "BNSD", [core.q, None if core.k_bsnd else k, v], heads, kv_heads, d, nodes)
    if core.why_not or not heads:
        return None
    merge = _head_merge(mm2.outputs[0], scope, shapes, heads * d)
    if merge is None or merge[1] is not anchor:
        return None
    q = _head_split(core.q, scope, shapes, heads, d)
    kx = _head_split(k, scope, shapes, kv_heads, d, bsnd=core.k_bsnd)
    vd = shapes.dims(v)
    dv = _int(vd[3]) if vd is not None and len(vd) == 4 else None
    vx = _head_split(v, scope, shapes, kv_heads, dv) if dv is not None else None
    if q is None or kx is None or vx is None or dv != d:
        return None
    nodes += q[1] + kx[1] + vx[1] + merge[0]
    hit = _Hit(core, "BSH", [q[0], kx[0], vx[0]], heads, kv_heads, d, nodes)
    hit.flat_shape = anchor.inputs[1] if merge[2] else None
    return hit


def _shapes_agree(core: _Core, v: gs.Tensor, qd: list, d: int, shapes: _Shapes) -> bool:
    """Set ``core.why_not`` where the kernel cannot take the shapes: V's head dim not K's, a batch
    broadcast between Q and K/V, a mask that broadcasts the scores to a larger shape. Returns
    whether something is not known either way: the bodies reproduce any broadcast exactly (the
    BSH merge reads the attention output's own B and S, as the export's merge does), so such a
    dim only concerns the kernel, which gets the export's shapes on every input that runs the
    model as it declares."""
    kd, vd = shapes.dims(core.k), shapes.dims(core.v)
    if kd is None or vd is None or len(kd) != 4 or len(vd) != 4:
        core.why_not = core.why_not or "K or V is not known to be 4-D"
        return True
    dv = _int(vd[3])
    if dv != d:
        core.why_not = core.why_not or f"V's head dim ({vd[3]!r}) is not Q's ({d}): PromptFlashAttention takes V shaped as K"
    unknown = False
    for what, b in (("K", kd[0]), ("V", vd[0])):
        same = _tri(shapes, qd[0], b)
        if same is False:
            core.why_not = core.why_not or f"a batch broadcast between Q ({qd[0]!r}) and {what} ({b!r}): the kernel has one B"
        unknown = unknown or same is None
    if core.mask is not None:
        md = shapes.dims(core.mask) or []
        skv = kd[1] if core.k_bsnd else kd[2]
        scores = [qd[0], qd[1], qd[2], skv]
        for m_, s_ in zip(reversed(md), reversed(scores)):
            if _int(m_) == 1:
                continue
            same = _tri(shapes, m_, s_)
            if same is False:
                core.why_not = core.why_not or (f"the mask {md!r} broadcasts the scores {scores!r} to a larger shape "
                                                "(the kernel's output is Q's)")
            unknown = unknown or same is None
    return unknown


class _Attention(Rule):
    """The attention DAG above, anchored at MatMul(P, V) (BNSD) or at the head merge's Reshape (BSH)."""

    def __init__(self, layout: str, shapes: "_Shapes | None" = None):
        self.layout = layout
        self.name = f"attention_{layout.lower()}"
        self.shapes = shapes

    def anchors(self) -> frozenset[str]:
        return frozenset({"Reshape" if self.layout == "BSH" else "MatMul"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if self.shapes is None:
            self.shapes = _Shapes(scope.root)
        hit = _match(anchor, scope, self.shapes, self.layout == "BSH")
        if hit is None:
            return None
        m = scope.match([n for n in reversed(hit.nodes) if n is not anchor] + [anchor])
        m.hit = hit
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        hit: _Hit = m.hit
        core = hit.core
        if core.why_not:
            return MatchResult.fail(f"attention not fused: {core.why_not}")
        elem = elem_type(hit.inputs[0].dtype)
        if elem not in _FLOATS:
            return MatchResult.fail(f"attention not fused: type {TensorProto.DataType.Name(elem) if elem else 'unknown'} "
                                    "is not a float type")
        wide = [(what, t) for what, t in (("scores", core.scores_type), ("softmax", core.softmax_type),
                                          ("output", core.output_type))
                if t not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)]
        if wide and getattr(ctx.target, "has_hardware", False) and elem != TensorProto.DOUBLE:
            what, t = wide[0]
            return MatchResult.fail(f"attention not fused: its {what} is computed in "
                                    f"{TensorProto.DataType.Name(t).lower() if t else 'an unknown type'}: the kernel's "
                                    "softmax is float32 at most")
        for slot, v in core.scales.items():
            if float(np.float32(v)) != v:
                return MatchResult.fail(f"attention not fused: the {slot} constant {v!r} is not a float32 value (the "
                                        "op's float attribute would round it)")
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        if m.opset < MIN_OPSET:
            return MatchResult.fail(f"attention not fused: opset {m.opset}: the Attention device op's body needs "
                                    f"opset {MIN_OPSET}+")
        why = attention_refusal(ctx.target, dtype_name(elem), ctx.cost_options.get("precision_mode"),
                                head_dim=hit.head_dim, num_heads=hit.heads, kv_heads=hit.kv_heads)
        return MatchResult.fail(f"attention not fused: {why}") if why else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        hit: _Hit = m.hit
        core = hit.core
        ensure_function(m.root, attention_function(m.opset, hit.layout))
        q, k, v = hit.inputs
        if k is None:  # K^T was Transpose(K', [0,2,3,1]) of K' = [B,S,N,D]: the op reads K' in BNSD
            shape = [core.k.shape[i] for i in (0, 2, 1, 3)] if core.k.shape is not None and len(core.k.shape) == 4 else None
            k = m.op("Transpose", [core.k], {"perm": [0, 2, 1, 3]}, name=m.names("attention_k"),
                     dtype=core.k.dtype, shape=shape)
        mask = core.mask
        if mask is None:  # -0.0 in the scores' type: the identity of their Add
            mask = gs.Constant(m.names("attention_no_mask"), np.array(-0.0, dtype=np.dtype(np_dtype(core.scores_type))))
        scale = core.scales["scale_q"] * core.scales["scale_k"] * core.scales["scale_mul"] / core.scales["scale_div"]
        attrs = {"num_heads": int(hit.heads), "num_key_value_heads": int(hit.kv_heads),
                 **{s: float(v) for s, v in core.scales.items()}, "nan_to_zero": int(core.nan_to_zero),
                 "input_type": int(elem_type(q.dtype)), "head_dim": int(hit.head_dim),
                 "scores_type": int(core.scores_type), "softmax_type": int(core.softmax_type),
                 "output_type": int(core.output_type),
                 "scale": float(scale), "input_layout": hit.layout, "mask_kind": core.mask_kind}
        m.count("kv_heads_absorbed", int(hit.kv_heads != hit.heads))
        out_dtype = m.anchor.outputs[0].dtype
        y = m.op(OPS[hit.layout], [q, k, v, mask], attrs, domain=DOMAIN, name=m.names(f"attention_{hit.layout.lower()}"),
                 dtype=out_dtype)
        if hit.flat_shape is not None:  # the export's [B*S, H] view of the merged heads stays
            y = m.op("Reshape", [y, hit.flat_shape], {}, name=m.names("attention_flat"), dtype=out_dtype)
        return y


@register
class FuseAttention(RulePass):
    """Recognizes exported scaled dot-product attention.

    Cases:
      1. the scale as Q·c and K^T·c (torch's SDPA export), as S·c or S/c (eager attention), or
         none (Whisper scales Q before the head split: that Mul stays, the op's slot is 1);
      2. an additive mask (or torch's Where(mask, 0, -inf) form), or none; torch's NaN guard;
      3. K^T as a 4-D Transpose or the dynamo exporter's 3-D Reshape/Transpose/Reshape;
      4. K and V through HF's repeat_kv (grouped-query / multi-query: num_key_value_heads);
      5. Q, K, V from the head split and Y into the head merge: the BSH layout, all inside.
    """

    name = "fuse_attention"
    summary = ("scaled dot-product attention (head split/merge, GQA/MQA repeat_kv, masks) -> "
               "graphpass.ascend::Attention / AttentionBSH device ops (CANN PromptFlashAttention).")
    kind = PassKind.FUSION
    promise = EXACT
    reverse = True
    rules = (_Attention("BSH"), _Attention("BNSD"))
    anchor_ops = frozenset({"MatMul"})
    preserves_order = True

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        # the rules of one run share one shape analysis of the model (built on the first match)
        shapes = _Shapes(graph)
        counts = apply_rules(graph, (_Attention("BSH", shapes), _Attention("BNSD", shapes)), ctx, self.name,
                             reverse=True)
        return PassResult(counts.total("rewritten") > 0, self.summarize(counts))
