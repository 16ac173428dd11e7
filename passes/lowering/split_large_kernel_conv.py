"""A Conv whose kernel is longer than the Cube accepts, as several Convs on slices, summed.

    Conv(x, W (M, C/g, K...), b, pads (pb..., pe...)), K_i > limit on some axis i
        =>  Sum over kernel pieces [s, e) on each such axis (cartesian product) of
            Conv(Slice(x, axis i: s - pb -> e - K + pe, clamped), W[..., s:e, ...], pads: the clamped parts)
            (the bias on the first piece only)

With stride 1 and dilation 1 on a split axis, output o of the original reads padded positions
o .. o+K-1; a piece [s, e) reads o+s .. o+e-1, i.e. a Conv of kernel e - s over the padded
input starting at s: its start in x is s - pb (a pad where negative) and its end, relative to
x's end, is pe - (K - e) (a pad where positive, a Slice where negative). No static size is
needed. Every product is the original's; the partial sums are added in another order, so the
pass declares the ``kernel-split`` tolerance. The limit is the Conv row of
``data/op_limits.toml`` (CANN's Conv page: kernel H and W in [1, 255]); pieces are of equal
length within one. auto_optimizer splits above 192, a threshold it measured; graphpass splits only
where the Cube's range ends, so every piece it makes is a kernel ATC accepts.

Fires only where the target puts the Conv off AI Core by its kernel (``needs_target``; scored).
Refused (for --explain): a weight that is not constant, auto_pad SAME_*, a stride or dilation
other than 1 on a split axis, a split axis whose size is not static, or a piece that would
read padding only (its input slice would be empty).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.ir.graph import peek_values
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.passes.lowering._knowledge import KERNEL_SPLIT, off_ai_core, slice_

__all__ = ["SplitLargeKernelConv", "kernel_pieces"]

_NAME = "split_large_kernel_conv"
_TO_END = np.iinfo(np.int64).max


def kernel_pieces(k: int, limit: int) -> list[tuple[int, int]]:
    """[s, e) ranges covering 0..k in the fewest pieces of at most ``limit``, of equal length within one."""
    n = math.ceil(k / limit)
    base, extra = divmod(k, n)
    out, s = [], 0
    for i in range(n):
        e = s + base + (1 if i < extra else 0)
        out.append((s, e))
        s = e
    return out


def _auto_pad(node: gs.Node) -> str:
    v = node.attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else str(v)


class _SplitKernel(Rule):
    pattern = ("Conv",)

    def check(self, m: Match, ctx) -> MatchResult:
        conv = m.anchor
        if len(conv.inputs) < 2 or not isinstance(conv.inputs[1], gs.Constant):
            return MatchResult.fail("the weight is not a constant")
        wshape = tuple(conv.inputs[1].shape)  # a lazy weight's shape, not decoded: most Convs are within the limit
        spatial = len(wshape) - 2
        if spatial < 1:
            return MatchResult.fail("a weight without spatial axes")
        row = load_op_limits().get("Conv")
        limit = row.max_kernel_dim if row is not None else None
        ks = list(wshape[2:])
        if limit is None or max(ks) <= limit:
            return MatchResult.fail(f"kernel {'x'.join(map(str, ks))} is within the Cube's limit")
        why = off_ai_core(ctx, conv, f"pass '{_NAME}'")
        if why is None:
            return MatchResult.fail(f"the Conv runs on AI Core on {ctx.target.name}: nothing to gain")
        if _auto_pad(conv) not in ("NOTSET", "VALID"):
            return MatchResult.fail(f"auto_pad={_auto_pad(conv)}: the pads depend on the input size")
        strides = [int(s) for s in conv.attrs.get("strides", [1] * spatial)]
        dilations = [int(d) for d in conv.attrs.get("dilations", [1] * spatial)]
        for i, k in enumerate(ks):
            if k > limit and (strides[i] != 1 or dilations[i] != 1):
                return MatchResult.fail(f"stride {strides[i]}, dilation {dilations[i]} on the split axis {i + 2}: only 1 is split")
        m.pieces = [kernel_pieces(k, limit) if k > limit else [(0, k)] for k in ks]
        shape = conv.inputs[0].shape
        pads = [0] * (2 * spatial) if _auto_pad(conv) == "VALID" else [int(p) for p in conv.attrs.get("pads", [0] * (2 * spatial))]
        for i, pieces in enumerate(m.pieces):
            if len(pieces) == 1:
                continue
            n = shape[i + 2] if shape is not None and len(shape) == spatial + 2 else None
            if not isinstance(n, (int, np.integer)):
                return MatchResult.fail(f"the size of the split axis {i + 2} is not static")
            for s, e in pieces:
                start, end = s - pads[i], pads[i + spatial] - (ks[i] - e)
                if n + min(end, 0) <= max(start, 0):
                    return MatchResult.fail(f"the kernel piece [{s}, {e}) on axis {i + 2} reads padding only")
        m.count("aicpu_convs_split")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        conv = m.anchor
        x, wt = conv.inputs[0], conv.inputs[1]
        w = peek_values(wt)
        ks = list(w.shape[2:])
        spatial = len(ks)
        pads = [0] * (2 * spatial) if _auto_pad(conv) == "VALID" else [int(p) for p in conv.attrs.get("pads", [0] * (2 * spatial))]
        attrs = {k: v for k, v in conv.attrs.items() if k not in ("pads", "auto_pad", "kernel_shape")}
        label = conv.name or "conv"
        parts = []
        for n, combo in enumerate(itertools.product(*m.pieces)):
            new_pads = list(pads)
            starts, ends, axes = [], [], []
            for i, (s, e) in enumerate(combo):
                if (s, e) == (0, ks[i]):
                    continue
                pb, pe = pads[i], pads[i + spatial]
                start, end = s - pb, pe - (ks[i] - e)  # in x; the end relative to x's end
                new_pads[i], new_pads[i + spatial] = max(0, -start), max(0, end)
                if start > 0 or end < 0:
                    starts.append(max(0, start))
                    ends.append(end if end < 0 else _TO_END)
                    axes.append(i + 2)
            xi = slice_(m, x, starts, ends, axes, [1] * len(axes), f"{label}_piece{n}_input") if axes else x
            index = (slice(None), slice(None)) + tuple(slice(s, e) for s, e in combo)
            wi = gs.Constant(m.names(f"{wt.name}_piece{n}"), np.ascontiguousarray(w[index]))
            inputs = [xi, wi] + (list(conv.inputs[2:3]) if n == 0 and len(conv.inputs) > 2 and conv.inputs[2].name else [])
            parts.append(m.op("Conv", inputs, {**attrs, "pads": new_pads, "kernel_shape": [e - s for s, e in combo]},
                              name=m.names(f"{label}_piece{n}"), dtype=conv.outputs[0].dtype))
        return m.op("Sum", parts, name=m.names(f"{label}_sum"), dtype=conv.outputs[0].dtype)


@register
class SplitLargeKernelConv(RulePass):
    """Splits a Conv whose kernel exceeds the Cube's range into Convs of kernel pieces, summed.

    Cases:
      1. one axis or several over the limit (pieces are the cartesian product);
      2. pads larger or smaller than the piece offsets (a Slice or a pad per side), any group, a bias.
    """

    name = _NAME
    summary = "Conv with a kernel side over the Cube's limit (CANN: 255) -> Convs of kernel pieces on input slices, summed."
    kind = PassKind.LOWERING
    promise = KERNEL_SPLIT
    scored = True
    needs_target = True
    runs_before = (PassKind.FUSION,)
    rules = (_SplitKernel(),)
