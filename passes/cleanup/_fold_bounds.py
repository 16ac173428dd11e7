"""Output sizes of foldable nodes, computed from their inputs before onnxruntime runs them.

fold_constants asks :func:`bound_nodes` which nodes of a foldable set may be evaluated: every
tensor of the session gets its byte size from shapes (and, for ops whose output shape depends
on a value, from that constant value) first. A node whose output size cannot be bounded, grows
past the limit, or whose shape operand holds an invalid dim is left out, with its dependents.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir.shapes import static_shape

__all__ = ["bound_nodes", "valid_shape_operand", "judges_operand", "constant_source"]

_UNARY = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast", "CastLike", "Ceil", "Celu",
    "Cos", "Cosh", "DequantizeLinear", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish",
    "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "LogSoftmax", "Mish", "Neg", "Not", "QuantizeLinear",
    "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus",
    "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Hardmax", "CumSum", "Clip", "LpNormalization",
})
_BROADCAST = frozenset({
    "Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Equal", "Greater",
    "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub",
    "Sum", "Where", "Xor",
})
#: ops whose output shape depends on the value of an input (index of that input)
_VALUE_SHAPED = {"ConstantOfShape": 0, "Expand": 1, "Tile": 1, "Range": 0, "Reshape": 1, "Pad": 1,
                 "Resize": 1, "Upsample": 1, "OneHot": 1}
_MAX_SHAPE_VALUES = 1 << 16


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        big = [d for d in dims if d != 1]
        if len(set(big)) > 1:
            return None  # invalid broadcast: onnxruntime would fail; do not fold
        out.append(big[0] if big else 1)
    return out


def _value(t: gs.Tensor) -> np.ndarray | None:
    """The value of a small constant input (shape operands), without loading big weights."""
    if not isinstance(t, gs.Constant):
        return None
    shape = list(t.shape)
    if math.prod(shape) > _MAX_SHAPE_VALUES:
        return None
    try:
        return np.asarray(t.values)
    except Exception:  # noqa: BLE001 - unreadable value: no bound
        return None


def constant_source(t: gs.Tensor) -> gs.Constant | None:
    """``t`` itself when it is a constant, the value of the Constant node that writes it (onnxruntime
    makes that an initializer at load), else None."""
    if isinstance(t, gs.Constant):
        return t
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is not None and p.op == "Constant" and p.domain in (None, "", "ai.onnx") and isinstance(p.attrs.get("value"), gs.Constant):
        return p.attrs["value"]
    return None


def judges_operand(op: str, index: int) -> bool:
    """Whether :func:`valid_shape_operand` looks at input ``index`` of ``op`` (any other input is
    valid whatever it holds: a caller need not load the value)."""
    return op == "Range" or (_VALUE_SHAPED.get(op) == index and op not in ("Pad", "Resize", "Upsample", "OneHot"))


def valid_shape_operand(op: str, index: int, value: np.ndarray) -> bool:
    """Whether ``value`` is a legal shape operand for input ``index`` of ``op``.

    Reshape's shape holds dims >= -1 with at most one -1; Expand/Tile/ConstantOfShape operands
    hold dims >= 0; Range's bounds are scalars (onnxruntime runs a [1] tensor computed at run
    time, but refuses it as an initializer). A fold that would create any other operand (Cast of
    NaN to int64) is refused.
    """
    if op == "Range":
        return value.ndim == 0
    if _VALUE_SHAPED.get(op) != index or op in ("Range", "Pad", "Resize", "Upsample", "OneHot"):
        return True
    if value.dtype.kind not in "iu":
        return False
    flat = value.reshape(-1)
    if op == "Reshape":
        return bool((flat >= -1).all()) and int((flat == -1).sum()) <= 1
    return bool((flat >= 0).all())


def _out_shape(node: gs.Node, shapes: list[list[int] | None]) -> list[list[int]] | None:
    """Output shapes from input shapes and constant values; None when they cannot be bounded."""
    op = node.op
    ins = node.inputs
    if op in _UNARY and shapes and shapes[0] is not None:
        return [list(shapes[0])] * max(1, len(node.outputs))
    if op in _BROADCAST and shapes and all(s is not None for s in shapes):
        b = _broadcast([s for s in shapes])
        return None if b is None else [b]
    if op == "ConstantOfShape":
        v = _value(ins[0])
        return None if v is None or not valid_shape_operand(op, 0, v) else [[int(d) for d in v.reshape(-1)]]
    if op == "Expand" and shapes[0] is not None:
        v = _value(ins[1])
        if v is None or not valid_shape_operand(op, 1, v):
            return None
        b = _broadcast([shapes[0], [int(d) for d in v.reshape(-1)]])
        return None if b is None else [b]
    if op == "Tile" and shapes[0] is not None:
        v = _value(ins[1])
        if v is None or not valid_shape_operand(op, 1, v) or v.size != len(shapes[0]):
            return None
        return [[d * int(r) for d, r in zip(shapes[0], v.reshape(-1))]]
    if op == "Range":
        vals = [_value(t) for t in ins[:3]]
        if any(v is None or v.size != 1 for v in vals):
            return None
        start, limit, delta = (float(v.reshape(-1)[0]) for v in vals)
        if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
            return None
        return [[max(int(math.ceil((limit - start) / delta)), 0)]]
    if op == "Reshape" and shapes[0] is not None:
        v = _value(ins[1])
        if v is None or not valid_shape_operand(op, 1, v):
            return None
        dims = [int(d) for d in v.reshape(-1)]
        n = math.prod(shapes[0])
        allowzero = int(node.attrs.get("allowzero", 0))
        out = [shapes[0][k] if d == 0 and not allowzero and k < len(shapes[0]) else d for k, d in enumerate(dims)]
        if -1 in out:
            rest = math.prod(d for d in out if d != -1)
            if rest == 0 or n % rest:
                return None
            out[out.index(-1)] = n // rest
        return [out] if math.prod(out) == n else None
    if op == "Pad" and shapes[0] is not None:
        v = _value(ins[1]) if len(ins) > 1 else np.asarray(node.attrs.get("pads", []))
        rank = len(shapes[0])
        if v is None or v.size != 2 * rank or (len(ins) > 3 and ins[3].name):
            return None
        p = [int(d) for d in v.reshape(-1)]
        out = [shapes[0][k] + p[k] + p[k + rank] for k in range(rank)]
        return None if any(d < 0 for d in out) else [out]
    if op in ("Resize", "Upsample") and shapes[0] is not None:
        rank = len(shapes[0])
        sizes = _value(ins[3]) if op == "Resize" and len(ins) > 3 and ins[3].name else None
        if sizes is not None:
            return [[int(d) for d in sizes.reshape(-1)]] if sizes.size == rank and (sizes >= 0).all() else None
        k = 2 if op == "Resize" and len(ins) > 2 else 1
        scales = _value(ins[k]) if len(ins) > k and ins[k].name else None
        if scales is None or scales.size != rank or not np.isfinite(scales).all() or (scales < 0).any():
            return None
        return [[int(math.floor(d * float(s))) for d, s in zip(shapes[0], scales.reshape(-1))]]
    if op == "OneHot" and shapes[0] is not None:
        v = _value(ins[1])
        if v is None or v.size != 1:
            return None
        axis = int(node.attrs.get("axis", -1))
        out = list(shapes[0])
        out.insert(axis if axis >= 0 else len(out) + axis + 1, int(v.reshape(-1)[0]))
        return [out]
    return None


def _itemsize(t: gs.Tensor) -> int:
    try:
        return np.dtype(t.dtype).itemsize if t.dtype is not None else 8
    except TypeError:
        return 8


#: An intermediate fold_constants evaluates but never keeps (ReduceSum of a ConstantOfShape) may
#: be this many times the fold size limit: 64 MiB by default, far below a bomb's gigabytes.
SCRATCH_FACTOR = 64


def bound_nodes(nodes: list[gs.Node], limit: int, room: int) -> tuple[set[int], dict[str, int]]:
    """Which of ``nodes`` (a foldable set, topologically ordered) onnxruntime may evaluate.

    Args:
        limit: the fold size limit; an intermediate (evaluated, never kept: a result over the
            limit is not stored) may reach :data:`SCRATCH_FACTOR` times it, or 8x its node's
            inputs (a Cast to a wider type, a Transpose of a weight).
        room: bytes the whole session may hold (the memory budget left).

    Returns:
        the ids of the allowed nodes, and counts: ``too_large`` (an output over the limit),
        ``unbounded`` (no size from the inputs), ``deferred`` (needs a value computed in this
        batch: folded in the next round, once that value is a constant).
    """
    shapes: dict[int, list[int]] = {}
    allowed: set[int] = set()
    rejected: set[int] = set()
    produced: set[int] = set()
    stats = {"too_large": 0, "unbounded": 0, "deferred": 0}
    held = 0
    counted: set[int] = set()
    for n in nodes:
        produced.update(id(t) for t in n.outputs)
    for n in nodes:
        ins = [t for t in n.inputs]
        if any(id(t) in rejected for t in ins):
            rejected.update(id(t) for t in n.outputs)
            continue
        in_shapes: list[list[int] | None] = []
        in_bytes = 0
        for t in ins:
            if not t.name:
                in_shapes.append(None)
                continue
            s = shapes.get(id(t)) if id(t) in produced else static_shape(t)
            in_shapes.append(s)
            if s is not None:
                nbytes = math.prod(s) * _itemsize(t)
                in_bytes += nbytes
                if isinstance(t, gs.Constant) and id(t) not in counted:
                    counted.add(id(t))
                    held += nbytes
        outs = _out_shape(n, in_shapes)
        if outs is None:
            outs = [static_shape(t) for t in n.outputs]
            if any(s is None for s in outs):
                outs = None
        if outs is None:
            k = _VALUE_SHAPED.get(n.op)
            if k is not None and len(ins) > k and id(ins[k]) in produced:
                stats["deferred"] += 1
            else:
                stats["unbounded"] += 1
            rejected.update(id(t) for t in n.outputs)
            continue
        out_bytes = [math.prod(s) * _itemsize(t) for s, t in zip(outs, n.outputs)]
        if any(b > max(SCRATCH_FACTOR * limit, 8 * in_bytes) for b in out_bytes) or held + sum(out_bytes) > room:
            stats["too_large"] += 1
            rejected.update(id(t) for t in n.outputs)
            continue
        held += sum(out_bytes)
        for s, t in zip(outs, n.outputs):
            shapes[id(t)] = s
        allowed.add(id(n))
    return allowed, stats
