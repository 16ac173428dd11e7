"""Placement and loop sinking: every node gets its engine; device-only loops are marked sunk.

    node                       =>  graphpass.engine = AICORE | AICPU | HOST   (from the cost model)
    Loop with an all-AI-Core, all-static-shape body  =>  graphpass.sink = device   (one launch, not one per iteration)

The engine comes from the target's op-info table, the node's dtypes and the precision mode
(ascend_facts.md §5): the same decision the estimate makes. It needs a hardware target
(``ctx.target``): without one it raises, and a pipeline under target ``none`` skips it. Every node not on AI Core is
explained (``--explain place_and_sink``), and so is every Loop that cannot sink, with the first
node that blocks it. A body sinks only when every tensor in it (inputs, outputs, every node's
outputs, nested bodies too) has a static shape: a data-dependent shape (NonZero, a TopK with a
runtime k, a Reshape to computed dims) or an unknown one means the body cannot be compiled once
for all iterations. Run after hoist_loop_invariants, which takes host work out of the bodies.
"""

from __future__ import annotations

import os

import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir.graph import iter_graphs
from graphpass.ir.shapes import refresh_shapes, static_shape

__all__ = ["PlaceAndSink"]

_LOOPS = frozenset({"Loop", "Scan"})


def _engine_blocker(body: gs.Graph, engines: dict[int, tuple[str, str]]) -> str | None:
    """A node of the body (nested bodies too) that is not on AI Core (case 3), or None."""
    for g in iter_graphs(body):
        for n in g.nodes:
            engine = engines.get(id(n), ("AICORE", ""))[0]
            if engine not in ("AICORE", "compile-time"):
                return f"{n.op} '{n.name}' runs on {engine}"
    return None


def _shape_blocker(body: gs.Graph, engines: dict[int, tuple[str, str]]) -> str | None:
    """A tensor of the body whose shape is not static (case 4: data dependent, symbolic or unknown)."""
    for g in iter_graphs(body):
        for t in list(g.inputs) + list(g.outputs):
            if static_shape(t) is None:
                return f"the shape of '{t.name}' is not static ({t.shape}): the body cannot compile once"
        for n in g.nodes:
            if engines.get(id(n), ("AICORE", ""))[0] == "compile-time":
                continue
            for t in n.outputs:
                if t.name and static_shape(t) is None:
                    return (f"the shape of '{t.name}' ({n.op} '{n.name}') is not static ({t.shape}): "
                            "data dependent or unknown, the body cannot compile once")
    return None


@register
class PlaceAndSink(Pass):
    """Annotates engines and sinks device-only loops.

    Cases:
      1. every node (subgraphs too) gets graphpass.engine;
      2. a Loop/Scan whose body runs entirely on AI Core with static shapes gets graphpass.sink = device;
      3. one that cannot is explained with the node that blocks it;
      4. or with the tensor whose shape is not static.
    """

    name = "place_and_sink"
    summary = "Annotate each node's engine (AI Core / AI CPU / host); mark device-only loops as sunk."
    kind = PassKind.PLACEMENT
    # engines and sinking depend on what the graph has become
    runs_after = (PassKind.LOWERING, PassKind.FUSION, PassKind.LAYOUT)
    promise = EXACT
    # scored: sinking a Loop changes the estimate (no launch + sync per iteration), and so does an
    # engine annotation replaced by the target's choice (the estimate follows annotations); the
    # cost model vetoes an application that makes the estimate rise (issue 21)
    scored = True
    needs_target = True  # engines come from the target's op table and profile

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        # placement is a hardware decision: the target's, never an assumed chip's
        target = ctx.target.require(f"pass '{self.name}'")
        shared = getattr(ctx, "placement", None)  # the cost veto's walk of this very graph (issue 22)
        if shared is not None and target is ctx.target:
            engines, report = shared
            if os.environ.get("GRAPHPASS_CHECK_SHARED_PLACEMENT", "") not in ("", "0"):  # a development check
                fresh, fresh_report = target.placement(graph, precision_mode=ctx.cost_options.get("precision_mode"))
                if fresh != engines or len(fresh_report.crossings) != len(report.crossings):
                    raise AssertionError("the cost veto's engines are not those of the graph place_and_sink runs on")
        else:
            engines, report = target.placement(graph, precision_mode=ctx.cost_options.get("precision_mode"))
        stats = {"AICORE": 0, "AICPU": 0, "HOST": 0, "sunk": 0, "not_sunk": 0, "crossings": len(report.crossings)}
        changed = 0
        # why each loop cannot sink; shapes are re-inferred (once) only if a body is blocked by
        # nothing but a shape an earlier rewrite left unknown
        blockers: dict[int, str | None] = {}
        shape_blocked = []
        for g in iter_graphs(graph):
            for node in [n for n in g.nodes if n.op in _LOOPS]:
                if engines.get(id(node), ("AICORE",))[0] != "compile-time":
                    body = node.attrs.get("body")
                    if not isinstance(body, gs.Graph):
                        blockers[id(node)] = "no body graph"
                        continue
                    blockers[id(node)] = _engine_blocker(body, engines) or _shape_blocker(body, engines)
                    if blockers[id(node)] is not None and blockers[id(node)].startswith("the shape"):
                        shape_blocked.append(node)
        if shape_blocked and refresh_shapes(graph):
            for node in shape_blocked:
                blockers[id(node)] = _shape_blocker(node.attrs["body"], engines)
        aicore = ("AICORE", "")
        get_meta, set_engine, ENGINE = A.stored_meta, A.set_engine, A.ENGINE
        for g in iter_graphs(graph):
            for node in g.nodes:
                engine, why = engines.get(id(node), aicore)
                if engine == "compile-time":
                    continue
                stats[engine] = stats.get(engine, 0) + 1
                d = get_meta(node)
                if d is None or d.get(ENGINE) != engine:  # A.get_engine(node) != engine
                    set_engine(node, engine)
                    changed += 1
                if engine != "AICORE":
                    ctx.explain(self.name, node, f"runs on {engine}: {why or 'no AI Core kernel'}")
                if node.op in _LOOPS:
                    blocker = blockers.get(id(node))
                    if blocker is None:
                        if A.get(node, A.SINK) != "device":
                            A.set(node, A.SINK, "device")
                            changed += 1
                        stats["sunk"] += 1
                    else:
                        stats["not_sunk"] += 1
                        ctx.explain(self.name, node, f"cannot sink: {blocker}")
        return PassResult(changed > 0, stats)
