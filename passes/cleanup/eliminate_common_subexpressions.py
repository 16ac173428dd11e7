"""Common-subexpression elimination.

    a = op(x, y; attrs),  b = op(x, y; attrs)   =>  b's readers read a
    two small constants with equal dtype, shape and bytes  =>  one constant

Nodes are keyed by (domain, op, input identities, attributes) in topological order, so chains
of duplicates collapse in one sweep. Nondeterministic ops and nodes with subgraphs are never
merged. A duplicate whose output is a graph output is kept (output names never change).
Constants are deduplicated in the main graph only (up to 64 KiB each, compared byte for byte).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.ir.graph import iter_graphs, remove_nodes, replace_uses, replace_uses_many
from graphpass.passes.cleanup._common import is_pure

__all__ = ["EliminateCommonSubexpressions"]

_MAX_CONST_BYTES = 64 * 1024


def _attr_key(value):
    if isinstance(value, gs.Constant):
        arr = np.asarray(value.values)
        return ("T", arr.dtype.str, arr.shape, arr.tobytes())
    if isinstance(value, np.ndarray):
        return ("A", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, float):
        return ("f", repr(value))
    return value


def _dedupe_constants(graph: gs.Graph) -> int:
    main = {id(n) for n in graph.nodes}
    canon: dict[tuple, gs.Constant] = {}
    pairs: list[tuple[gs.Constant, gs.Constant]] = []
    seen: set[int] = set()
    for node in graph.nodes:
        for t in node.inputs:
            if not isinstance(t, gs.Constant) or id(t) in seen:
                continue
            seen.add(id(t))
            if any(id(c) not in main for c in t.outputs):
                continue
            try:  # size from the header first: never load a big lazy weight just to compare it
                if int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize > _MAX_CONST_BYTES:
                    continue
            except TypeError:
                continue
            arr = np.asarray(t.values)
            if arr.nbytes > _MAX_CONST_BYTES or arr.dtype.kind in "OSU":
                continue
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            first = canon.setdefault(key, t)
            if first is not t:
                pairs.append((t, first))
    replace_uses_many(pairs)  # one sweep: a Sum of 100,000 equal constants stays linear
    return len(pairs)


@register
class EliminateCommonSubexpressions(Pass):
    """Merges nodes that compute the same thing from the same inputs.

    Cases:
      1. equal small constants become one (main graph);
      2. pure nodes with identical op, inputs and attributes: the later one's readers read the
         earlier one's outputs, and the later one is removed;
      3. the same inside subgraph bodies, per body.
    """

    name = "eliminate_common_subexpressions"
    summary = "Merge duplicate nodes (same op, inputs, attributes) and equal small constants."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"constants_merged": _dedupe_constants(graph), "nodes_merged": 0}
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            table: dict[tuple, gs.Node] = {}
            dead = []
            # merged output -> the output it duplicates; keys read through it, and every reader is
            # rewired in one sweep at the end (per merge, a 100,000-input Sum was walked per merge)
            canon: dict[int, gs.Tensor] = {}
            pairs: list[tuple[gs.Tensor, gs.Tensor]] = []
            for node in g.nodes:
                if not node.outputs or not is_pure(node):
                    continue
                try:
                    key = (
                        node.domain or "",
                        node.op,
                        tuple(id(canon.get(id(t), t)) if t.name else None for t in node.inputs),
                        tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
                        len(node.outputs),
                    )
                    hash(key)
                except TypeError:
                    continue
                first = table.setdefault(key, node)
                if first is node:
                    continue
                if any(id(t) in outs for t in node.outputs):
                    continue
                if any(bool(a.name) != bool(b.name) for a, b in zip(node.outputs, first.outputs)):
                    continue
                for a, b in zip(node.outputs, first.outputs):
                    if a.name:
                        canon[id(a)] = b
                        pairs.append((a, b))
                dead.append(node)
                stats["nodes_merged"] += 1
            replace_uses_many(pairs)
            for node in dead:
                node.inputs.clear()
            remove_nodes(g, dead)
        return PassResult(bool(stats["constants_merged"] or stats["nodes_merged"]), stats)
