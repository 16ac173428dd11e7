"""A BatchNormalization between two Transposes that cancel, as a Mul and an Add on the original layout.

    Transpose(perm p) -> BN(scale, bias, mean, var, eps) -> Transpose(perm q),  q o p = identity
        =>  Add(Mul(x, S), B),  S = scale / sqrt(var + eps),  B = bias - mean * S
            (each a [C] vector put on axis p[1] of x: the axis the BN's channel axis came from)

The BN's channel axis is axis 1 of the transposed tensor, i.e. axis p[1] of x; after the second
Transpose the layout is x's again, so the per-channel scale and shift apply to x directly and
both Transposes go (auto_optimizer's knowledge_bn_folding). On Ascend a BN wants 5HD while
Transposes are ND islands: the three ops cost two TransData and a Transpose each way; Mul and
Add are format-agnostic elementwise ops.

onnxruntime computes an inference BN as x * S + B with S and B in the input's precision; here S
and B are computed in float64 and rounded once, so the pass declares the tolerance of
``fold_batchnorm`` (reassociation). Refused (for --explain): Transposes that do not cancel, a
BN in training mode or using its extra outputs, parameters that are not constant float32
vectors of one length, an input that is not float32, and values the fold would move: a
channel with var + eps <= 0, or S or B not finite.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphpass.ir.graph import peek_values
from graphpass.ir.shapes import tensor_elem_type
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import REASSOCIATION
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.passes.fusion._common import bn_inference_refusal, require_constants

__all__ = ["FoldTransposedBatchNorm"]


def _perm(node: gs.Node, rank: int | None) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is None:
        return list(range(rank - 1, -1, -1)) if rank is not None else None
    return [int(p) for p in perm]


class _TransposeBnTranspose(Rule):
    pattern = ("Transpose", "BatchNormalization", "Transpose")

    def check(self, m: Match, ctx) -> MatchResult:
        t0, bn, t1 = m.nodes
        x = t0.inputs[0]
        rank = len(x.shape) if x.shape is not None else None
        p, q = _perm(t0, rank), _perm(t1, rank)
        if p is None or q is None or len(p) != len(q):
            return MatchResult.fail("the Transposes' permutations are unknown")
        if [p[i] for i in q] != list(range(len(p))):
            return MatchResult.fail(f"perm {q} after perm {p} is not the identity: the Transposes do not cancel")
        if len(p) < 2:
            return MatchResult.fail("a BN needs a channel axis")
        refusal = bn_inference_refusal(bn, m.graph)
        if refusal is not None:
            return refusal
        if tensor_elem_type(x) != TensorProto.FLOAT:
            return MatchResult.fail("the input is not float32: the folded scale would be rounded to its type")
        params = dict(zip(("scale", "bias", "mean", "var"), bn.inputs[1:5]))
        verdict = require_constants(params, bn)
        if not verdict:
            return verdict
        vals = [np.asarray(peek_values(t), np.float64) for t in bn.inputs[1:5]]
        if len({v.shape for v in vals}) != 1 or vals[0].ndim != 1:
            return MatchResult.fail(f"parameters are not four vectors of one length: {[v.shape for v in vals]}")
        scale, beta, mean, var = vals
        c_axis = p[1]
        if x.shape is not None and isinstance(x.shape[c_axis], int) and x.shape[c_axis] != scale.size:
            return MatchResult.fail(f"{scale.size} channels for an axis of {x.shape[c_axis]}")
        with np.errstate(all="ignore"):
            var_eps = var + float(bn.attrs.get("epsilon", 1e-5))
            if np.any(~(var_eps > 0)):
                return MatchResult.fail("var + eps <= 0 in a channel: the BN gives inf/NaN there, a fold would not")
            s = scale / np.sqrt(var_eps)
            b = beta - mean * s
            s32, b32 = s.astype(np.float32), b.astype(np.float32)
        if not (np.all(np.isfinite(s32)) and np.all(np.isfinite(b32))):
            return MatchResult.fail("a folded scale or shift is not finite in float32")
        shape = [1] * len(p)
        shape[c_axis] = scale.size
        m.folded = (s32.reshape(shape), b32.reshape(shape))
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        t0, bn, t1 = m.nodes
        s, b = m.folded
        label = bn.name or "bn"
        mul = m.op("Mul", [t0.inputs[0], gs.Constant(m.names(f"{label}_scale_folded"), s)], name=m.names(f"{label}_mul"),
                   dtype=t1.outputs[0].dtype)
        return m.op("Add", [mul, gs.Constant(m.names(f"{label}_shift_folded"), b)], name=m.names(f"{label}_add"),
                    dtype=t1.outputs[0].dtype)


@register
class FoldTransposedBatchNorm(RulePass):
    """Folds Transpose -> BatchNormalization -> Transpose (cancelling perms) into Mul + Add.

    Cases:
      1. any rank and any cancelling pair of permutations (the channel lands on axis p[1] of x);
      2. a Transpose without perm (reversal): reversed twice cancels.
    """

    name = "fold_transposed_batchnorm"
    summary = "Transpose -> BatchNormalization -> Transpose (perms cancel) -> Mul + Add on the original layout."
    kind = PassKind.FUSION
    promise = REASSOCIATION
    rules = (_TransposeBnTranspose(),)
