"""Conv (or inference BatchNormalization) followed by a per-channel constant Add: the addend joins its bias.

    Conv(x, W[, b]) -> Add(., c)   =>  Conv(x, W, b + c)
        c constant, float32, shaped [C], [C,1,1], [1,C,1,1] (per output channel) or a scalar

Add is commutative: the Conv may feed either input. Refused (with the reason) for a
non-constant, non-float32 or non-per-channel addend, or a shared Conv bias; and when the summed
bias overflows float32 or a parameter holds inf/NaN (the fold would move an inf or NaN).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import REASSOCIATION
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.ir.graph import peek_values
from graphpass.passes.fusion._common import channel_operand, keeps_specials, other_input, with_bias

__all__ = ["FuseConvBias"]


def _addend(m: Match) -> gs.Tensor:
    conv, add = m.nodes
    return other_input(add, conv.outputs[0])


class _BatchNormAdd(Rule):
    """BatchNormalization(x, scale, B, mean, var) -> Add(d): B + d."""

    pattern = ("BatchNormalization", "Add")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        bn, add = m.nodes
        verdict = channel_operand(bn, other_input(add, bn.outputs[0]), "addend", {"B": bn.inputs[2]}, ("B",))
        if not verdict:
            return verdict
        d, b = self.folded(m)
        return keeps_specials("addend", d, np.asarray(peek_values(bn.inputs[2])), b, False)

    def folded(self, m: Match) -> tuple[np.ndarray, np.ndarray]:
        bn, add = m.nodes
        c = bn.inputs[1].shape[0]
        d = np.broadcast_to(np.asarray(peek_values(other_input(add, bn.outputs[0])), np.float32).reshape(-1), (c,))
        with np.errstate(all="ignore"):
            return d, (np.asarray(peek_values(bn.inputs[2]), np.float32) + d).astype(np.float32)

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        bn, _ = m.nodes
        _, b = self.folded(m)
        inputs = list(bn.inputs)
        inputs[2] = gs.Constant(m.names(f"{bn.name or 'bn'}_bias_fused"), b)
        return m.copy(bn, inputs=inputs, reuse=True)


class _ConvAdd(Rule):
    pattern = ("Conv", "Add")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        conv, _ = m.nodes
        params = {"weight": conv.inputs[1]}
        if len(conv.inputs) > 2 and conv.inputs[2].name:
            params["bias"] = conv.inputs[2]
        verdict = channel_operand(conv, _addend(m), "addend", params, ("bias",) if "bias" in params else ())
        if not verdict:
            return verdict
        c, old, new = self.folded(m)
        return keeps_specials("addend", c, old, new, False)

    def folded(self, m: Match) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the addend per channel, the old bias, the new bias); a missing bias is -0.0, the
        additive identity (x + -0.0 is x, -0.0 included)."""
        conv, _ = m.nodes
        cout = conv.inputs[1].shape[0]
        c = np.broadcast_to(np.asarray(peek_values(_addend(m)), dtype=np.float32).reshape(-1), (cout,))
        has_bias = len(conv.inputs) > 2 and conv.inputs[2].name
        old = np.asarray(peek_values(conv.inputs[2]), np.float32) if has_bias else np.full(cout, -0.0, np.float32)
        with np.errstate(all="ignore"):
            return c, old, (old + c).astype(np.float32)

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        conv, _ = m.nodes
        _, _, new = self.folded(m)
        return m.copy(conv, inputs=with_bias(conv, gs.Constant(m.names(f"{conv.name or 'conv'}_bias_fused"), new)), reuse=True)


@register
class FuseConvBias(RulePass):
    """Folds a per-channel constant Add after a Conv into the Conv's bias.

    Cases:
      1. Conv without bias -> Add(c): the Conv gets bias c;
      2. Conv with bias b -> Add(c): bias b + c;
      3. a scalar addend is broadcast over the channels;
      4. BatchNormalization -> Add(d): the BN's bias plus d.
    """

    name = "fuse_conv_bias"
    summary = "Fold a per-channel constant Add after a Conv or inference BN into its bias."
    kind = PassKind.FUSION
    runs_after = ("fold_batchnorm",)  # a folded BatchNormalization leaves a Conv bias to fold
    promise = REASSOCIATION
    ascend_name = "AABiasaddConvFusion"
    rules = (_ConvAdd(), _BatchNormAdd())
