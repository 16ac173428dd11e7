"""The Python API the CLI is a thin layer over: load, optimize, save."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import onnx_graphsurgeon as gs

from graphpass.passes import pipelines
from graphpass.cost_model import create as create_cost_model
from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.manager import PassManager
from graphpass.ir import model_io
from graphpass.ir.graph import count_nodes, op_histogram
from graphpass.report import OptimizeReport

__all__ = ["OptimizeResult", "optimize"]


@dataclasses.dataclass
class OptimizeResult:
    graph: gs.Graph
    report: OptimizeReport


def optimize(
    model: model_io.ModelSource | gs.Graph,
    *,
    pipeline: str | None = None,
    passes: Sequence[str] | None = None,
    disable: Iterable[str] = (),
    enable: Iterable[str] = (),
    target: str = "ascend910a",
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    verify_each: bool = False,
    dump_dir: str | Path | None = None,
    max_rounds: int = 4,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int = 0,
    cost_model: Any = None,
    precision_mode: str | None = None,
    iterations_per_loop: int = 1,
    loop_trips: int = 1,
    on_pass: Callable[[str, int, int, int], None] | None = None,
    name: str | None = None,
    max_applications: int | None = None,
    max_memory: int | None = None,
    freeze_initializer_inputs: bool = False,
) -> OptimizeResult:
    """Run a pipeline over ``model`` (a path, bytes, ModelProto, or an already loaded graph).

    A graph passed in is optimized in place and returned. Unknown pass, pipeline or target
    names raise :class:`graphpass.UsageError`; a malformed model raises
    :class:`graphpass.BadModelError`; ``verify_each`` failures raise
    :class:`graphpass.VerificationError`.

    ``max_memory`` is the memory budget of the run (model, external data, folded tensors;
    default :func:`graphpass.ir.limits.default_max_memory`);
    ``freeze_initializer_inputs`` lets initializers that are also graph inputs be treated as
    constants. Both reach the passes as ``PassContext.max_memory`` /
    ``PassContext.freeze_initializer_inputs`` and, for a model loaded here, the loader.
    """
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    names = pipelines.build(pipeline, list(passes) if passes else None, set(disable), set(enable))
    cm = cost_model if cost_model is not None else create_cost_model(target)
    if isinstance(model, gs.Graph):
        graph = model
        label = name or graph.name or "<graph>"
    else:
        label = name or (str(model) if isinstance(model, (str, Path)) else "<model>")
        graph = model_io.load(model, input_shapes=shapes or None,
                              max_memory=max_memory, freeze_initializer_inputs=freeze_initializer_inputs)
    ctx = PassContext(
        target=target,
        disabled=set(disable),
        enabled=set(enable),
        max_rounds=max_rounds,
        verify_each=verify_each,
        dump_dir=Path(dump_dir) if dump_dir else None,
        input_shapes=shapes,
        options={k: dict(v) for k, v in (options or {}).items()},
        cost_model=cm,
        cost_options={"precision_mode": precision_mode, "iterations_per_loop": iterations_per_loop, "loop_trips": loop_trips},
        seed=seed,
        on_pass=on_pass,
        max_applications=max_applications,
        max_memory=max_memory,
        freeze_initializer_inputs=freeze_initializer_inputs,
    )
    nodes_before, ops_before = count_nodes(graph), op_histogram(graph)
    t0 = time.perf_counter()
    manager = PassManager(names, ctx)
    records = manager.run(graph)
    seconds = time.perf_counter() - t0
    report = OptimizeReport(
        model=label,
        target=target,
        passes=records,
        skipped=manager.skipped,
        nodes_before=nodes_before,
        nodes_after=count_nodes(graph),
        ops_before=ops_before,
        ops_after=op_histogram(graph),
        seconds=seconds,
        cost_before_us=manager.initial_cost,
        cost_after_us=manager.final_cost,
        explanations=list(ctx.explanations),
    )
    final = None
    if not getattr(cm, "active", False):
        report.notes.append("no cost model (target 'none'): estimates are not available")
    elif report.nodes_after <= 20_000:  # one more estimate: cheap below that size
        final = cm.estimate(graph, precision_mode=precision_mode, iterations_per_loop=1, loop_trips=loop_trips)
        # only the step term (launch + copies + sync) is divided by N, and only for a graph that can sink
        step = final.breakdown_us.get("step", 0.0)
        sinkable = not final.dynamic_regions
        report.iterations_per_loop = {n: final.total_us - step + (step / n if sinkable else step) for n in (1, 10, 100, 1000)}
    report.layout = layout_summary(graph, records, manager.initial_report, final)
    return OptimizeResult(graph, report)



def layout_summary(graph: gs.Graph, records, before, after) -> dict[str, Any] | None:
    """TransData before and after (cost-model estimates) and why each one left is there."""
    from graphpass.ir import annotations as A
    from graphpass.ir.device_ops import is_transdata

    left = [{"node": n.name, "tensor": n.inputs[0].name if n.inputs else "", "src": str(n.attrs.get("src_format", "")),
             "dst": str(n.attrs.get("dst_format", "")), "reason": A.get(n, A.REASON) or ""}
            for n in graph.nodes if is_transdata(n)]
    plan = next((r for r in records if r.name == "propagate_layout" and r.modified), None)
    if plan is None and not left:
        return None

    def td(rep):
        if rep is None:
            return None
        t = rep.transdata or {}
        return {"count": int(t.get("explicit", 0)) + int(t.get("implicit", 0)), "us": round(float(t.get("us", 0.0)), 3)}

    out = {"before": td(before), "after": td(after) or {"count": len(left), "us": None}, "transdata": left}
    if plan is not None:
        out["mode"] = plan.stats.get("mode")
        out["greedy"] = {"count": plan.stats.get("greedy_transdata"), "us": plan.stats.get("greedy_transdata_us")}
        if plan.stats.get("origin_format"):
            out["origin_format"] = plan.stats["origin_format"]
    return out
