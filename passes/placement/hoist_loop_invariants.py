"""Loop-invariant code motion for Loop and Scan bodies.

    Loop(M, cond, v) { body: a = f(outer, const); b = g(a, v_in) ... }
        =>  a = f(outer, const);  Loop(M, cond, v) { body: b = g(a, v_in) ... }

A body node is invariant when it is pure (deterministic, no side effects, no subgraph) and every
input is a constant, an outer-scope value, or the output of another invariant node. Invariant
nodes move in front of the loop, once instead of once per iteration; the body keeps reading
their outputs as outer-scope values. Exact, hardware-neutral, recursive: nested loops are done
innermost first, so a value invariant in both loops leaves both; loops inside If branches are
visited, but nothing is hoisted out of an If branch (that would run it when the branch is not
taken).

Because a hoisted node runs even when the loop would run zero times, a node that can fail on
unexpected inputs (an index out of range, a bad shape) is hoisted only when the trip count is
provably at least 1 (a constant M >= 1, or a static scan length >= 1); elementwise arithmetic
is hoisted regardless. A node whose output is a body output stays (the body must produce it).
RandomNormal/RandomUniform/Multinomial/Dropout and friends never move.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.infra import PassContext, PassKind, PassResult, register
from graphpass.infra.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir.graph import subgraphs_of
from graphpass.passes.cleanup._common import is_pure

__all__ = ["HoistLoopInvariants"]

#: Ops that cannot fail for any input values of a valid model (so they may run speculatively).
_CANNOT_FAIL = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
                          "Reciprocal", "LeakyRelu", "Clip", "Max", "Min", "Pow", "Cast", "Identity", "Transpose",
                          "Softmax", "Erf", "Floor", "Ceil", "Not", "And", "Or", "Equal", "Less", "Greater", "Where"})


def _runs_at_least_once(loop: gs.Node) -> bool:
    if loop.op == "Loop":
        m = loop.inputs[0] if loop.inputs else None
        return isinstance(m, gs.Constant) and int(np.asarray(m.values).ravel()[0]) >= 1
    n_state = len(loop.inputs) - int(loop.attrs.get("num_scan_inputs", 1))
    scan_in = loop.inputs[n_state] if len(loop.inputs) > n_state else None
    shape = scan_in.shape if scan_in is not None else None
    axes = loop.attrs.get("scan_input_axes")
    axis = int(axes[0]) if axes else 0
    return bool(shape) and isinstance(shape[axis], int) and shape[axis] >= 1


def _hoist(loop: gs.Node, body: gs.Graph, outer: gs.Graph, ctx: PassContext, name: str) -> list[gs.Node]:
    defined_in_body = {id(t) for t in body.inputs} | {id(t) for n in body.nodes for t in n.outputs}
    body_outputs = {id(t) for t in body.outputs}
    safe_all = _runs_at_least_once(loop)
    invariant: set[int] = set()
    moved: list[gs.Node] = []
    for node in body.nodes:  # topological order: producers before readers
        if not node.outputs or not is_pure(node) or any(id(t) in body_outputs for t in node.outputs):
            continue
        if not all((not t.name) or isinstance(t, gs.Constant) or id(t) not in defined_in_body or id(t) in invariant
                   for t in node.inputs):
            continue
        if not safe_all and node.op not in _CANNOT_FAIL:
            ctx.explain(name, node, f"{node.op} could fail when the {loop.op} runs zero times, "
                                    "and its trip count is not provably >= 1")
            continue
        invariant.update(id(t) for t in node.outputs)
        moved.append(node)
    if moved:
        ids = {id(n) for n in moved}
        body.nodes = [n for n in body.nodes if id(n) not in ids]
        for n in moved:
            A.mark_created(n, name, replaced=[n])
    return moved


@register
class HoistLoopInvariants(Pass):
    """Moves loop-invariant nodes out of Loop and Scan bodies.

    Cases:
      1. a node reading only constants and outer-scope values;
      2. chains of such nodes (in body order);
      3. nested loops, innermost first; loops inside If branches;
      4. speculation guard: nodes that can fail only move when the loop surely runs.
    """

    name = "hoist_loop_invariants"
    summary = "Move loop-invariant nodes out of Loop/Scan bodies (exact; recursive)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = False

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        hoisted = self._visit(graph, ctx)
        return PassResult(hoisted > 0, {"hoisted": hoisted})

    def _visit(self, graph: gs.Graph, ctx: PassContext) -> int:
        total = 0
        new_order: list[gs.Node] = []
        for node in list(graph.nodes):
            for sub in subgraphs_of(node):
                total += self._visit(sub, ctx)  # innermost first
            if node.op in ("Loop", "Scan") and node.domain in (None, "", "ai.onnx"):
                body = node.attrs.get("body")
                if isinstance(body, gs.Graph):
                    moved = _hoist(node, body, graph, ctx, self.name)
                    new_order.extend(moved)
                    total += len(moved)
            new_order.append(node)
        if total:
            graph.nodes = new_order
        return total
