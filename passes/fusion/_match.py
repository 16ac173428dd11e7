"""Small matching helpers for patterns that are not simple chains (GELU, LayerNorm)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

__all__ = ["producer_of", "const_value", "is_const", "operands"]


def producer_of(t: gs.Tensor, op: str, local: set[int]) -> gs.Node | None:
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is not None and p.op == op and id(p) in local and p.domain in (None, "", "ai.onnx"):
        return p
    return None


def const_value(t: gs.Tensor) -> float | None:
    if isinstance(t, gs.Constant):
        v = np.asarray(t.values)
        if v.size == 1:
            return float(v.ravel()[0])
    return None


def is_const(t: gs.Tensor, value: float, rtol: float = 1e-4) -> bool:
    v = const_value(t)
    return v is not None and abs(v - value) <= rtol * max(1.0, abs(value))


def operands(node: gs.Node) -> list[tuple[gs.Tensor, gs.Tensor]]:
    """Both orders of a commutative binary node's inputs."""
    a, b = node.inputs[0], node.inputs[1]
    return [(a, b), (b, a)]
