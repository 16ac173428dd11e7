"""BatchNormalization folded into the preceding Conv, ConvTranspose or Gemm.

    Conv(x, W, b) -> BN(scale, bias, mean, var, eps)  =>  Conv(x, W * s, (b - mean) * s + bias)
        with s = scale / sqrt(var + eps), per output channel (axis 0 of W; axis 1 for
        ConvTranspose; the output axis of B for Gemm)

Exact in fp32 up to rounding. Refused (with the reason, for --explain) when a parameter is not a
constant, is float16, or is shared with another node; when the BN runs in training mode or uses
its extra outputs; for a grouped ConvTranspose; and for pre-opset-9 per-activation BN
(``spatial=0``). The fused node keeps the BN's output tensor, so names downstream do not change.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.infra import MatchResult, PassKind, register
from graphpass.infra.pass_base import REASSOCIATION
from graphpass.infra.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.graph import peek_values
from graphpass.passes.fusion._common import absorb, require_constants, set_bias

__all__ = ["FoldBatchNorm"]


class _FoldInto(RewriteRule):
    def check(self, m: Match, ctx) -> MatchResult:
        prod, bn = m.nodes
        if len(bn.inputs) < 5:
            return MatchResult.fail("BatchNormalization without its four parameters")
        if int(bn.attrs.get("training_mode", 0)) or any(t.name and (len(t.outputs) or t in m.graph.outputs) for t in bn.outputs[1:]):
            return MatchResult.fail("BatchNormalization in training mode (running statistics are used)")
        if int(bn.attrs.get("spatial", 1)) == 0:
            return MatchResult.fail("BatchNormalization with spatial=0 (per-activation statistics)")
        params = {"scale": bn.inputs[1], "bias": bn.inputs[2], "mean": bn.inputs[3], "var": bn.inputs[4]}
        weights = {"weight": prod.inputs[1]}
        if len(prod.inputs) > 2 and prod.inputs[2].name:
            weights["bias of the producer"] = prod.inputs[2]
        verdict = require_constants({**weights, **params}, prod, exclusive=tuple(weights))
        if not verdict:
            return verdict
        return self.extra_check(m)

    def extra_check(self, m: Match) -> MatchResult:
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        prod, bn = m.nodes
        scale, beta, mean, var = (np.asarray(peek_values(t), dtype=np.float64) for t in bn.inputs[1:5])
        s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w = np.asarray(peek_values(prod.inputs[1]), dtype=np.float64)
        old_b = np.asarray(peek_values(prod.inputs[2]), dtype=np.float64) if len(prod.inputs) > 2 and prod.inputs[2].name else 0.0
        new_w, new_b = self.fold(prod, w, old_b, s, mean, beta)
        prod.inputs[1] = gs.Constant(m.names(prod.inputs[1].name + "_bnfold"), new_w.astype(np.float32))
        set_bias(prod, gs.Constant(m.names(f"{prod.name or prod.op}_bias_bnfold"), new_b.astype(np.float32)))
        absorb(prod, bn)
        A.mark_created(prod, FoldBatchNorm.name, replaced=[prod, bn])
        return [bn]


class _IntoConv(_FoldInto):
    pattern = ("Conv", "BatchNormalization")

    def fold(self, prod, w, b, s, mean, beta):
        shape = (-1,) + (1,) * (w.ndim - 1)
        return w * s.reshape(shape), (b - mean) * s + beta


class _IntoConvTranspose(_FoldInto):
    pattern = ("ConvTranspose", "BatchNormalization")

    def extra_check(self, m: Match) -> MatchResult:
        if int(m.nodes[0].attrs.get("group", 1)) != 1:
            return MatchResult.fail("grouped ConvTranspose: output channels are split across groups")
        return MatchResult.success()

    def fold(self, prod, w, b, s, mean, beta):
        shape = (1, -1) + (1,) * (w.ndim - 2)
        return w * s.reshape(shape), (b - mean) * s + beta


class _IntoGemm(_FoldInto):
    pattern = ("Gemm", "BatchNormalization")

    def extra_check(self, m: Match) -> MatchResult:
        gemm = m.nodes[0]
        if float(gemm.attrs.get("beta", 1.0)) == 0.0 and len(gemm.inputs) > 2 and gemm.inputs[2].name:
            return MatchResult.fail("Gemm with beta=0 and a C input")
        return MatchResult.success()

    def fold(self, prod, w, b, s, mean, beta):
        if int(prod.attrs.get("transB", 0)):
            new_w = w * s.reshape(-1, 1)
        else:
            new_w = w * s.reshape(1, -1)
        c = float(prod.attrs.get("beta", 1.0)) * b
        prod.attrs["beta"] = 1.0
        return new_w, (c - mean) * s + beta


@register
class FoldBatchNorm(RulePass):
    """Folds inference BatchNormalization into the op before it.

    Cases:
      1. Conv (any group count) -> BN;
      2. ConvTranspose (group 1) -> BN;
      3. Gemm -> BN over the feature axis.
    """

    name = "fold_batchnorm"
    summary = "Fold inference BatchNormalization into the preceding Conv/ConvTranspose/Gemm."
    kind = PassKind.FUSION
    promise = REASSOCIATION
    ascend_name = "ConvBatchnormFusionPass"
    rules = (_IntoConv(), _IntoConvTranspose(), _IntoGemm())
