"""Rotary position embedding in its rotate-half form (GPT-NeoX, LLaMA, as exporters write it)
becomes one ``graphpass.ascend::RotaryEmbedding`` device op (CANN RotaryPositionEmbedding, mode 0).

    x1 = Slice(X, 0, D/2, axis -1); x2 = Slice(X, D/2, end, axis -1)
    Y = X * Cos + Concat(Neg(x2), x1, axis -1) * Sin           (operands of Mul/Add in any order)
        =>  RotaryEmbedding(X, Cos, Sin)

Exact: the body (graphpass/ir/device_ops_tf.py) computes these very ops (Slice and Concat move
values; the Muls and the Add are the same roundings). Cos and Sin may be any tensors (the exporters
compute them once per model from the positions). Not formed (the report says why): the last axis
D unknown or odd, the halves not exactly [0, D/2) and [D/2, D), an intermediate read elsewhere, X
not 4-D (CANN takes BNSD/BSND), opset below 15 (the body's Shape(start=)), or a target without
the kernel, the dtype or the head dim (cost_model/data/transformer_ops.toml).

The interleaved form (GPT-J's rotate_every_two: X[..., ::2] and -X[..., 1::2] stacked on a new
last axis and reshaped back to X's shape) becomes ``graphpass.ascend::RotaryEmbeddingInterleaved``
(CANN mode 1), exact too; the Reshape target must be X's shape as a constant (X's static dims, 0
entries copied, one -1), which simplify_shapes makes of the exporters' Shape arithmetic.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.transformer_ops import refusal as target_refusal
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function
from graphpass.ir.device_ops_tf import MIN_OPSET, rotary_function, rotary_interleaved_function
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, single_reader
from graphpass.passes.fusion._match import operands, producer_of
from graphpass.passes.fusion._match import dtype_name as _dtype_name

__all__ = ["FuseRotaryEmbedding"]

_BIG = 2 ** 31 - 1


def _ints(t: gs.Tensor | None) -> list[int] | None:
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return [int(v) for v in np.asarray(t.values).ravel()]
    return None


def _slice_of(t: gs.Tensor, local: set[int]) -> tuple[gs.Tensor, int, int, int] | None:
    """t = Slice(X, [start], [end], [axis], [1]): (X, start, end, axis)."""
    s = producer_of(t, "Slice", local)
    if s is None or len(s.inputs) < 3:
        return None
    starts, ends = _ints(s.inputs[1]), _ints(s.inputs[2])
    axes = _ints(s.inputs[3]) if len(s.inputs) > 3 and s.inputs[3].name else [0]
    steps = _ints(s.inputs[4]) if len(s.inputs) > 4 and s.inputs[4].name else [1]
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if not (len(starts) == len(ends) == len(axes) == len(steps) == 1) or steps[0] != 1:
        return None
    return s.inputs[0], starts[0], ends[0], axes[0]


def _cos_sin_terms(anchor: gs.Node, scope: Scope):
    """For an Add of X * Cos and Rot * Sin (each Mul read only by the Add), both ways round:
    (the cos Mul, the sin Mul, the rotated operand, the sin operand) per order of the sin Mul's
    operands. Both rotary spellings start here."""
    if anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
        return
    g, local = scope.graph, scope.local
    for a, b in operands(anchor):
        mul_c, mul_s = producer_of(a, "Mul", local), producer_of(b, "Mul", local)
        if mul_c is None or mul_s is None or mul_c is mul_s or not single_reader(a, g) or not single_reader(b, g):
            continue
        for rot, sin in operands(mul_s):
            yield mul_c, mul_s, rot, sin


class _Rotary(Rule):
    """Anchored at the final Add."""

    name = "rotary_rotate_half"

    def anchors(self) -> frozenset[str]:
        return frozenset({"Add"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        g, local = scope.graph, scope.local
        for mul_c, mul_s, rot, sin in _cos_sin_terms(anchor, scope):
            cat = producer_of(rot, "Concat", local)
            if cat is None or len(cat.inputs) != 2 or not single_reader(rot, g):
                continue
            neg = producer_of(cat.inputs[0], "Neg", local)
            if neg is None or not single_reader(cat.inputs[0], g) or not single_reader(cat.inputs[1], g) \
                    or not single_reader(neg.inputs[0], g):
                continue
            hi, lo = _slice_of(neg.inputs[0], local), _slice_of(cat.inputs[1], local)
            if hi is None or lo is None or hi[0] is not lo[0]:
                continue
            x = lo[0]
            for xx, cos in operands(mul_c):
                if xx is not x:
                    continue
                m = scope.match([lo_node(cat), neg.inputs[0].inputs[0], neg, cat, mul_s, mul_c, anchor])
                m.x, m.cos, m.sin, m.hi, m.lo, m.cat = x, cos, sin, hi, lo, cat
                return m
        return None

    def check(self, m: Match, ctx) -> MatchResult:
        x = m.x
        shape = x.shape
        if shape is None or not shape or not isinstance(shape[-1], (int, np.integer)):
            return MatchResult.fail("rotary embedding: the last axis of X is not static")
        rank, d = len(shape), int(shape[-1])
        axis_ok = all(ax % rank == rank - 1 for ax in (m.hi[3], m.lo[3], int(m.cat.attrs.get("axis", 0))))
        if not axis_ok:
            return MatchResult.fail("rotary embedding: the halves are not taken on the last axis")
        if d % 2:
            return MatchResult.fail(f"rotary embedding: the last axis {d} is odd")
        h = d // 2
        lo_ok = m.lo[1] in (0, -d) or (m.lo[1] < -d)
        hi_ok = m.hi[1] in (h, h - d) and (m.hi[2] >= d)
        if not lo_ok or m.lo[2] not in (h, h - d) or not hi_ok:
            return MatchResult.fail(f"rotary embedding: the halves are not [0, {h}) and [{h}, {d})")
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        if m.opset < MIN_OPSET["RotaryEmbedding"]:
            return MatchResult.fail(f"opset {m.opset}: the RotaryEmbedding body needs opset {MIN_OPSET['RotaryEmbedding']}+")
        if rank != 4 and ctx.target is not None and getattr(ctx.target, "has_hardware", False):
            return MatchResult.fail(f"rotary embedding on a rank-{rank} X: CANN RotaryPositionEmbedding takes 4-D (BNSD/BSND)")
        reason = target_refusal(ctx.target, "RotaryEmbedding", _dtype_name(elem_type(x.dtype)), head_dim=d)
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        ensure_function(m.root, rotary_function(m.opset))
        return m.op("RotaryEmbedding", [m.x, m.cos, m.sin], domain=DOMAIN, name=m.names("rotary"))


def lo_node(cat: gs.Node) -> gs.Node:
    return cat.inputs[1].inputs[0]


def _strided_slice(t: gs.Tensor, local: set[int]) -> tuple[gs.Tensor, int, int, int, int] | None:
    """t = Slice(X, [start], [end], [axis], [step]): (X, start, end, axis, step)."""
    s = producer_of(t, "Slice", local)
    if s is None or len(s.inputs) < 5:
        return None
    vals = [_ints(s.inputs[i]) for i in range(1, 5)]
    if any(v is None or len(v) != 1 for v in vals):
        return None
    return (s.inputs[0], *(v[0] for v in vals))


def _unsqueezed_last(t: gs.Tensor, local: set[int]) -> tuple[gs.Tensor, gs.Node] | None:
    """t = Unsqueeze(u, [-1]) (or [rank(u)]): (u, node)."""
    un = producer_of(t, "Unsqueeze", local)
    if un is None:
        return None
    axes = un.attrs.get("axes")
    if axes is None and len(un.inputs) > 1:
        axes = _ints(un.inputs[1])
    u = un.inputs[0]
    if axes is None or len(axes) != 1:
        return None
    if axes[0] == -1 or (u.shape is not None and axes[0] == len(u.shape)):
        return u, un
    return None


class _RotaryInterleaved(Rule):
    """GPT-J's rotate_every_two: X * Cos + Reshape(Stack(-X[..., 1::2], X[..., ::2]), X's shape) * Sin."""

    name = "rotary_interleaved"

    def anchors(self) -> frozenset[str]:
        return frozenset({"Add"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        g, local = scope.graph, scope.local
        for mul_c, mul_s, rot, sin in _cos_sin_terms(anchor, scope):
            rs = producer_of(rot, "Reshape", local)
            if rs is None or not single_reader(rot, g):
                continue
            cat = producer_of(rs.inputs[0], "Concat", local)
            if cat is None or len(cat.inputs) != 2 or not single_reader(rs.inputs[0], g):
                continue
            first, second = _unsqueezed_last(cat.inputs[0], local), _unsqueezed_last(cat.inputs[1], local)
            if first is None or second is None or not all(single_reader(t, g) for t in cat.inputs):
                continue
            neg = producer_of(first[0], "Neg", local)
            if neg is None or not single_reader(first[0], g) or not single_reader(neg.inputs[0], g) \
                    or not single_reader(second[0], g):
                continue
            odd, even = _strided_slice(neg.inputs[0], local), _strided_slice(second[0], local)
            if odd is None or even is None or odd[0] is not even[0]:
                continue
            x = odd[0]
            for xx, cos in operands(mul_c):
                if xx is not x:
                    continue
                m = scope.match([second[0].inputs[0], neg.inputs[0].inputs[0], neg, first[1], second[1], cat, rs,
                                 mul_s, mul_c, anchor])
                m.x, m.cos, m.sin, m.odd, m.even, m.cat, m.reshape = x, cos, sin, odd, even, cat, rs
                return m
        return None

    def check(self, m: Match, ctx) -> MatchResult:
        x, shape = m.x, m.x.shape
        if shape is None or not shape or not isinstance(shape[-1], (int, np.integer)):
            return MatchResult.fail("interleaved rotary embedding: the last axis of X is not static")
        rank, d = len(shape), int(shape[-1])
        (_, s_o, e_o, a_o, st_o), (_, s_e, e_e, a_e, st_e) = m.odd, m.even
        if a_o % rank != rank - 1 or a_e % rank != rank - 1 or int(m.cat.attrs.get("axis", 0)) not in (-1, rank):
            return MatchResult.fail("interleaved rotary embedding: not taken on the last axis")
        if d % 2 or (s_o, st_o) != (1, 2) or (s_e, st_e) != (0, 2) or e_o < d or e_e < d:
            return MatchResult.fail("interleaved rotary embedding: the slices are not X[..., 1::2] and X[..., ::2]")
        target = _ints(m.reshape.inputs[1])
        allowzero = int(m.reshape.attrs.get("allowzero", 0))
        # X's shape: each leading entry X's static dim or 0 (copied from the stacked tensor, whose
        # leading dims are X's), the last D; one -1 anywhere (the element count is X's, so it is
        # X's dim there)
        ok = target is not None and len(target) == rank and target[-1] in (d, -1) and target.count(-1) <= 1
        if ok:
            for i, t in enumerate(target[:-1]):
                same = isinstance(shape[i], (int, np.integer)) and t == shape[i]
                copy = t == 0 and not allowzero
                ok = ok and (same or copy or t == -1)
        if not ok:
            return MatchResult.fail(f"interleaved rotary embedding: the Reshape target {target} is not X's shape")
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        if m.opset < MIN_OPSET["RotaryEmbeddingInterleaved"]:
            return MatchResult.fail(f"opset {m.opset}: the body needs opset {MIN_OPSET['RotaryEmbeddingInterleaved']}+")
        if rank != 4 and ctx.target is not None and getattr(ctx.target, "has_hardware", False):
            return MatchResult.fail(f"rotary embedding on a rank-{rank} X: CANN RotaryPositionEmbedding takes 4-D (BNSD/BSND)")
        reason = target_refusal(ctx.target, "RotaryEmbeddingInterleaved", _dtype_name(elem_type(x.dtype)), head_dim=d)
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        ensure_function(m.root, rotary_interleaved_function(m.opset))
        return m.op("RotaryEmbeddingInterleaved", [m.x, m.cos, m.sin], domain=DOMAIN, name=m.names("rotary"))


@register
class FuseRotaryEmbedding(RulePass):
    """Recognizes rotary position embedding, rotate-half form.

    Cases:
      1. X * Cos + Concat(-X[..., D/2:], X[..., :D/2]) * Sin, Mul and Add operands in any order;
      2. Slice bounds as exporters write them (0 or -D, D/2 or -D/2, D or INT64_MAX);
      3. Cos and Sin any tensors (broadcast as the graph does);
      4. the interleaved form (GPT-J): X * Cos + Reshape(Stack(-X[..., 1::2], X[..., ::2], -1),
         X's shape) * Sin -> graphpass.ascend::RotaryEmbeddingInterleaved (CANN mode 1).
    """

    name = "fuse_rotary_embedding"
    summary = ("Rotary position embedding (rotate-half, interleaved) -> graphpass.ascend::RotaryEmbedding / "
               "RotaryEmbeddingInterleaved (CANN RotaryPositionEmbedding modes 0, 1).")
    kind = PassKind.FUSION
    promise = EXACT
    rules = (_Rotary(), _RotaryInterleaved())
