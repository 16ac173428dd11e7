"""What the Ascend knowledge passes (issue 25) share: the target's verdict on a node, and
opset-aware builders of the plain ops their rewrites emit (Slice, Unsqueeze, Squeeze)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.ir.model import opset_of
from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.rewrite import Match

__all__ = ["off_ai_core", "opset", "ints", "slice_", "unsqueeze", "squeeze", "SUMMATION_ORDER", "KERNEL_SPLIT"]


def off_ai_core(ctx: PassContext, node: gs.Node, who: str) -> str | None:
    """Why the target puts ``node`` off AI Core by its kernel limits (data/op_limits.toml), or
    None when it runs there. Needs a hardware target (``who`` names the asker in the error)."""
    ctx.target.require(who)
    return load_op_limits().aicpu_reason(node)


def opset(m: Match) -> int:
    return opset_of(m.root if m.root is not None else m.graph) or m.graph.opset or 13


def ints(m: Match, label: str, values: Sequence[int]) -> gs.Constant:
    return gs.Constant(m.names(label), np.asarray(list(values), dtype=np.int64))


def slice_(m: Match, x: gs.Tensor, starts, ends, axes, steps, label: str) -> gs.Variable:
    """``Slice(x)`` with constant parameters (opset 10+: steps are inputs)."""
    return m.op("Slice", [x, ints(m, f"{label}_starts", starts), ints(m, f"{label}_ends", ends),
                          ints(m, f"{label}_axes", axes), ints(m, f"{label}_steps", steps)],
                name=m.names(label), dtype=x.dtype)


def unsqueeze(m: Match, x: gs.Tensor, axes: Sequence[int], label: str, shape=None) -> gs.Variable:
    if opset(m) >= 13:
        return m.op("Unsqueeze", [x, ints(m, f"{label}_axes", axes)], name=m.names(label), dtype=x.dtype, shape=shape)
    return m.op("Unsqueeze", [x], {"axes": list(axes)}, name=m.names(label), dtype=x.dtype, shape=shape)


def squeeze(m: Match, x: gs.Tensor, axes: Sequence[int], label: str, shape=None) -> gs.Variable:
    if opset(m) >= 13:
        return m.op("Squeeze", [x, ints(m, f"{label}_axes", axes)], name=m.names(label), dtype=x.dtype, shape=shape)
    return m.op("Squeeze", [x], {"axes": list(axes)}, name=m.names(label), dtype=x.dtype, shape=shape)


#: Float rounding from summing a window in parts (a split pool or a split convolution kernel):
#: the same terms, added in another order, and an average divided in two steps.
from graphpass.check.promise import Promise  # noqa: E402

SUMMATION_ORDER = Promise.tolerance(
    "summation-order", rtol=1e-5, atol=1e-6,
    reason="a window summed in parts: the same terms added in another order (and an average divided in two steps)")

#: A convolution's kernel split in pieces: each output is a sum of C * K products regrouped into
#: one partial sum per piece; its rounding grows with the number of terms (thousands for the
#: kernels this applies to), hence a wider bound than a pooling window's.
KERNEL_SPLIT = Promise.tolerance(
    "kernel-split", rtol=1e-4, atol=1e-5,
    reason="a convolution summed per kernel piece: the same products added in another grouping")


def splice_region(g: gs.Graph, region, new_nodes: dict, before: dict, after: dict) -> None:
    """Replace each node of ``region`` (unlinked here) in ``g``'s node order by its rewrite
    ``new_nodes[id(node)]``, with the nodes ``before[id(node)]`` ahead of it and
    ``after[id(node)]`` behind it (the region passes: lower_conv1d_to_conv2d, transpose_wide_conv)."""
    for n in region:
        n.inputs.clear()
        n.outputs.clear()
    nodes = []
    for n in g.nodes:
        if id(n) in new_nodes:
            nodes.extend(before.get(id(n), []))
            nodes.append(new_nodes[id(n)])
            nodes.extend(after.get(id(n), []))
        else:
            nodes.append(n)
    g.nodes = nodes
