"""Pad(mode=reflect), an AI CPU op on Ascend (MirrorPad), as Slices and a Concat per padded axis.

    Pad(x, pads, mode=reflect)   =>   for each axis a with pads (b, e), in order:
        x = Concat(Slice(x, b -> 0 step -1), x, Slice(x, -2 -> -2-e step -1), axis=a)
    on the last axis, whose AI Core Slice takes step 1 only (``data/op_limits.toml``, CANN's
    Slice page), a Gather of the mirrored indices [b, ..., 1] / [-2, ..., -1-e] instead; a
    one-element side is the unit-step Slice x[1:2] / x[-2:-1]

``Slice(x, starts=b, ends=0, steps=-1)`` is x[b], x[b-1], ..., x[1] (the mirror without the
edge) and ``Slice(x, starts=-2, ends=-2-e, steps=-1)`` is x[n-2], ..., x[n-1-e]: no size is
needed, so symbolic axes work. Axis after axis is how ONNX reflects corners (numpy's order).
Every output element is a copy of one input element: exact on every dtype, NaN, inf and -0.0
included. Opsets 10-21: pads as an attribute (10) or a constant input (11+), the axes input of
opset 18+ (negative axes included); the constant_value input is ignored by reflect mode.

Fires only where the target puts the Pad off AI Core (``data/op_limits.toml``: Pad
``aicpu_modes``); scored, so the cost model vetoes an application that does not pay. Refused,
with the reason: pads that are not constant, negative pads (a crop), a pad of at least the
axis' size (onnxruntime rejects it), an opset below 10 (Slice has no steps).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.cost_model.op_limits import load_op_limits
from graphpass.passes.lowering._knowledge import off_ai_core, opset, slice_

__all__ = ["LowerReflectPad"]

_NAME = "lower_reflect_pad"


def _mode(node: gs.Node) -> str:
    v = node.attrs.get("mode", "constant")
    return v.decode() if isinstance(v, bytes) else str(v)


def _rank(node: gs.Node) -> int | None:
    shape = node.inputs[0].shape if node.inputs else None
    return len(shape) if shape is not None else None


def _pads(node: gs.Node, rank: int) -> list[tuple[int, int]] | str:
    """Per-axis (begin, end) pads, or the reason they are not known."""
    if "pads" in node.attrs:  # opset < 11
        flat = [int(v) for v in node.attrs["pads"]]
        axes = list(range(rank))
    else:
        if len(node.inputs) < 2 or not isinstance(node.inputs[1], gs.Constant):
            return "the pads are not a constant"
        flat = [int(v) for v in np.asarray(node.inputs[1].values).ravel()]
        axes = list(range(rank))
        if len(node.inputs) > 3 and node.inputs[3].name:  # opset 18: axes
            if not isinstance(node.inputs[3], gs.Constant):
                return "the axes are not a constant"
            axes = [int(a) for a in np.asarray(node.inputs[3].values).ravel()]
            if any(not -rank <= a < rank for a in axes):
                return f"an axis of {axes} is out of range for rank {rank}"
            axes = [a % rank for a in axes]
            if len(set(axes)) != len(axes):
                return f"repeated axes {axes}"
    if len(flat) != 2 * len(axes):
        return f"{len(flat)} pads for {len(axes)} axes"
    out = [(0, 0)] * rank
    for k, a in enumerate(axes):
        out[a] = (flat[k], flat[k + len(axes)])
    return out


class _ReflectPad(Rule):
    pattern = ("Pad",)

    def check(self, m: Match, ctx) -> MatchResult:
        pad = m.anchor
        if _mode(pad) != "reflect":
            return MatchResult.fail(f"mode={_mode(pad)}: only reflect is lowered")
        if opset(m) < 10:
            return MatchResult.fail(f"opset {opset(m)}: Slice has no steps below opset 10")
        rank = _rank(pad)
        if rank is None:
            return MatchResult.fail("the input's rank is unknown")
        pads = _pads(pad, rank)
        if isinstance(pads, str):
            return MatchResult.fail(pads)
        if any(b < 0 or e < 0 for b, e in pads):
            return MatchResult.fail(f"negative pads {pads} (a crop)")
        shape = pad.inputs[0].shape
        for a, (b, e) in enumerate(pads):
            n = shape[a]
            if (b or e) and isinstance(n, (int, np.integer)) and max(b, e) >= n:
                return MatchResult.fail(f"pad {max(b, e)} on axis {a} of size {n}: reflect needs a pad below the size")
        if not any(b or e for b, e in pads):
            return MatchResult.fail("no axis is padded")
        why = off_ai_core(ctx, pad, f"pass '{_NAME}'")
        if why is None:
            return MatchResult.fail(f"Pad mode=reflect runs on AI Core on {ctx.target.name}: nothing to gain")
        m.pads = pads
        m.count("aicpu_pads_lowered")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        pad = m.anchor
        x = pad.inputs[0]
        label = pad.name or "pad"
        rank = len(m.pads)
        row = load_op_limits().get("Slice")
        unit_last = row is not None and row.last_axis_unit_step
        size = pad.inputs[0].shape[-1] if rank else None
        for a, (b, e) in enumerate(m.pads):
            if not (b or e):
                continue
            parts = []
            for side, count in (("begin", b), ("end", e)):
                if not count:
                    if side == "begin":
                        parts.append(x)
                    continue
                name = f"{label}_reflect{a}_{side}"
                if count == 1:  # one element: a unit-step Slice (x[1:2] or x[-2:-1])
                    part = slice_(m, x, [1] if side == "begin" else [-2], [2] if side == "begin" else [-1], [a], [1], name)
                elif a == rank - 1 and unit_last and (opset(m) >= 11 or isinstance(size, (int, np.integer))):
                    # the AI Core Slice takes only step 1 on the last axis: a Gather of the mirrored indices
                    idx = list(range(count, 0, -1)) if side == "begin" else list(range(-2, -2 - count, -1))
                    if opset(m) < 11:  # no negative indices before opset 11
                        idx = [i % int(size) for i in idx]
                    part = m.op("Gather", [x, gs.Constant(m.names(f"{name}_indices"), np.asarray(idx, np.int64))],
                                {"axis": a}, name=m.names(name), dtype=x.dtype)
                else:
                    part = slice_(m, x, [count] if side == "begin" else [-2], [0] if side == "begin" else [-2 - count],
                                  [a], [-1], name)
                parts.append(part)
                if side == "begin":
                    parts.append(x)
            x = m.op("Concat", parts, {"axis": a}, name=m.names(f"{label}_reflect{a}"), dtype=pad.inputs[0].dtype)
        return x


@register
class LowerReflectPad(RulePass):
    """Replaces a reflect-mode Pad that the target runs on AI CPU by Slices and Concats.

    Cases:
      1. pads as an attribute (opset 10) or a constant input (11+), any rank, several axes;
      2. the axes input (opset 18+), negative axes included;
      3. symbolic axis sizes (the slices need none).
    """

    name = _NAME
    summary = "Pad mode=reflect (AI CPU on Ascend) -> mirrored Slices (a Gather on the last axis) + Concat per padded axis, on AI Core."
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True  # the cost model vetoes an application that does not pay
    needs_target = True  # whether the Pad leaves AI Core is the target's fact (data/op_limits.toml)
    runs_before = (PassKind.FUSION,)
    rules = (_ReflectPad(),)
