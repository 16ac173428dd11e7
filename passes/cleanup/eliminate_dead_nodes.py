"""Dead-node elimination.

    node whose outputs reach no graph output (directly or through a subgraph capture)  =>  removed

Graph inputs and outputs are never removed, unless ``remove_unused_inputs=True`` is given for the
main graph's unused inputs. Subgraph bodies are cleaned first (innermost first), so a body that
stops reading an outer tensor lets that tensor's producer die in the same run. Subgraph inputs
are fixed by the Loop/Scan/If signature and are never touched.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, MERGE_EQUAL_CONSTANTS
from graphpass.ir.graph import (CONTROL_FLOW_OPS, SUBGRAPHLESS_DOMAINS, may_have_subgraph, node_dependencies,
                                remove_nodes, subgraph_holders, subgraphs_of)

__all__ = ["EliminateDeadNodes"]


def _clean(graph: gs.Graph) -> int:
    removed = 0
    for node in subgraph_holders(graph):
        for sub in subgraphs_of(node):
            removed += _clean(sub)
    dead = _dead_by_sweep(graph)
    if dead is None:
        dead = _dead_by_search(graph)
    return removed + remove_nodes(graph, dead)


def _dead_by_sweep(graph: gs.Graph) -> list[gs.Node] | None:
    """The dead nodes by one sweep from the last node to the first (set operations in C per
    node), or None when the sweep cannot tell: a node writes an unnamed tensor (a reader's unnamed
    input is no dependency), or the nodes are out of order (a dead node writes a tensor a live
    node reads: the search decides).

    A node is live when it writes a needed tensor (a graph output, or a named dependency of a live
    node) or writes nothing; what the sweep finds live is live. When no node it left dead writes
    a needed tensor, what it found live reads only what live nodes write: every node the search
    from the outputs reaches, it found (the search's live set is the least such set)."""
    nodes = graph.nodes
    if not all([t.name for n in nodes for t in n.outputs]):
        return None
    needed = set(map(id, graph.outputs))
    disjoint, need = needed.isdisjoint, needed.update
    cf, plain = CONTROL_FLOW_OPS, SUBGRAPHLESS_DOMAINS
    dead = []
    for n in reversed(nodes):
        outs = n.outputs
        if outs and disjoint(map(id, outs)):
            dead.append(n)
        elif n.op in cf or n.domain not in plain:  # may_have_subgraph: what its bodies capture too
            need(map(id, node_dependencies(n)))
        else:  # (an unnamed input is written by no node: needing it needs nothing)
            need(map(id, n.inputs))
    for n in dead:
        if not disjoint(map(id, n.outputs)):
            return None
    return dead


def _dead_by_search(graph: gs.Graph) -> list[gs.Node]:
    """The dead nodes by a search from the graph outputs (and the nodes that write nothing) back
    through the writers of what live nodes read, in any node order."""
    local = {id(n) for n in graph.nodes}
    live: set[int] = set()
    stack = [t for t in graph.outputs]
    for n in graph.nodes:  # a node without outputs exists for its effect only: keep it
        if not n.outputs:
            live.add(id(n))
            stack.extend(node_dependencies(n))
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        for p in t.inputs:
            if id(p) in local and id(p) not in live:
                live.add(id(p))
                # node_dependencies, its common case inline (a call per live node otherwise)
                stack.extend(node_dependencies(p) if may_have_subgraph(p) else [u for u in p.inputs if u.name])
    return [n for n in graph.nodes if id(n) not in live]


@register
class EliminateDeadNodes(Pass):
    """Removes every node no graph output depends on.

    Cases:
      1. a node whose outputs nothing reads;
      2. a chain that feeds only dead nodes;
      3. the same inside If/Loop/Scan bodies (the body's outputs are its roots);
      4. optionally (``remove_unused_inputs``), main-graph inputs nothing reads.
    """

    name = "eliminate_dead_nodes"
    summary = "Remove nodes whose results reach no graph output (inputs/outputs kept)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    #: every node no output depends on goes in one run (bodies first), and what stays is live
    idempotent = True

    def __init__(self, *, remove_unused_inputs: bool = False):
        """Args:
            remove_unused_inputs: also remove main-graph inputs nothing reads (case 4)."""
        self.remove_unused_inputs = bool(remove_unused_inputs)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        removed = _clean(graph)
        stats = {"removed": removed}
        if self.remove_unused_inputs:
            outs = {id(t) for t in graph.outputs}
            kept = [t for t in graph.inputs if len(t.outputs) or id(t) in outs]
            stats["inputs_removed"] = len(graph.inputs) - len(kept)
            graph.inputs = kept
        # a constant has no producer: merging equal ones changes no node's liveness or input's use
        return PassResult(bool(removed or stats.get("inputs_removed")), stats, survives=frozenset({MERGE_EQUAL_CONSTANTS}))
