"""Empty Concat inputs dropped (auto_optimizer's "empty Slice" knowledge, issue 25).

    Concat(axis=a)(x, Slice(y, starts=s, ends=s on axis a), z)   =>  Concat(axis=a)(x, z)
    Concat(axis=a)(x, t) with t of static size 0 on axis a        =>  x

Exporters write a Slice that yields nothing where a Python slice ran past its end (``x[:, k:k]``,
a cache of length 0) and concatenate it; on Ascend the empty Slice is still a kernel launch, and
ATC has been known to refuse zero-sized tensors. An input is empty on the Concat's axis when
that axis has size 0 in its static shape, or when it is a Slice whose constant start and end on
that axis are equal (with a positive step always empty; with a negative step only where the start
is not below minus the axis' size, since ONNX clamps that start to 0 but that end to -1).
Exact: a Concat's output is its inputs laid end to end along the axis, and an input of size 0
there contributes nothing; every input has the output's sizes on the other axes, so dropping one
changes no shape. An input empty on another axis is left alone (the Concat is then empty too,
and the other inputs' sizes still have to agree). At least one input stays; a Concat left with
one input is replaced by it (unless its output is a graph output: then it stays, with that one
input, and keeps the output's name). The Slice goes later with the dead nodes when nothing else reads it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RuleCounts, RulePass, Scope

__all__ = ["EliminateEmptySlices"]


_INT64_MAX = 2**63 - 1


def _rank(t: gs.Tensor) -> int | None:
    return len(t.shape) if t.shape is not None else None


def _ints(t: gs.Tensor) -> list[int] | None:
    if not isinstance(t, gs.Constant):
        return None
    v = np.asarray(t.values)
    if v.dtype.kind not in "iu" or v.ndim > 1:
        return None
    return [int(x) for x in v.ravel()]


def _slice_empty_axes(node: gs.Node, rank: int | None) -> set[int]:
    """Axes (non-negative) on which the Slice ``node`` selects nothing, from its constants alone.

    ONNX clamps a positive step's start and end to [0, d] alike, so an equal start and end is
    empty whatever d is. A negative step clamps the start to [0, d-1] but the end to [-1, d-1]:
    equal and non-negative they stay equal (empty); equal and below -d they become 0 and -1,
    which selects element 0 (not empty: Slice(x, -9, -9, step -3) on d = 4 gives x[0]). So a
    negative start needs d known and -d <= start. A backward Slice from INT64_MAX to INT64_MAX is
    left alone: the spec clamps both to d-1 (empty), onnxruntime selects every other element."""
    if node.op != "Slice" or not node.inputs:
        return set()
    steps = None
    if len(node.inputs) >= 3:  # opset 10+: starts, ends, axes?, steps? as inputs
        starts, ends = _ints(node.inputs[1]), _ints(node.inputs[2])
        axes = _ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else None
        if len(node.inputs) > 4 and node.inputs[4].name:
            steps = _ints(node.inputs[4])
            if steps is None:
                return set()
    else:  # opset 1-9: attributes, unit steps
        starts = [int(v) for v in node.attrs.get("starts", [])] or None
        ends = [int(v) for v in node.attrs.get("ends", [])] or None
        axes = [int(v) for v in node.attrs["axes"]] if "axes" in node.attrs else None
    if starts is None or ends is None or len(starts) != len(ends):
        return set()
    if axes is None:
        axes = list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts):
        return set()
    shape = node.inputs[0].shape
    out = set()
    for a, s, e, step in zip(axes, starts, ends, steps):
        if s != e or step == 0:
            continue
        if a < 0:
            if rank is None:
                continue
            a += rank
        if step < 0 and s >= _INT64_MAX:
            continue  # onnxruntime reads a backward Slice to INT64_MAX as "to the front" (the spec: empty)
        if step < 0 and s < 0:
            d = shape[a] if shape is not None and a < len(shape) else None
            if not isinstance(d, (int, np.integer)) or s < -int(d):
                continue
        out.add(a)
    return out


def _disputed(node: gs.Node) -> bool:
    """A Slice whose size the spec and onnxruntime disagree on (or that cannot be told): a
    backward step with an end of INT64_MAX (the spec clamps it to d-1, onnxruntime runs to the
    front), or steps/ends that are not constants. onnx's shape inference follows the spec, so its
    static 0 is not trusted there."""
    if len(node.inputs) < 5 or not node.inputs[4].name:
        return False  # unit steps (opset 1-9 attributes too)
    steps, ends = _ints(node.inputs[4]), _ints(node.inputs[2])
    if steps is None or ends is None or len(steps) != len(ends):
        return True
    return any(step < 0 and e >= _INT64_MAX for step, e in zip(steps, ends))


class _EmptyInputs(Rule):
    pattern = ("Concat",)

    def match(self, node: gs.Node, scope: Scope) -> Match | None:
        if node.op != "Concat" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) < 2:
            return None
        rank = _rank(node.outputs[0])
        if rank is None:
            rank = next((r for r in map(_rank, node.inputs) if r is not None), None)
        axis = int(node.attrs.get("axis", 0))
        if axis < 0:
            if rank is None:
                return None
            axis += rank
        keep, dropped = [], []
        for t in node.inputs:
            shape = t.shape
            empty = (shape is not None and axis < len(shape) and isinstance(shape[axis], (int, np.integer))
                     and int(shape[axis]) == 0)
            p = scope.producer(t, "Slice")
            if p is not None:  # a Slice: its constants decide, and a static 0 only where no runtime disputes it
                empty = (empty and not _disputed(p)) or axis in _slice_empty_axes(p, _rank(p.inputs[0]) if p.inputs else None)
            (dropped if empty else keep).append(t)
        if not dropped:
            return None
        if not keep:  # every input is empty: one stays, the output keeps its shape
            keep, dropped = [dropped[0]], dropped[1:]
            if not dropped:
                return None
        m = scope.match([node])
        m.keep, m.dropped = keep, dropped
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("inputs_dropped", len(m.dropped))
        if (len(m.keep) == 1 and not m.writes_graph_output() and m.keep[0].dtype is not None
                and m.keep[0].dtype == m.anchor.outputs[0].dtype):
            m.count("concats_removed")
            return m.keep[0]
        return m.copy(m.anchor, inputs=m.keep)


@register
class EliminateEmptySlices(RulePass):
    """Drops Concat inputs that are empty along the Concat's axis (a Slice with equal start and
    end there, or a static size of 0); a Concat left with one input is replaced by it."""

    name = "eliminate_empty_slices"
    summary = "Drop Concat inputs that are empty on the Concat's axis (empty Slices); exact."
    kind = PassKind.CLEANUP
    promise = EXACT

    rules = (_EmptyInputs(),)

    def summarize(self, counts: RuleCounts) -> dict:
        return {"inputs_dropped": counts.total("inputs_dropped"), "concats_removed": counts.total("concats_removed"),
                "rules": counts}
