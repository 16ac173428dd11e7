"""Exact Cast-pair elimination.

    Cast(A->B) -> Cast(B->C)   =>  Cast(A->C)        when A->B is exact (every A value is a B value)
    Cast(A->B) -> Cast(B->A)   =>  removed           when A->B is exact
    Cast(A->A)                 =>  removed

Only widening casts are exact: fp16->fp32->fp16 is a no-op, fp32->fp16->fp32 is NOT (it rounds
to fp16), and neither is int64->int32->int64 (it wraps). The input dtype A must be known.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RuleCounts, RulePass, Scope
from graphpass.ir.shapes import tensor_elem_type

__all__ = ["EliminateCastPairs", "EXACT_CASTS"]

_T = onnx.TensorProto
_INTS_SIGNED = [_T.INT8, _T.INT16, _T.INT32, _T.INT64]

#: A -> set of B such that casting A to B keeps every value exactly (so B -> A gives it back).
EXACT_CASTS: dict[int, set[int]] = {
    _T.BOOL: {_T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64, *_INTS_SIGNED, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT, _T.DOUBLE},
    _T.UINT8: {_T.UINT16, _T.UINT32, _T.UINT64, _T.INT16, _T.INT32, _T.INT64, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT, _T.DOUBLE},
    _T.INT8: {_T.INT16, _T.INT32, _T.INT64, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT, _T.DOUBLE},
    _T.UINT16: {_T.UINT32, _T.UINT64, _T.INT32, _T.INT64, _T.FLOAT, _T.DOUBLE},
    _T.INT16: {_T.INT32, _T.INT64, _T.FLOAT, _T.DOUBLE},
    _T.UINT32: {_T.UINT64, _T.INT64, _T.DOUBLE},
    _T.INT32: {_T.INT64, _T.DOUBLE},
    _T.FLOAT16: {_T.FLOAT, _T.DOUBLE},
    _T.BFLOAT16: {_T.FLOAT, _T.DOUBLE},
    _T.FLOAT: {_T.DOUBLE},
}


class _Pair(Rule):
    """Cases 1 and 2: an exact Cast A->B, then B->C (the first Cast stays if read elsewhere)."""

    pattern = ("Cast", "Cast")
    exclusive = False

    def check(self, m: Match, ctx) -> MatchResult:
        first, node = m.nodes
        if "to" not in first.attrs or "to" not in node.attrs:
            return MatchResult.fail("a Cast without 'to'")
        a, b = tensor_elem_type(first.inputs[0]), int(first.attrs["to"])
        if a is None:
            return MatchResult.fail("the first Cast's input type is unknown")
        if b not in EXACT_CASTS.get(a, ()):
            return MatchResult.fail(f"Cast {onnx.TensorProto.DataType.Name(a)} -> {onnx.TensorProto.DataType.Name(b)} "
                                    "is not exact (it rounds or wraps): the pair is not a round trip")
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        first, node = m.nodes
        src = first.inputs[0]
        m.count("pairs_merged")
        if tensor_elem_type(src) == int(node.attrs["to"]) and not m.writes_graph_output():
            return src
        return m.copy(node, inputs=[src])


class _SameType(Rule):
    """Case 3: a Cast to the type its input already has (not writing a graph output)."""

    pattern = ("Cast",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if (m is None or not anchor.inputs or "to" not in anchor.attrs or scope.is_output(anchor.outputs[0])
                or tensor_elem_type(anchor.inputs[0]) != int(anchor.attrs["to"])):
            return None
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        return m.anchor.inputs[0]


@register
class EliminateCastPairs(RulePass):
    """Removes Casts that cannot change a value.

    Cases:
      1. exact A->B followed by B->A: both go;
      2. exact A->B followed by B->C: one Cast A->C;
      3. a Cast to the type its input already has.
    """

    name = "eliminate_cast_pairs"
    summary = "Remove Cast pairs that are exact round trips (fp32->fp16->fp32 is kept)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    rules = (_Pair(), _SameType())

    def summarize(self, counts: RuleCounts) -> dict:
        # every node a rule removed or created is a Cast
        return {"pairs_merged": counts.total("pairs_merged"),
                "casts_removed": counts.total("removed") - counts.total("created"), "rules": counts}
