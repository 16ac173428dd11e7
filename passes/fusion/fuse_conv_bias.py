"""Conv (or inference BatchNormalization) followed by a per-channel constant Add: the addend joins its bias.

    Conv(x, W[, b]) -> Add(., c)   =>  Conv(x, W, b + c)
        c constant, float32, shaped [C], [C,1,1], [1,C,1,1] (per output channel) or a scalar

Add is commutative: the Conv may feed either input. Refused (with the reason) for a
non-constant, non-float32 or non-per-channel addend, or a shared Conv bias.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.infra import MatchResult, PassKind, register
from graphpass.infra.pass_base import REASSOCIATION
from graphpass.infra.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.graph import peek_values
from graphpass.passes.fusion._common import absorb, channel_operand, other_input, set_bias

__all__ = ["FuseConvBias"]


def _addend(m: Match) -> gs.Tensor:
    conv, add = m.nodes
    return other_input(add, conv.outputs[0])


class _BatchNormAdd(RewriteRule):
    """BatchNormalization(x, scale, B, mean, var) -> Add(d): B + d."""

    pattern = ("BatchNormalization", "Add")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        bn, add = m.nodes
        return channel_operand(bn, other_input(add, bn.outputs[0]), "addend", {"B": bn.inputs[2]}, ("B",))

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        bn, add = m.nodes
        c = bn.inputs[1].shape[0]
        d = np.broadcast_to(np.asarray(peek_values(other_input(add, bn.outputs[0])), np.float32).reshape(-1), (c,))
        b = np.asarray(peek_values(bn.inputs[2]), np.float32) + d
        bn.inputs[2] = gs.Constant(m.names(f"{bn.name or 'bn'}_bias_fused"), b.astype(np.float32))
        absorb(bn, add)
        A.mark_created(bn, FuseConvBias.name, replaced=[bn, add])
        return [add]


class _ConvAdd(RewriteRule):
    pattern = ("Conv", "Add")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        conv, _ = m.nodes
        params = {"weight": conv.inputs[1]}
        if len(conv.inputs) > 2 and conv.inputs[2].name:
            params["bias"] = conv.inputs[2]
        return channel_operand(conv, _addend(m), "addend", params, ("bias",) if "bias" in params else ())

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        conv, add = m.nodes
        c = np.asarray(peek_values(_addend(m)), dtype=np.float32).reshape(-1)
        cout = conv.inputs[1].shape[0]
        old = np.asarray(peek_values(conv.inputs[2]), np.float32) if len(conv.inputs) > 2 and conv.inputs[2].name else np.zeros(cout, np.float32)
        set_bias(conv, gs.Constant(m.names(f"{conv.name or 'conv'}_bias_fused"), (old + np.broadcast_to(c, (cout,))).astype(np.float32)))
        absorb(conv, add)
        A.mark_created(conv, FuseConvBias.name, replaced=[conv, add])
        return [add]


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
    promise = REASSOCIATION
    ascend_name = "AABiasaddConvFusion"
    rules = (_ConvAdd(), _BatchNormAdd())
