"""A 2-D Conv over an input wider than the AI Core's Conv accepts, run along H instead.

    Conv(x (N,C,H,W), W (M,C/g,kh,kw), pads (t,l,b,r), strides (sh,sw), dilations (dh,dw))
        =>  Transpose(Conv(Transpose(x, (0,1,3,2)), W^T (M,C/g,kw,kh), pads (l,t,r,b),
                           strides (sw,sh), dilations (dw,dh)), (0,1,3,2))

CANN's Conv takes an input W of at most 4096 (``data/op_limits.toml``: Conv ``max_input_w``,
CANN's Conv page) and puts no such bound on H: a long 1-row signal (an audio front end as in
auto_optimizer's knowledge_transpose_large_input_conv, AASIST) runs on AI Core once H and W are
swapped. Two Transposes of the same permutation in a row cancel (``merge_transposes``), so
consecutive wide Convs keep one pair.

Exact where the kernel has a side of 1 (kh == 1 or kw == 1): every output is then the same
products summed in the same order (channel, then the one kernel axis longer than 1); with
both sides above 1 the swap would reorder the sum, so it is refused. Fires only where the target
puts the Conv off AI Core by its input width and the swapped Conv fits (``needs_target``; scored).
Refused (for --explain) also for: a non-constant weight, a rank other than 4, auto_pad SAME_*
(its odd pixel goes to the end of each axis: swapping keeps that, but the rule is kept simple).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.ir.graph import peek_values
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.passes.lowering._knowledge import off_ai_core

__all__ = ["TransposeWideConv"]

_NAME = "transpose_wide_conv"


def _auto_pad(node: gs.Node) -> str:
    v = node.attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else str(v)


def _swap2(v):
    return [int(v[1]), int(v[0])]


class _WideConv(Rule):
    pattern = ("Conv",)

    def check(self, m: Match, ctx) -> MatchResult:
        conv = m.anchor
        x = conv.inputs[0]
        if x.shape is None or len(x.shape) != 4:
            return MatchResult.fail("not a 2-D Conv with a known input rank")
        if len(conv.inputs) < 2 or not isinstance(conv.inputs[1], gs.Constant):
            return MatchResult.fail("the weight is not a constant")
        row = load_op_limits().get("Conv")
        n_h, n_w = x.shape[2], x.shape[3]
        if row is None or row.max_input_w is None or not isinstance(n_w, (int, np.integer)) or n_w <= row.max_input_w:
            return MatchResult.fail(f"input W {n_w} is within the Conv's limit")
        if not isinstance(n_h, (int, np.integer)) or n_h > row.max_input_w:
            return MatchResult.fail(f"input H {n_h} would be the new W, over the limit as well")
        kh, kw = np.shape(peek_values(conv.inputs[1]))[2:]
        if kh > 1 and kw > 1:
            return MatchResult.fail(f"kernel {kh}x{kw}: swapping H and W would reorder each output's sum (not exact)")
        if _auto_pad(conv) not in ("NOTSET", "VALID"):
            return MatchResult.fail(f"auto_pad={_auto_pad(conv)}")
        why = off_ai_core(ctx, conv, f"pass '{_NAME}'")
        if why is None:
            return MatchResult.fail(f"the Conv runs on AI Core on {ctx.target.name}: nothing to gain")
        m.count("aicpu_convs_transposed")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        conv = m.anchor
        x, wt = conv.inputs[0], conv.inputs[1]
        a = dict(conv.attrs)
        for key in ("kernel_shape", "strides", "dilations"):
            if key in a:
                a[key] = _swap2(a[key])
        if "pads" in a:
            t, l, b, r = (int(p) for p in a["pads"])
            a["pads"] = [l, t, r, b]
        label = conv.name or "conv"
        w = np.ascontiguousarray(np.swapaxes(peek_values(wt), 2, 3))
        xt = m.op("Transpose", [x], {"perm": [0, 1, 3, 2]}, name=m.names(f"{label}_to_h"), dtype=x.dtype,
                  shape=[*x.shape[:2], x.shape[3], x.shape[2]])
        y = m.op("Conv", [xt, gs.Constant(m.names(f"{wt.name}_hw"), w), *conv.inputs[2:]], a,
                 name=m.names(f"{label}_along_h"), dtype=conv.outputs[0].dtype)
        return m.op("Transpose", [y], {"perm": [0, 1, 3, 2]}, name=m.names(f"{label}_to_w"), dtype=conv.outputs[0].dtype)


@register
class TransposeWideConv(RulePass):
    """Runs a Conv over a very wide input along H (Transpose, swapped Conv, Transpose back).

    Cases:
      1. a 1-row kernel (1 x kw) or a 1-column one (kh x 1), any pads, strides, dilations, group, bias.
    """

    name = _NAME
    summary = "Conv over an input wider than the AI Core's Conv takes (CANN: W <= 4096) -> Transposes around a Conv along H."
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True
    needs_target = True
    runs_before = (PassKind.FUSION,)
    rules = (_WideConv(),)
