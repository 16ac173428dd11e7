"""A constant zero Pad folded into the Conv after it.

    Pad(x, pads, mode=constant, value=0) -> Conv(pads=p)         =>  Conv(x, pads=p + pads[H,W])

Exact: the padded zeros enter the convolution as the op's own padding would.
Refused (with the reason) for a non-constant, negative or batch/channel pad, a mode other than
constant, a pad value other than +0 (-0.0 included), ``auto_pad`` other than NOTSET, a MaxPool (its padding is -inf,
not 0), and an AveragePool: onnxruntime leaves a pool's own padding out of the sum (dividing by
the kernel size with count_include_pad=1), so a window holding only -0.0 averages to -0.0 where
the explicit +0.0 padding gives +0.0.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.shapes import static_shape

__all__ = ["FoldPad"]


def _pads(pad: gs.Node, rank: int) -> list[int] | None:
    if "pads" in pad.attrs:  # opset < 11
        pads = [int(v) for v in pad.attrs["pads"]]
    elif len(pad.inputs) > 1 and isinstance(pad.inputs[1], gs.Constant):
        pads = [int(v) for v in np.asarray(pad.inputs[1].values).ravel()]
    else:
        return None
    if len(pad.inputs) > 3 and pad.inputs[3].name:  # opset 18 axes
        if not isinstance(pad.inputs[3], gs.Constant):
            return None
        axes = [int(a) % rank for a in np.asarray(pad.inputs[3].values).ravel()]
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = full
    return pads if len(pads) == 2 * rank else None


def _pad_value(pad: gs.Node) -> float | None:
    if "value" in pad.attrs:
        return float(pad.attrs["value"])
    if len(pad.inputs) > 2 and pad.inputs[2].name:
        return float(np.asarray(pad.inputs[2].values)) if isinstance(pad.inputs[2], gs.Constant) else None
    return 0.0


class _PadInto(RewriteRule):
    def __init__(self, op: str):
        self.pattern = ("Pad", op)

    def check(self, m: Match, ctx) -> MatchResult:
        pad, op = m.nodes
        shape = static_shape(pad.inputs[0])
        if shape is None or len(shape) < 3:
            return MatchResult.fail("the padded tensor's rank is unknown or below 3")
        if pad.attrs.get("mode", "constant") != "constant":
            return MatchResult.fail(f"Pad mode '{pad.attrs.get('mode')}' (only constant padding folds)")
        value = _pad_value(pad)
        if value != 0.0:
            return MatchResult.fail(f"pad value {value} is not 0")
        if np.signbit(value):
            return MatchResult.fail("pad value -0.0: the op's own padding is +0.0")
        pads = _pads(pad, len(shape))
        rank = len(shape)
        if pads is None or any(p < 0 for p in pads):
            return MatchResult.fail("pads are not constant and non-negative")
        if pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
            return MatchResult.fail("the Pad pads the batch or channel axis")
        if op.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            return MatchResult.fail(f"{op.op} uses auto_pad={op.attrs.get('auto_pad')}")
        if op.op == "AveragePool":
            return MatchResult.fail("AveragePool leaves its own padding out of the sum: a window of -0.0 would "
                                    "average to -0.0 where the padded zeros give +0.0")
        m.spatial = (pads[2:rank], pads[rank + 2:])
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        pad, op = m.nodes
        begin, end = m.spatial
        k = len(begin)
        own = [int(v) for v in op.attrs.get("pads", [0] * (2 * k))]
        op.attrs["pads"] = [own[i] + begin[i] for i in range(k)] + [own[k + i] + end[i] for i in range(k)]
        op.inputs[0] = pad.inputs[0]
        A.mark_created(op, FoldPad.name, replaced=[pad, op])
        return [pad]


class _PadIntoMaxPool(RewriteRule):
    pattern = ("Pad", "MaxPool")

    def check(self, m: Match, ctx) -> MatchResult:
        return MatchResult.fail("MaxPool pads with -inf, not 0: folding a zero Pad would change the result")


@register
class FoldPad(RulePass):
    """Folds a zero constant Pad into the following Conv's own padding.

    Cases:
      1. Conv (any rank of spatial dims), pads added to its own;
      2. pads as an attribute (before opset 11), an input, or with axes (opset 18).
    Refused with the reason: AveragePool and MaxPool (see the module docstring).
    """

    name = "fold_pad"
    summary = "Fold a zero constant Pad into the following Conv padding."
    kind = PassKind.FUSION
    promise = EXACT
    rules = (_PadInto("Conv"), _PadInto("AveragePool"), _PadIntoMaxPool())
