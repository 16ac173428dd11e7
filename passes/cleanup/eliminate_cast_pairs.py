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

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.ir.graph import iter_graphs, remove_nodes, replace_uses
from graphpass.ir.shapes import tensor_elem_type
from graphpass.passes.cleanup._common import is_onnx_op, local_producer, outputs_free

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


@register
class EliminateCastPairs(Pass):
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

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"pairs_merged": 0, "casts_removed": 0}
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            local = {id(n) for n in g.nodes}
            dead = []
            for node in g.nodes:
                if not is_onnx_op(node, "Cast") or not node.inputs or "to" not in node.attrs:
                    continue
                c = int(node.attrs["to"])
                src = node.inputs[0]
                first = local_producer(src, local, "Cast")
                if first is not None and "to" in first.attrs:
                    a = tensor_elem_type(first.inputs[0])
                    b = int(first.attrs["to"])
                    if a is not None and b in EXACT_CASTS.get(a, ()):
                        node.inputs[0] = first.inputs[0]
                        src = node.inputs[0]
                        stats["pairs_merged"] += 1
                        if outputs_free(first, g):
                            first.inputs.clear()
                            dead.append(first)
                            stats["casts_removed"] += 1
                if tensor_elem_type(src) == c and id(node.outputs[0]) not in outs:
                    replace_uses(node.outputs[0], src)
                    node.inputs.clear()
                    dead.append(node)
                    stats["casts_removed"] += 1
            remove_nodes(g, dead)
        modified = any(stats.values())
        return PassResult(modified, stats)
