"""What the fusions share: parameter checks and the small rewiring steps."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphpass.passes.framework.pass_base import MatchResult
from graphpass.ir.device_ops import elem_type

__all__ = ["constant_param", "require_constants", "shared_refusal", "other_input", "with_bias", "per_output_channel",
           "channel_operand", "keeps_specials"]


def constant_param(t: gs.Tensor) -> np.ndarray | None:
    return np.asarray(t.values) if isinstance(t, gs.Constant) else None


_FLOAT32 = np.dtype(np.float32)


def require_constants(tensors: dict[str, gs.Tensor], owner: gs.Node, exclusive: tuple[str, ...] = ()) -> MatchResult:
    """Every tensor constant and float32; those in ``exclusive`` read by ``owner`` alone."""
    for label, t in tensors.items():
        if not isinstance(t, gs.Constant):
            return MatchResult.fail(f"{label} '{t.name}' is not a constant")
        dtype = t.dtype
        if dtype is _FLOAT32:  # (numpy's float32 dtype is one object: the common case without the enum lookup)
            continue
        elem = elem_type(dtype)
        if elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            name = TensorProto.DataType.Name(elem).lower()
            return MatchResult.fail(f"{label} '{t.name}' is {name}: folding in {name} would round the weights")
        if elem != TensorProto.FLOAT:
            return MatchResult.fail(f"{label} '{t.name}' is {TensorProto.DataType.Name(elem).lower() if elem else 'of unknown type'}, not float32")
    refusal = shared_refusal(tensors, owner, exclusive)  # (a refusal is falsy: not `or`)
    return refusal if refusal is not None else MatchResult.success()


def shared_refusal(tensors: dict[str, gs.Tensor], owner: gs.Node, exclusive: tuple[str, ...]) -> MatchResult | None:
    """The refusal of :func:`require_constants` for a tensor of ``exclusive`` that another node than
    ``owner`` reads, or None."""
    for label in exclusive:
        t = tensors[label]
        readers = [n for n in t.outputs if n is not owner]
        if readers:
            return MatchResult.fail(f"{label} '{t.name}' is shared with {readers[0].op} '{readers[0].name}'")
    return None


def other_input(node: gs.Node, t: gs.Tensor) -> gs.Tensor:
    """The operand of a binary ``node`` (Add, Mul) that is not ``t``."""
    return node.inputs[1] if node.inputs[0] is t else node.inputs[0]


def with_bias(node: gs.Node, bias: gs.Tensor, inputs: list[gs.Tensor] | None = None) -> list[gs.Tensor]:
    """``node``'s inputs (or ``inputs``) with ``bias`` as the third (Conv/ConvTranspose/Gemm), replaced or appended."""
    inputs = list(node.inputs if inputs is None else inputs)
    return inputs[:2] + [bias] + inputs[3:]


def per_output_channel(conv: gs.Node, c: gs.Tensor) -> MatchResult:
    """``c`` is a scalar or one value per output channel of ``conv`` (a Conv: weight dim 0; a
    BatchNormalization: its scale), laid out to broadcast along the channel axis only:
    [C] for a 1-D tensor, [C,1,1] or [1,C,1,1] for an NCHW one. Broadcasting ``c`` against the
    output must leave the output's shape: ``c``'s rank is at most the output's (a [1,C,1,1,1]
    operand would make a 4-D output 5-D), and the output's rank must be known."""
    if conv.op == "BatchNormalization":
        out_shape = conv.outputs[0].shape if conv.outputs[0].shape is not None else conv.inputs[0].shape
        cout, rank_out = conv.inputs[1].shape[0], len(out_shape) if out_shape is not None else None
    else:
        cout, rank_out = conv.inputs[1].shape[0], len(conv.inputs[1].shape)
    if rank_out is None or c.shape is None:
        return MatchResult.fail("the output's rank or the operand's shape is unknown: broadcasting could change the shape")
    shape = list(c.shape)
    if len(shape) > rank_out:
        return MatchResult.fail(f"operand of rank {len(shape)} would broadcast the rank-{rank_out} output up")
    numel = int(np.prod(shape)) if shape else 1
    if numel == 1:
        return MatchResult.success()
    per_channel = numel == cout and (
        shape == [cout] and rank_out == 2
        or (rank_out >= 2 and len(shape) >= rank_out - 1 and shape[-(rank_out - 1)] == cout
            and all(d == 1 for d in shape[len(shape) - (rank_out - 1) + 1:])
            and all(d == 1 for d in shape[: len(shape) - (rank_out - 1)]))
    )
    if not per_channel:
        return MatchResult.fail(f"operand shaped {shape} is not per output channel (C={cout})")
    return MatchResult.success()


def channel_operand(owner: gs.Node, operand: gs.Tensor, label: str, params: dict[str, gs.Tensor],
                    exclusive: tuple[str, ...]) -> MatchResult:
    """The check of every "fold a per-channel constant into ``owner``" rule: ``owner`` (a Conv, or
    a BatchNormalization in inference mode) and ``operand`` constant float32, the ``exclusive``
    parameters read by ``owner`` alone, and ``operand`` per output channel."""
    if owner.op == "BatchNormalization" and len(owner.outputs) > 1 and any(t.outputs for t in owner.outputs[1:]):
        return MatchResult.fail("training-mode BatchNormalization (running statistics are read)")
    verdict = require_constants({label: operand, **params}, owner, exclusive)
    if not verdict:
        return verdict
    return per_output_channel(owner, operand)


def keeps_specials(what: str, operand: np.ndarray, old: np.ndarray, new: np.ndarray, product: bool) -> MatchResult:
    """Folding a constant ``operand`` into parameters ``old`` (``new = old * operand`` when
    ``product``, else ``old + operand``; float32, operand broadcast to ``old``'s shape) keeps inf
    and NaN where the unfolded graph has them: ``operand`` finite (an inf scale gives ±inf per
    element unfolded, NaN in a folded sum); ``new`` finite (a folded parameter that overflows
    gives inf where the unfolded graph may not); for a product, no nonzero ``old`` that a nonzero
    ``operand`` rounds to zero (an inf input times it gives NaN, where unfolded it is ±inf)."""
    with np.errstate(all="ignore"):
        if not np.all(np.isfinite(operand)):
            return MatchResult.fail(f"the {what} holds inf or NaN")
        if not np.all(np.isfinite(new)):
            return MatchResult.fail(f"folding the {what} overflows float32 (or a parameter holds inf/NaN)")
        if product:
            f = np.broadcast_to(operand, np.shape(old))
            if np.any((np.asarray(old) != 0) & (np.asarray(new) == 0) & (f != 0)):
                return MatchResult.fail(f"folding the {what} rounds a nonzero parameter to zero (an inf input would give NaN)")
    return MatchResult.success()


def bn_inference_refusal(bn: gs.Node, graph: gs.Graph) -> "MatchResult | None":
    """Why a BatchNormalization cannot be folded as the inference-mode affine map it is (its
    parameters missing, training mode, spatial=0), or None (fold_batchnorm,
    fold_transposed_batchnorm)."""
    if len(bn.inputs) < 5:
        return MatchResult.fail("BatchNormalization without its four parameters")
    if int(bn.attrs.get("training_mode", 0)) or any(t.name and (len(t.outputs) or t in graph.outputs) for t in bn.outputs[1:]):
        return MatchResult.fail("BatchNormalization in training mode (running statistics are used)")
    if int(bn.attrs.get("spatial", 1)) == 0:
        return MatchResult.fail("BatchNormalization with spatial=0 (per-activation statistics)")
    return None
