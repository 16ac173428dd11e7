"""Small matching helpers for rules whose patterns are not simple chains (GELU, LayerNorm), and the
fused-kernel refusal rule they share. The engine that applies them is :mod:`graphpass.infra.rewrite`."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnx import TensorProto

from graphpass.ir.device_ops import FLOAT_TYPES, elem_type, function_type_conflict, typed_scalar

__all__ = ["producer_of", "const_value", "is_const", "no_broadcast", "operands", "fused_kernel_refusal", "dtype_name",
           "np_dtype"]


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


def no_broadcast(c: gs.Tensor, x: gs.Tensor) -> bool:
    """A one-element constant ``c`` combined with ``x`` leaves ``x``'s shape: ``c`` is rank 0, or
    ``x``'s rank is known and not below ``c``'s."""
    rank = len(c.shape) if c.shape is not None else None
    return rank == 0 or (rank is not None and x.shape is not None and rank <= len(x.shape))


def is_const(t: gs.Tensor, value: float, like: gs.Tensor | None = None) -> bool:
    """``t`` is a one-element constant equal to ``value`` exactly as ``t``'s type holds it (1/sqrt 2
    rounded to float32 for a float32 constant; no near miss matches). With ``like``: ``t`` has
    ``like``'s type and does not broadcast it to a higher rank."""
    v = const_value(t)
    if v is None:
        return False
    elem = elem_type(t.dtype)
    if like is not None and (elem != elem_type(like.dtype) or not no_broadcast(t, like)):
        return False
    want = typed_scalar(value, elem) if elem in FLOAT_TYPES else value
    return v == want


def operands(node: gs.Node) -> list[tuple[gs.Tensor, gs.Tensor]]:
    """Both orders of a commutative binary node's inputs."""
    a, b = node.inputs[0], node.inputs[1]
    return [(a, b), (b, a)]


#: The types a fused kernel (Gelu, LayerNormalization) keeps its promise in: in float16/bfloat16
#: one kernel differs from the decomposition, rounded at every step, by more than the tolerance.
FUSED_KERNEL_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)


def fused_kernel_refusal(graph: gs.Graph, label: str, device_op: str, elem: int | None, opset: int,
                         standard_since: int, body_since: int = 1) -> str | None:
    """Why a pattern cannot become one fused kernel (None if it can): its type is not one the
    fused-kernel promise holds in; or, below ``standard_since`` (where the standard op exists),
    the ``graphpass.ascend`` device op's body needs ``body_since`` or the model already holds
    that body typed for another type."""
    if elem not in FUSED_KERNEL_TYPES:
        name = TensorProto.DataType.Name(elem) if elem else "unknown"
        return (f"{label} of type {name}: one kernel differs from its decomposition by more than the promised "
                "tolerance (float32/float64 only)")
    if opset >= standard_since:
        return None
    if opset < body_since:
        return f"opset {opset}: the {device_op} device op's body needs opset {body_since}+"
    return function_type_conflict(graph, device_op, elem)  # one body per model and type


def dtype_name(elem: int | None) -> str | None:
    """The name transformer_ops.toml gives a float TensorProto type (None for another)."""
    return {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16",
            TensorProto.DOUBLE: "float64"}.get(elem) if elem else None


def np_dtype(elem: int):
    """The numpy dtype of a TensorProto type (bfloat16 through ml_dtypes, as onnx maps it)."""
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem)
