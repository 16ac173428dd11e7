"""What merge_slices and eliminate_empty_slices know about a Slice: its constant parameters in
either form (attributes before opset 10, inputs from 10), its axes made non-negative, and the
indices it takes along an axis (``_shape_values.slice_indices``: None where onnxruntime departs
from the spec)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.cleanup._shape_values import slice_indices

__all__ = ["SliceParams", "slice_params", "taken", "as_bounds"]

_INT64_MIN = int(np.iinfo(np.int64).min)


@dataclasses.dataclass
class SliceParams:
    """One Slice's constant parameters, one entry per sliced axis (axes non-negative)."""

    starts: list[int]
    ends: list[int]
    axes: list[int]
    steps: list[int]
    attr_form: bool  # Slice-1: starts/ends/axes attributes, no steps


def _const(node: gs.Node, i: int) -> list[int] | None | bool:
    """Input ``i`` as ints; False when absent (or the empty name), None when not a constant."""
    if i >= len(node.inputs) or not node.inputs[i].name:
        return False
    t = node.inputs[i]
    if not isinstance(t, gs.Constant):
        return None
    return [int(v) for v in np.asarray(t.values).ravel()]


def slice_params(node: gs.Node, rank: int | None) -> SliceParams | str:
    """The Slice's parameters, or the reason they cannot be read (runtime inputs, a negative
    axis on an input of unknown rank, repeated or out-of-range axes)."""
    if "starts" in node.attrs or len(node.inputs) == 1:  # Slice-1
        starts = [int(v) for v in node.attrs.get("starts", [])]
        ends = [int(v) for v in node.attrs.get("ends", [])]
        axes = [int(v) for v in node.attrs.get("axes", range(len(starts)))]
        steps, attr_form = [1] * len(starts), True
    else:
        got = [_const(node, i) for i in (1, 2, 3, 4)]
        if got[0] is None or got[1] is None or got[2] is None or got[3] is None or got[0] is False or got[1] is False:
            return "its starts, ends, axes or steps are computed at run time"
        starts, ends = got[0], got[1]
        axes = got[2] if got[2] is not False else list(range(len(starts)))
        steps = got[3] if got[3] is not False else [1] * len(starts)
        attr_form = False
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return "its starts, ends, axes and steps differ in length"
    if any(a < 0 for a in axes):
        if rank is None:
            return "a negative axis on an input of unknown rank"
        axes = [a + rank if a < 0 else a for a in axes]
    if len(set(axes)) != len(axes) or (rank is not None and any(not 0 <= a < rank for a in axes)):
        return "repeated or out-of-range axes"
    if any(s == 0 for s in steps):
        return "a step of 0"
    return SliceParams(starts, ends, axes, steps, attr_form)


def taken(p: SliceParams, k: int, n: int) -> range | None:
    """The indices entry ``k`` of ``p`` takes along an axis of length ``n`` (None: onnxruntime and
    the spec disagree, see slice_indices)."""
    return slice_indices(n, p.starts[k], p.ends[k], p.steps[k])


def as_bounds(r: range, n: int) -> tuple[int, int, int] | None:
    """Start, end, step of a Slice that takes exactly ``r`` along an axis of length ``n`` (checked
    with slice_indices), or None."""
    if len(r) == 0:
        start, end, step = 0, 0, 1
    else:
        start, step = r.start, r.step
        end = r.start + len(r) * step
        if end < 0:  # a backward slice through index 0: an end below -n means "past the front"
            end = _INT64_MIN
    got = slice_indices(n, start, end, step)
    return (start, end, step) if got is not None and list(got) == list(r) else None
