"""Identity elimination.

    x -> Identity -> y -> consumers              =>  x -> consumers
    producer -> x -> Identity -> y (graph output) =>  producer -> y         (x renamed away)
    x -> Dropout(inference, mask unused) -> y    =>  as Identity
    x * 1, 1 * x, x / 1                          =>  as Identity (neutral elements)
    x + (-0.0), (-0.0) + x, x - (+0.0)           =>  as Identity (floats)
    x + 0, 0 + x, x - 0                          =>  as Identity (integers)

Kept when ``y`` is a graph output and ``x`` cannot take its name: ``x`` is a graph input, another
graph output, a constant, or comes from an enclosing scope. A Dropout is an identity only in
inference: no ``training_mode`` input, or a constant false one, and no consumer of its mask.
A neutral element goes only when the constant does not broadcast ``x`` to a bigger shape and the
result has ``x``'s dtype (both known). For floats the sign of a zero decides: ``-0.0 + (+0.0)`` is
``+0.0``, so ``x + 0`` and ``x - (-0.0)`` are not identities (kept), while ``x + (-0.0)`` and
``x - (+0.0)`` are, for every x (-0.0, NaN, inf included); ``x * 1`` and ``x / 1`` are (a NaN stays
a NaN). For integers all four are. So every removal is bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.ir.graph import iter_graphs, remove_nodes, replace_uses
from graphpass.passes.cleanup._common import is_onnx_op

__all__ = ["EliminateIdentity"]


#: op -> (neutral value, commutes, for floats: the sign bit the zero must have (None: any))
_NEUTRAL = {"Mul": (1.0, True, None), "Div": (1.0, False, None), "Add": (0.0, True, True), "Sub": (0.0, False, False)}


def _is_neutral(values: np.ndarray, unit: float, negative_zero: bool | None) -> bool:
    if not np.all(values == unit):
        return False
    if negative_zero is None or not np.issubdtype(values.dtype, np.floating):
        return True
    return bool(np.all(np.signbit(values) == negative_zero))


def _neutral_operand(node: gs.Node) -> gs.Tensor | None:
    """For ``x op c`` where c is the op's neutral element and changes nothing, ``x``."""
    unit, commutes, negative_zero = _NEUTRAL[node.op]
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    y = node.outputs[0]
    pairs = [(node.inputs[0], node.inputs[1])] + ([(node.inputs[1], node.inputs[0])] if commutes else [])
    for x, c in pairs:
        if not isinstance(c, gs.Constant) or isinstance(x, gs.Constant):
            continue
        if x.dtype is None or y.dtype is None:
            continue
        try:
            x_dtype, y_dtype = np.dtype(x.dtype), np.dtype(y.dtype)
        except TypeError:  # a type numpy lacks (bfloat16 as graphsurgeon holds it) or unknown
            continue
        values = np.asarray(c.values)
        if values.size > 4096 or not _is_neutral(values, unit, negative_zero):
            continue
        if x.shape is None or y.shape is None or list(x.shape) != list(y.shape) or len(values.shape) > len(x.shape):
            continue
        if not all(isinstance(d, (int, np.integer)) for d in x.shape):
            continue
        if x_dtype != y_dtype or values.dtype != x_dtype:
            continue
        return x
    return None


def _dropout_is_identity(node: gs.Node, graph_outputs: set[int]) -> bool:
    if len(node.inputs) >= 3 and node.inputs[2].name:
        mode = node.inputs[2]
        if not isinstance(mode, gs.Constant) or bool(np.asarray(mode.values)):
            return False
    if node.attrs.get("is_test", 1) == 0:  # opset < 7 training flag
        return False
    for mask in node.outputs[1:]:
        if mask.name and (len(mask.outputs) or id(mask) in graph_outputs):
            return False
    return True


@register
class EliminateIdentity(Pass):
    """Removes Identity nodes, inference-mode Dropout and neutral-element arithmetic (x * 1, x + 0, ...).

    Cases:
      1. ``y`` is an internal tensor: its consumers read ``x``;
      2. ``y`` is a graph output and ``x`` is a local intermediate: ``x``'s producer writes ``y``;
      3. Dropout in inference mode with an unused mask: treated as case 1/2;
      4. Mul/Div by a constant 1, Add of -0.0, Sub of +0.0 (of any zero for integers), the
         constant not broadcasting x: as case 1/2.
    """

    name = "eliminate_identity"
    summary = "Remove Identity nodes, inference-mode Dropout, and x*1, x/1, x+(-0.0), x-(+0.0) (x+0, x-0 for ints)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"identity": 0, "dropout": 0, "neutral": 0, "kept_at_output": 0}
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            ins = {id(t) for t in g.inputs}
            local = {id(n) for n in g.nodes}
            dead = []
            for node in g.nodes:
                neutral = None
                if is_onnx_op(node, *_NEUTRAL):
                    neutral = _neutral_operand(node)
                    if neutral is None:
                        continue
                elif not is_onnx_op(node, "Identity", "Dropout") or not node.inputs or not node.outputs:
                    continue
                if node.op == "Dropout" and not _dropout_is_identity(node, outs):
                    continue
                x, y = (neutral if neutral is not None else node.inputs[0]), node.outputs[0]
                if id(y) not in outs:
                    replace_uses(y, x)
                elif (
                    id(x) not in outs
                    and id(x) not in ins
                    and not isinstance(x, gs.Constant)
                    and len(x.inputs) == 1
                    and id(x.inputs[0]) in local
                ):
                    prod = x.inputs[0]
                    node.outputs.clear()
                    node.inputs.clear()
                    prod.outputs[prod.outputs.index(x)] = y
                    replace_uses(x, y)
                else:
                    stats["kept_at_output"] += 1
                    continue
                dead.append(node)
                stats["identity" if node.op == "Identity" else "dropout" if node.op == "Dropout" else "neutral"] += 1
            remove_nodes(g, dead)
        return PassResult(bool(stats["identity"] or stats["dropout"] or stats["neutral"]), stats)
