"""Transpose cancellation and merging.

    Transpose(p1) -> Transpose(p2)            =>  Transpose([p1[j] for j in p2])
    Transpose(p) with p the identity          =>  removed
    Transpose(p1) -> Transpose(p2), composed identity  =>  both removed

A Transpose without ``perm`` reverses the axes; it is handled when the rank is known. The first
Transpose stays if something else reads its output. A graph output keeps its producer (the
composed Transpose), so graph output names never change.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.ir.graph import iter_graphs, remove_nodes, replace_uses
from graphpass.passes.cleanup._common import is_onnx_op, local_producer, outputs_free

__all__ = ["MergeTransposes"]


def _perm(node: gs.Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = node.inputs[0].shape if node.inputs else None
    if shape is None:
        return None
    return list(range(len(shape)))[::-1]


@register
class MergeTransposes(Pass):
    """Composes consecutive Transposes and drops identity ones.

    Cases:
      1. T1 -> T2: T2 reads T1's input with the composed permutation;
      2. a Transpose whose permutation is the identity disappears (unless it writes a graph output);
      3. T1 left without readers is removed.
    """

    name = "merge_transposes"
    summary = "Compose consecutive Transposes; remove identity Transposes."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"merged": 0, "identity_removed": 0}
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            local = {id(n) for n in g.nodes}
            dead = []
            for node in g.nodes:
                if not is_onnx_op(node, "Transpose") or not node.inputs:
                    continue
                p2 = _perm(node)
                if p2 is None:
                    continue
                first = local_producer(node.inputs[0], local, "Transpose")
                if first is not None:
                    p1 = _perm(first)
                    if p1 is not None and len(p1) == len(p2):
                        node.inputs[0] = first.inputs[0]
                        node.attrs["perm"] = [p1[j] for j in p2]
                        p2 = node.attrs["perm"]
                        stats["merged"] += 1
                        if outputs_free(first, g):
                            first.inputs.clear()
                            dead.append(first)
                if p2 == list(range(len(p2))) and id(node.outputs[0]) not in outs:
                    replace_uses(node.outputs[0], node.inputs[0])
                    node.inputs.clear()
                    dead.append(node)
                    stats["identity_removed"] += 1
            remove_nodes(g, dead)
        return PassResult(bool(stats["merged"] or stats["identity_removed"]), stats)
