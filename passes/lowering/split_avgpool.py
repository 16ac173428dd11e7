"""An AveragePool whose window the AI Core kernel refuses, as two pools: along H, then along W.

    AveragePool(x, kernel (kh,kw), strides (sh,sw), pads (t,l,b,r))
        =>  AveragePool(AveragePool(x, kernel (kh,1), strides (sh,1), pads (t,0,b,0)),
                        kernel (1,kw), strides (1,sw), pads (0,l,0,r))        (ceil_mode, count_include_pad kept)

An average over a kh x kw window is the average over W of the averages over H: the divisor is
a product of per-axis counts in every mode (count_include_pad 0 counts the rows and columns
inside the image, 1 those inside the padded image; ceil_mode clips the last window per axis),
so the two-step form computes the same quantity. It sums the same terms in another order and
divides twice, so it declares the ``summation-order`` tolerance. auto_optimizer factors only
non-overlapping windows (kernel == stride, a factor per axis) and keeps kernel == stride; this
form needs neither and leaves no window above the AI Core's limits when kh and kw each fit.

Fires only where the target puts the pool off AI Core by its kernel size (``data/op_limits.toml``
AveragePool: a side above 255 or an area above 256, CANN's AveragePool page) and each part fits;
scored. Refused (for --explain): a rank other than 4, auto_pad SAME_*, a side above the limit
(each part would still be over it), dilations other than 1.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.passes.lowering._knowledge import SUMMATION_ORDER, off_ai_core

__all__ = ["SplitAvgPool"]

_NAME = "split_avgpool"


def _auto_pad(node: gs.Node) -> str:
    v = node.attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else str(v)


class _SplitAvgPool(Rule):
    pattern = ("AveragePool",)

    def check(self, m: Match, ctx) -> MatchResult:
        pool = m.anchor
        ks = [int(k) for k in pool.attrs.get("kernel_shape", [])]
        if len(ks) != 2:
            return MatchResult.fail(f"kernel_shape {ks}: only 2-D pools are split")
        if _auto_pad(pool) not in ("NOTSET", "VALID"):
            return MatchResult.fail(f"auto_pad={_auto_pad(pool)}: the pads depend on the input size")
        if any(int(d) != 1 for d in pool.attrs.get("dilations", [1, 1])):
            return MatchResult.fail("dilated pooling")
        if min(ks) == 1:
            return MatchResult.fail(f"kernel {ks} is already one-dimensional")
        why = off_ai_core(ctx, pool, f"pass '{_NAME}'")
        if why is None:
            return MatchResult.fail(f"kernel {ks[0]}x{ks[1]} runs on AI Core on {ctx.target.name}: nothing to gain")
        for part in ([ks[0], 1], [1, ks[1]]):
            probe = gs.Node("AveragePool", attrs={**pool.attrs, "kernel_shape": part, "strides": [1, 1]})
            if load_op_limits().aicpu_reason(probe) is not None:
                return MatchResult.fail(f"the part {part[0]}x{part[1]} is still over the AI Core's limit ({why})")
        m.count("aicpu_pools_split")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        pool = m.anchor
        kh, kw = (int(k) for k in pool.attrs["kernel_shape"])
        sh, sw = (int(s) for s in pool.attrs.get("strides", [1, 1]))
        t, l, b, r = (int(p) for p in pool.attrs.get("pads", [0, 0, 0, 0]))
        # auto_pad VALID is pads 0, written out: ONNX forbids pads next to an auto_pad
        base = {k: v for k, v in pool.attrs.items() if k not in ("kernel_shape", "strides", "pads", "dilations", "auto_pad")}
        label = pool.name or "avgpool"
        h = m.op("AveragePool", [pool.inputs[0]], {**base, "kernel_shape": [kh, 1], "strides": [sh, 1], "pads": [t, 0, b, 0]},
                 name=m.names(f"{label}_h"), dtype=pool.outputs[0].dtype)
        return m.op("AveragePool", [h], {**base, "kernel_shape": [1, kw], "strides": [1, sw], "pads": [0, l, 0, r]},
                    name=m.names(f"{label}_w"), dtype=pool.outputs[0].dtype)


@register
class SplitAvgPool(RulePass):
    """Splits an AveragePool over the AI Core's window limit into a pool along H and one along W.

    Cases:
      1. any strides, pads, ceil_mode and count_include_pad (the divisor factors per axis);
      2. auto_pad VALID (NOTSET with explicit pads too).
    """

    name = _NAME
    summary = "AveragePool over the AI Core's window limit (CANN: side > 255 or area > 256) -> pool along H, then W."
    kind = PassKind.LOWERING
    promise = SUMMATION_ORDER
    scored = True
    needs_target = True
    runs_before = (PassKind.FUSION,)
    rules = (_SplitAvgPool(),)
