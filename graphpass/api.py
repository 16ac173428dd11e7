"""The Python API the CLI is a thin layer over: load, optimize, save, to_proto, estimate.

Every entry point takes a model in any form - a path, bytes, an ``onnx.ModelProto`` or a
:class:`graphpass.Model` (a ``gs.Graph`` too, for compatibility) - and turns it into a Model
in one place, :func:`graphpass.ir.model.as_model`, which validates the first three the same way.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import onnx
import onnx_graphsurgeon as gs

import graphpass.check as _check_layer
from graphpass.cost_model.target import DEFAULT_TARGET, Target
from graphpass.passes import pipelines
from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.instruments import CostVeto, PhaseProfile, standard_instruments
from graphpass.passes.framework.manager import PassManager
from graphpass.passes.framework.pass_base import Pass
from graphpass.passes.framework.registry import all_passes
from graphpass.ir import model_io, profiling, serialize
from graphpass.ir.graph import count_nodes, op_histogram
from graphpass.ir.model import DEFAULT_EMIT, Model, ModelLike, as_model
from graphpass.report import OptimizeReport

__all__ = ["OptimizeResult", "estimate", "load", "optimize", "save", "to_proto"]


def load(
    source: ModelLike,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
    *,
    max_memory: int | str | None = None,
    freeze_initializer_inputs: bool = False,
    dims: Mapping[str, int] | None = None,
) -> Model:
    """Load a model into a :class:`graphpass.Model`.

    Args:
        source: a path, the serialized bytes, or a ModelProto (copied, never changed); a Model
            is returned as it is.
        input_shapes: fixes graph input dims before shape inference (static-shape specialization);
            -1 keeps a dim dynamic.
        shape_inference: run onnx shape inference so passes see tensor shapes and dtypes.
        max_memory: bytes (or "8G") graphpass may hold for this model: the file, its external
            data and every tensor a pass folds (see :mod:`graphpass.ir.limits`).
        freeze_initializer_inputs: an initializer that is also a graph input (IR >= 4) is a
            default the caller may override; by default it stays an input. True treats it as a
            constant (and drops the input), so passes can fold it.
        dims: symbolic dim name -> value (``{"batch": 1}``), fixed on every input and tensor
            that names it.

    Raises:
        BadModelError: ``source`` is not a valid model (one line saying why).
        UsageError: ``input_shapes`` or ``dims`` name no input or dim, or contradict each other.
    """
    return as_model(source, input_shapes=input_shapes, shape_inference=shape_inference, max_memory=max_memory,
                    freeze_initializer_inputs=freeze_initializer_inputs, dims=dict(dims) if dims else None)


def save(model: ModelLike, path: str | Path, external_data: bool | None = None, emit: str = DEFAULT_EMIT) -> Path:
    """Write ``model`` (any form) to ``path`` atomically; see :meth:`graphpass.Model.save`.
    ``emit`` defaults to ``"portable"``, as for :func:`to_proto`."""
    return serialize.save(as_model(model).graph, path, external_data=external_data, emit=emit)


def to_proto(model: ModelLike, emit: str = DEFAULT_EMIT) -> onnx.ModelProto:
    """``model`` (any form) as a complete ModelProto; see :meth:`graphpass.Model.to_proto`.
    ``emit`` defaults to ``"portable"``, as for :func:`save`."""
    return serialize.to_proto(as_model(model).graph, emit=emit)


def estimate(model: ModelLike, target: str | None = None, **options: Any):
    """The cost model's estimate of ``model`` (any form) on ``target`` (default: the default
    target); ``options`` as for the cost model (``precision_mode``, ``iterations_per_loop``,
    ``loop_trips``, ``input_shapes``). Returns a :class:`graphpass.cost_model.CostReport`.
    ``model`` is not changed."""
    from graphpass.cost_model import estimate as cost_estimate

    return cost_estimate(model, target, **options)


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize` returns: the optimized :class:`Model` and the report.

    ``graph`` is ``model.graph`` (the old field, kept for one release)."""

    model: Model
    report: OptimizeReport

    @property
    def graph(self) -> gs.Graph:
        return self.model.graph


def optimize(
    model: ModelLike,
    *,
    pipeline: str | None = None,
    passes: Sequence[str] | None = None,
    disable: Iterable[str] = (),
    enable: Iterable[str] = (),
    target: "str | Target" = DEFAULT_TARGET,
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
    dims: Mapping[str, int] | None = None,
) -> OptimizeResult:
    """Run a pipeline over ``model``: a path, bytes, a ModelProto, or a :class:`graphpass.Model`
    (a ``gs.Graph``, for compatibility).

    A Model (or graph) passed in is optimized in place and returned as ``result.model``; a
    path, bytes or ModelProto is loaded first (with ``input_shapes``, ``max_memory`` and
    ``freeze_initializer_inputs``) and never changed. Unknown pass, pipeline or target
    names raise :class:`graphpass.UsageError`; a malformed model raises
    :class:`graphpass.BadModelError`; ``verify_each`` failures raise
    :class:`graphpass.VerificationError`.

    ``max_memory`` is the memory budget of the run (model, external data, folded tensors;
    default :func:`graphpass.ir.limits.default_max_memory`);
    ``freeze_initializer_inputs`` lets initializers that are also graph inputs be treated as
    constants. Both reach the passes as ``PassContext.max_memory`` /
    ``PassContext.freeze_initializer_inputs`` and, for a model loaded here, the loader.

    ``input_shapes`` (-1 keeps a dim dynamic) and ``dims`` (symbolic dim name -> value,
    ``{"batch": 1}``) fix input dims: for a model loaded here before shape inference, and in
    any case through the ``specialize_shapes`` pass (``PassContext.input_shapes`` /
    ``PassContext.dims``).

    ``options`` holds each pass's constructor arguments, ``{"fold_constants": {"size_limit":
    1 << 20}}``: an unknown pass name is a UsageError, a misspelled option a TypeError naming
    the valid ones (checked before the model is loaded).
    """
    for arg, value in (("passes", passes), ("disable", disable), ("enable", enable)):
        if isinstance(value, str):  # iterating it would give one "pass" per letter
            raise TypeError(f"{arg} is a list of pass names, not a string: {arg}={value.split(',')!r}")
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    names = pipelines.build(pipeline, list(passes) if passes else None, set(disable), set(enable))
    target = Target.load(target)  # an unknown target fails before the model is read
    instances = pass_instances(names, options)
    if isinstance(model, (Model, gs.Graph)):
        m = as_model(model)
        label = name or m.graph.name or "<graph>"
    else:
        label = name or (str(model) if isinstance(model, (str, Path)) else "<model>")
        m = as_model(model, input_shapes=shapes or None, dims=dict(dims) if dims else None,
                     max_memory=max_memory, freeze_initializer_inputs=freeze_initializer_inputs)
    graph = m.graph
    cost_options = {"precision_mode": precision_mode, "iterations_per_loop": iterations_per_loop, "loop_trips": loop_trips}
    ctx = PassContext(
        target=target,
        input_shapes=shapes,
        cost_model=cost_model,
        cost_options=cost_options,
        seed=seed,
        max_memory=max_memory,
        freeze_initializer_inputs=freeze_initializer_inputs,
        dims=dict(dims or {}),
    )
    instruments = standard_instruments(
        cost_options=cost_options, verify_each=verify_each, seed=seed, input_shapes=shapes,
        dump_dir=Path(dump_dir) if dump_dir else None, on_pass=on_pass, max_applications=max_applications)
    veto = next(i for i in instruments if isinstance(i, CostVeto))
    if profiling.active() is not None:  # optimize --profile: each pass application is a phase
        instruments.append(PhaseProfile())
    nodes_before, ops_before = count_nodes(graph), op_histogram(graph)
    t0 = time.perf_counter()
    manager = PassManager(instances, max_rounds=max_rounds, instruments=instruments, disabled=set(disable))
    with profiling.phase("pipeline"):
        run = manager(graph, ctx)
    records = run.records
    seconds = time.perf_counter() - t0
    profiling.enter("report")  # left open by an error: the profile closes it when it stops
    report = OptimizeReport(
        model=label,
        target=target.name,
        passes=records,
        skipped=run.skipped,
        nodes_before=nodes_before,
        nodes_after=count_nodes(graph),
        ops_before=ops_before,
        ops_after=op_histogram(graph),
        seconds=seconds,
        cost_before_us=veto.initial_cost,
        cost_after_us=veto.final_cost,
        explanations=list(run.explanations),
    )
    for pass_name, why in run.unavailable.items():
        report.notes.append(f"{pass_name} skipped: {why}")
    final = None
    cm = ctx.target.cost_model
    if not ctx.target.estimates:
        report.notes.append(f"no cost model (target '{target.name}'): estimates are not available")
    elif report.nodes_after <= 20_000 or (iterations_per_loop == 1 and veto.final_report is not None):
        if iterations_per_loop == 1 and veto.final_report is not None and cost_model is None:
            final = veto.final_report  # the veto's report of the graph as the run left it: no second walk
        else:  # one more estimate: cheap below that size
            final = cm.estimate(graph, precision_mode=precision_mode, iterations_per_loop=1, loop_trips=loop_trips)
        # only the step term (launch + copies + sync) is divided by N, and only for a graph that can sink
        step = final.breakdown_us.get("step", 0.0)
        sinkable = not final.dynamic_regions
        report.iterations_per_loop = {n: final.total_us - step + (step / n if sinkable else step) for n in (1, 10, 100, 1000)}
    report.layout = layout_summary(graph, records, veto.initial_report, final)
    profiling.leave("report")
    return OptimizeResult(m, report)


def pass_instances(names: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pass]:
    """One instance per pass name, built with its options from ``options`` (``{pass: {option:
    value}}``). Every entry of ``options`` is checked, also for passes not in ``names``: an
    unknown pass is a UsageError, an unknown option a TypeError naming the valid ones."""
    from graphpass.errors import UsageError

    known = all_passes()
    for name, kw in (options or {}).items():
        if not isinstance(kw, Mapping):
            raise TypeError(f"options[{name!r}] is {type(kw).__name__} {kw!r}; each pass's options are a mapping "
                            f"of option names to values, e.g. {{'fold_constants': {{'size_limit': 1024}}}}")
    opts = {k: dict(v) for k, v in (options or {}).items()}
    for name, kw in opts.items():
        if name not in known:
            raise UsageError(f"options for unknown pass '{name}'; known passes: {', '.join(known)}")
        known[name](**kw)  # raises TypeError on a misspelled option
    return [known[n](**opts.get(n, {})) for n in names]



def layout_summary(graph: gs.Graph, records, before, after) -> dict[str, Any] | None:
    """TransData before and after (cost-model estimates) and why each one left is there."""
    from graphpass.ir import annotations as A
    from graphpass.ir.device_ops import is_transdata

    left = [{"node": n.name, "tensor": n.inputs[0].name if n.inputs else "", "src": str(n.attrs.get("src_format", "")),
             "dst": str(n.attrs.get("dst_format", "")), "reason": A.get(n, A.REASON) or ""}
            for n in graph.nodes if is_transdata(n)]
    # the plan written out, else one left implicit under the cost veto (GE makes it itself)
    plan = next((r for r in records if r.name == "propagate_layout" and r.modified), None)
    if plan is None:
        # (a plan that chose nothing still says which tensors kept their origin format, as written
        # out it did; not when every tensor kept it: written out, such a plan changed nothing)
        plan = next((r for r in reversed(records) if r.name == "propagate_layout" and "kept_implicit" in r.stats
                     and (r.stats.get("choice_nodes") or r.stats.get("greedy_transdata")
                          or (r.stats.get("origin_format") and not r.stats.get("nothing_planned")))), None)
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
        if "kept_implicit" in plan.stats and not plan.modified:
            out["kept_implicit"] = plan.stats["kept_implicit"]
        if plan.stats.get("origin_format"):
            out["origin_format"] = plan.stats["origin_format"]
    return out


def _mixed_precision_conversion(model, mode: str, keep_fp32):
    """The conversion ``graphpass.precision.analyze`` checks its findings on: the mixed_precision
    pass's (imported when first used; the analysis sits below the passes and cannot import them)."""
    from graphpass.passes.precision.mixed_precision import convert_model

    return convert_model(model, mode, keep_fp32)


# precision.register_converter's work, without importing the analysis (optimize never runs it)
_check_layer.converter = _mixed_precision_conversion
