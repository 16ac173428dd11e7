"""A 2-D MatMul followed by an Add becomes one Gemm.

    MatMul(A[M,K], B[K,N]) -> Add(., C)   =>  Gemm(A, B, C)     C broadcastable to [M, N]

Refused when a rank is not 2 or unknown, the addend does not broadcast to [M, N] one way, or
the dtype is not a float type (Gemm's integer types need opset 11).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import REASSOCIATION
from graphpass.passes.framework.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.shapes import static_shape
from graphpass.passes.fusion._common import other_input

__all__ = ["FuseMatMulAdd"]

_FLOAT = {"float32", "float16", "float64"}


def _addend(m: Match) -> gs.Tensor:
    mm, add = m.nodes
    return other_input(add, mm.outputs[0])


class _MatMulAdd(RewriteRule):
    pattern = ("MatMul", "Add")
    follow = (None,)

    def check(self, m: Match, ctx) -> MatchResult:
        mm, _ = m.nodes
        a, b, c = static_shape(mm.inputs[0]), static_shape(mm.inputs[1]), static_shape(_addend(m))
        if a is None or b is None or c is None:
            return MatchResult.fail("a MatMul or Add operand has an unknown or symbolic shape")
        if len(a) != 2 or len(b) != 2:
            return MatchResult.fail(f"MatMul of ranks {len(a)} and {len(b)}: Gemm needs 2-D operands")
        if str(mm.outputs[0].dtype) not in _FLOAT:
            return MatchResult.fail(f"dtype {mm.outputs[0].dtype} (Gemm fusion is done for float types only)")
        mn = [a[0], b[1]]
        if len(c) > 2 or any(d not in (1, want) for d, want in zip(c[::-1], mn[::-1])):
            return MatchResult.fail(f"addend shaped {c} does not broadcast to {mn}")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        mm, add = m.nodes
        out = add.outputs[0]
        gemm = gs.Node("Gemm", name=m.names(f"{mm.name or 'matmul'}_gemm"), inputs=[mm.inputs[0], mm.inputs[1], _addend(m)],
                       outputs=[], attrs={})
        add.outputs.clear()
        gemm.outputs.append(out)
        m.graph.nodes.append(gemm)
        A.mark_created(gemm, FuseMatMulAdd.name, replaced=[mm, add])
        return [mm, add]


@register
class FuseMatMulAdd(RulePass):
    """Turns MatMul + Add into Gemm (one Cube kernel with the bias in its epilogue).

    Cases:
      1. the MatMul feeds the Add's first or second input;
      2. the addend is a scalar, a row [N] / [1, N], a column [M, 1] or a full [M, N].
    """

    name = "fuse_matmul_add"
    summary = "Turn a 2-D MatMul followed by Add into one Gemm."
    kind = PassKind.FUSION
    promise = REASSOCIATION
    ascend_name = "ATbeMatMulElemwiseFusionPass"
    rules = (_MatMulAdd(),)
