"""Conv (or inference BatchNormalization) followed by a per-channel constant Mul: the scale goes
into the Conv's weights and bias (the BN's scale and bias).

    Conv(x, W[, b]) -> Mul(., s)   =>  Conv(x, W * s[:, None, ...], b * s)
        s constant, float32, shaped [C], [C,1,1], [1,C,1,1] (per output channel) or a scalar

The "scale" layers of Caffe-converted models (the model zoo's Conv -> Mul -> Add) and
exporters' unfused affine BN tails. Exact up to float rounding, like BN folding. Mul is
commutative: the Conv may feed either input. Refused (with the reason) for a non-constant,
non-float32 or non-per-channel scale, or shared weights or bias; and when folding would move an
inf or NaN: a scale holding inf/NaN, a scaled weight or bias that overflows float32, or a nonzero
weight that the scale rounds to zero (an inf input would then give NaN, not ±inf).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import REASSOCIATION
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.ir.graph import peek_values
from graphpass.passes.fusion._common import channel_operand, keeps_specials, other_input, with_bias

__all__ = ["FuseConvScale"]


class _BatchNormMul(Rule):
    """BatchNormalization(x, scale, B, mean, var) -> Mul(s): scale * s and B * s."""

    pattern = ("BatchNormalization", "Mul")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        bn, mul = m.nodes
        verdict = channel_operand(bn, other_input(mul, bn.outputs[0]), "factor",
                                  {"scale": bn.inputs[1], "B": bn.inputs[2]}, ("scale", "B"))
        if not verdict:
            return verdict
        s, folded = self.folded(m)
        for i, label in ((1, "BN scale"), (2, "BN bias")):
            verdict = keeps_specials(f"factor (into the {label})", s, np.asarray(peek_values(bn.inputs[i])), folded[i], True)
            if not verdict:
                return verdict
        return MatchResult.success()

    def folded(self, m: Match) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        bn, mul = m.nodes
        c = bn.inputs[1].shape[0]
        s = np.broadcast_to(np.asarray(peek_values(other_input(mul, bn.outputs[0])), np.float64).reshape(-1), (c,))
        with np.errstate(all="ignore"):
            return s, {i: (np.asarray(peek_values(bn.inputs[i]), np.float64) * s).astype(np.float32) for i in (1, 2)}

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        bn, _ = m.nodes
        _, folded = self.folded(m)
        inputs = list(bn.inputs)
        for i, label in ((1, "scale"), (2, "bias")):
            inputs[i] = gs.Constant(m.names(f"{bn.name or 'bn'}_{label}_scaled"), folded[i])
        return m.copy(bn, inputs=inputs, reuse=True)


class _ConvMul(Rule):
    pattern = ("Conv", "Mul")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        conv, mul = m.nodes
        params = {"weight": conv.inputs[1]}
        if len(conv.inputs) > 2 and conv.inputs[2].name:
            params["bias"] = conv.inputs[2]
        verdict = channel_operand(conv, other_input(mul, conv.outputs[0]), "scale", params, tuple(params))
        if not verdict:
            return verdict
        s, weights, bias = self.folded(m)
        w = conv.inputs[1]
        verdict = keeps_specials("scale (into the weights)", s.reshape((-1,) + (1,) * (len(w.shape) - 1)),
                                 np.asarray(peek_values(w)), weights, True)
        if verdict and bias is not None:
            verdict = keeps_specials("scale (into the bias)", s, np.asarray(peek_values(conv.inputs[2])), bias, True)
        return verdict

    def folded(self, m: Match) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(the per-channel scale, the scaled weights and bias in float32)."""
        conv, mul = m.nodes
        w = conv.inputs[1]
        cout = w.shape[0]
        s = np.broadcast_to(np.asarray(peek_values(other_input(mul, conv.outputs[0])), np.float64).reshape(-1), (cout,))
        with np.errstate(all="ignore"):
            weights = (np.asarray(peek_values(w), np.float64) * s.reshape((cout,) + (1,) * (len(w.shape) - 1))).astype(np.float32)
            bias = None
            if len(conv.inputs) > 2 and conv.inputs[2].name:
                bias = (np.asarray(peek_values(conv.inputs[2]), np.float64) * s).astype(np.float32)
        return s, weights, bias

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        conv, _ = m.nodes
        w = conv.inputs[1]
        _, weights, bias = self.folded(m)
        inputs = list(conv.inputs)
        inputs[1] = gs.Constant(m.names(f"{w.name}_scaled"), weights)
        if bias is not None:
            inputs = with_bias(conv, gs.Constant(m.names(f"{conv.name or 'conv'}_bias_scaled"), bias), inputs)
        return m.copy(conv, inputs=inputs, reuse=True)


@register
class FuseConvScale(RulePass):
    """Folds a per-channel constant Mul after a Conv into the Conv's weights (and bias).

    Cases:
      1. Conv -> Mul(s): weights scaled per output channel;
      2. Conv with bias b -> Mul(s): bias b * s as well;
      3. a scalar scale multiplies every channel;
      4. BatchNormalization -> Mul(s): the BN's scale and bias times s.
    """

    name = "fuse_conv_scale"
    summary = "Fold a per-channel constant Mul after a Conv or inference BN into its weights (scale) and bias."
    kind = PassKind.FUSION
    promise = REASSOCIATION
    rules = (_ConvMul(), _BatchNormMul())
