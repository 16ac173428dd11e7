"""TransData elimination: local rewrites of explicit ``graphpass.ascend::TransData`` nodes.

Rules, each linear in the graph (one sweep over the TransData nodes, repeated while a sweep
changes something, at most ``max_sweeps`` times):

1. **weights**: a TransData of a compile-time constant goes; the constant is annotated with
   the target format (ATC lays weights out at compile time: seed 002 item 4, "set the weight
   format up front");
2. **inverse pairs**: ``TransData(a->b) -> TransData(b->a)`` — the readers of the second read
   the first one's input;
3. **chains**: ``TransData(a->b) -> TransData(b->c)`` with the middle read by nothing else
   becomes one ``TransData(a->c)``;
4. **fan-out duplicates**: several TransData of one tensor to one format become one
   (GE's SameTransdataBreadthFusionPass);
5. **through a format-agnostic op**: ``TransData(a->b) -> X -> TransData(b->a)`` (X with one
   runtime input, every output read only by such TransData) runs X in format ``a`` and drops
   both conversions, when the cost model says X in ``a`` costs less than X in ``b`` plus the
   conversions (seed 002 item 9: convert once before the two GatherV2, not twice);
6. a TransData nobody reads goes.

Complements ``propagate_layout`` (whose optimal plan leaves nothing for rules 2-5) for graphs
whose TransData came from elsewhere: the greedy plan, a model written by another tool, or
TransData placed by hand.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir.graph import is_graph_output, replace_uses
from graphpass.passes.layout._common import is_transdata

__all__ = ["EliminateTransData"]


def _fmt(node: gs.Node, key: str) -> str:
    v = node.attrs.get(key, "ND")
    return "ND" if v in ("ND", "NCHW") else str(v)


def _readers(t: gs.Tensor) -> list[gs.Node]:
    out, seen = [], set()
    for n in t.outputs:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out


@register
class EliminateTransData(Pass):
    """Removes TransData that cancel, merge, or move through a format-agnostic op for less cost.

    Cases: weights converted at compile time; inverse pairs; chains composed; duplicates on
    fan-out merged; TransData(a->b) -> Relu -> TransData(b->a) runs the Relu in format a.
    """

    name = "eliminate_transdata"
    anchor_ops = frozenset({"TransData"})  # nothing to do in a graph without them
    summary = "TransData: inverse pairs cancel, chains compose, fan-out duplicates merge, weights convert at compile time."
    kind = PassKind.LAYOUT
    promise = EXACT
    ascend_name = "TransOpWithoutReshapeFusionPass"
    runs_after = ("propagate_layout",)  # it cleans up the TransData the layout plan writes

    def __init__(self, *, max_sweeps: int = 8):
        """Args:
            max_sweeps: passes over the graph within one application, while one changes something."""
        self.max_sweeps = int(max_sweeps)

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        stats = {"weights": 0, "inverse_pairs": 0, "chains": 0, "duplicates": 0, "moved_through": 0, "dead": 0}
        # moving a TransData through an op is priced by the target; without one only the
        # rewrites that never cost more (pairs, chains, duplicates, weights) run
        oracle = ctx.target.format_oracle(graph, **ctx.cost_options) if ctx.target.has_hardware else None
        for _ in range(self.max_sweeps):
            dead: set[int] = set()
            for node in graph.nodes:
                if id(node) in dead or not is_transdata(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
                    continue
                self._sweep_one(graph, node, dead, stats, oracle)
            if not dead:
                break
            graph.nodes = [n for n in graph.nodes if id(n) not in dead]
        return PassResult(any(stats.values()), stats)

    # -- rules ---------------------------------------------------------------------------

    def _drop(self, node: gs.Node, dead: set[int]) -> None:
        node.inputs.clear()
        node.outputs.clear()
        dead.add(id(node))

    def _sweep_one(self, graph: gs.Graph, td: gs.Node, dead: set[int], stats: dict, oracle) -> None:
        x, y = td.inputs[0], td.outputs[0]
        src, dst = _fmt(td, "src_format"), _fmt(td, "dst_format")
        out = is_graph_output(y, graph)
        if not out and not y.outputs:
            self._drop(td, dead)
            stats["dead"] += 1
            return
        if out:
            return  # the graph output keeps its name and its TransData
        if isinstance(x, gs.Constant):  # 1. weights
            if all(is_transdata(r) and _fmt(r, "dst_format") == dst for r in _readers(x)) or len(_readers(x)) == 1:
                A.set_format(x, dst)
            replace_uses(y, x)
            self._drop(td, dead)
            stats["weights"] += 1
            return
        if src == dst:
            replace_uses(y, x)
            self._drop(td, dead)
            stats["inverse_pairs"] += 1
            return
        for r in _readers(y):  # 2. inverse pairs and 3. chains (td feeding another TransData)
            if id(r) in dead or not is_transdata(r) or is_graph_output(r.outputs[0], graph):
                continue
            if _fmt(r, "src_format") != dst:
                continue
            z = r.outputs[0]
            if _fmt(r, "dst_format") == src:
                replace_uses(z, x)
                self._drop(r, dead)
                stats["inverse_pairs"] += 1
            elif len(_readers(y)) == 1:
                r.inputs[0] = x
                r.attrs["src_format"] = td.attrs.get("src_format", src)
                stats["chains"] += 1
        if not y.outputs:
            self._drop(td, dead)
            return
        # 4. fan-out duplicates: other TransData of x to the same format
        for other in _readers(x):
            if other is td or id(other) in dead or not is_transdata(other) or _fmt(other, "dst_format") != dst:
                continue
            if is_graph_output(other.outputs[0], graph) or len(other.inputs) != 1:
                continue
            replace_uses(other.outputs[0], y)
            self._drop(other, dead)
            stats["duplicates"] += 1
        # 5. through a format-agnostic op
        if oracle is not None:
            self._move_through(graph, td, dead, stats, oracle)

    def _move_through(self, graph: gs.Graph, td: gs.Node, dead: set[int], stats: dict, oracle) -> None:
        x, y = td.inputs[0], td.outputs[0]
        src, dst = _fmt(td, "src_format"), _fmt(td, "dst_format")
        if src not in ("ND", "NC1HWC0") or dst not in ("ND", "NC1HWC0"):
            return
        readers = _readers(y)
        if len(readers) != 1:
            return
        op = readers[0]
        if is_transdata(op) or any(is_graph_output(t, graph) for t in op.outputs):
            return
        runtime = [t for t in op.inputs if oracle.is_runtime(t)]
        if len(runtime) != 1 or runtime[0] is not y:
            return
        role = oracle.role(op)
        if role.kind != "choice" or any(f != dst for f in (role.outs5 if dst == "NC1HWC0" else role.outs)):
            return
        trailing: list[gs.Node] = []
        for t in op.outputs:
            rs = _readers(t)
            if not rs or not all(is_transdata(r) and _fmt(r, "src_format") == dst and _fmt(r, "dst_format") == src
                                 and not is_graph_output(r.outputs[0], graph) for r in rs):
                return
            trailing.extend(rs)
        before = oracle.node_us(op, role, dst == "NC1HWC0") + oracle.transdata_us(x, src, dst)
        before += sum(oracle.transdata_us(r.inputs[0], dst, src) for r in trailing)
        after = oracle.node_us(op, role, src == "NC1HWC0")
        if after >= before:
            return
        for i, t in enumerate(op.inputs):
            if t is y:
                op.inputs[i] = x
        for t in op.outputs:
            A.set_format(t, src)
        for r in trailing:
            replace_uses(r.outputs[0], r.inputs[0])
            self._drop(r, dead)
        if not y.outputs:
            self._drop(td, dead)
        stats["moved_through"] += 1

