"""Find the first pass application that breaks numerics (LLVM's -opt-bisect-limit, for graphs).

Every pass application that changes the graph is numbered 1..N in a full run. Verification of
the result against the input model is monotone in practice (a broken value stays broken), so a
binary search over ``max_applications`` finds the first application k after which onnxruntime
outputs differ: log2(N) optimize + verify runs. The models after k-1 and k applications are
written as ``last_good.onnx`` and ``first_bad.onnx`` (device form, annotations kept).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx

from graphpass.check import verify as V
from graphpass.api import optimize
from graphpass.passes.framework.manager import PassRecord
from graphpass.passes.framework.registry import all_passes
from graphpass.ir import model_io
from graphpass.ir.model import ModelLike, as_proto
from graphpass.reporting import Report

__all__ = ["BisectResult", "bisect"]


@dataclasses.dataclass
class BisectResult(Report):
    """The first pass application after which the outputs differ (``first_bad``; None: none does)."""

    SCHEMA = "graphpass.bisect/1"

    applications: int
    first_bad: int | None
    record: PassRecord | None = None
    added: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)
    #: nodes kept under their label whose op changed: ``"relu2 (Relu -> Neg)"``
    changed: list[str] = dataclasses.field(default_factory=list)
    last_good: Path | None = None
    first_bad_model: Path | None = None
    detail: str = ""
    runs: int = 0
    fp16_emulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "schema": self.SCHEMA,
            "applications": self.applications,
            "runs": self.runs,
            "fp16_emulated": self.fp16_emulated,
            "first_bad": self.first_bad,
            "pass": None if r is None else {"name": r.name, "round": r.round, "nodes_before": r.nodes_before,
                                            "nodes_after": r.nodes_after, "stats": dict(r.stats)},
            "detail": self.detail,
            "nodes": {"removed": self.removed, "added": self.added, "changed": self.changed},
            "last_good": None if self.last_good is None else str(self.last_good),
            "first_bad_model": None if self.first_bad_model is None else str(self.first_bad_model),
        }

    def _lines(self) -> list[str]:
        lines = [f"{self.applications} pass applications changed the graph; {self.runs} optimize + verify runs"
                 + ("; fp16 emulated" if self.fp16_emulated else "")]
        if self.first_bad is None:
            return lines + [f"no failing application: {self.detail}"]
        r = self.record
        lines.append(f"first bad application: #{self.first_bad} {r.name} (round {r.round}, {r.nodes_before} -> "
                     f"{r.nodes_after} nodes, {', '.join(f'{k}={v}' for k, v in r.stats.items() if v) or 'no stats'})")
        lines.append(f"  {self.detail}")
        for label, items in (("removed", self.removed), ("added", self.added), ("changed", self.changed)):
            if items:
                more = f" ... and {len(items) - 12} more" if len(items) > 12 else ""
                lines.append(f"  nodes {label}: {', '.join(items[:12])}{more}")
        lines.append(f"wrote {self.last_good} and {self.first_bad_model}")
        return lines

    def to_table(self) -> str:
        return "".join(line + "\n" for line in self._lines())

    def to_markdown(self) -> str:
        lines = self._lines()
        return "\n".join(["### graphpass bisect", ""] + [f"- {x.strip()}" for x in lines] + [""])


def _node_ids(model: onnx.ModelProto) -> dict[str, str]:
    """node label -> op, labels being names or, for unnamed nodes, their first output."""
    return {(n.name or (n.output[0] if n.output else "?")): n.op_type for n in model.graph.node}


def bisect(model: ModelLike, out_dir: str | Path, rtol: float | None = None, atol: float | None = None,
           seed: int = 0, fp16_emulate: bool = True, **optimize_kwargs: Any) -> BisectResult:
    """Binary-search the first failing application; ``optimize_kwargs`` as for :func:`optimize`.

    Each run is judged like ``optimize --verify``: at ``rtol``/``atol`` when given, else at the
    tolerance the applied passes promise (exact when only exact passes ran); models holding
    float16 run with fp16 emulation unless ``fp16_emulate`` is False.

    ``model`` is a path, bytes, an ``onnx.ModelProto`` or a :class:`graphpass.Model` (coerced by
    :func:`graphpass.ir.model.as_proto`); it is not changed: every run optimizes a fresh copy.
    """
    original = as_proto(model)
    shapes = optimize_kwargs.get("input_shapes")
    feeds, reference, _, runner, _ = V.reference(original, seed=seed, input_shapes=shapes, fp16_emulate=fp16_emulate)
    V.check_deterministic("the model", original, runner, feeds, reference)
    emulated = [runner.emulated]

    def attempt(limit: int | None):
        result = optimize(original, max_applications=limit, seed=seed, **optimize_kwargs)
        proto = model_io.to_proto(result.graph, emit="device")
        applied = [r.name for r in result.report.passes if r.application]
        try:
            checked = V.check_outputs(reference, proto, feeds, promises=V.promises_of(applied, all_passes()),
                                      rtol=rtol, atol=atol, fp16_emulate=fp16_emulate, fp16=runner.fp16)
            emulated[0] = emulated[0] or checked.emulated
            bad = next(iter(checked.failures), None)
            if bad is not None:
                bad.note = (bad.note + f"; at {checked.tolerance}").strip("; ")
        except Exception as e:  # a model onnxruntime cannot run counts as broken
            bad = V.OutputComparison("<model>", float("inf"), float("inf"), 0.0, False, str(e).splitlines()[0])
        return result, proto, bad

    full, full_proto, bad = attempt(None)
    records = [r for r in full.report.passes if r.application]
    res = BisectResult(applications=len(records), first_bad=None, runs=1, fp16_emulated=emulated[0])
    if bad is None:
        res.detail = "the fully optimized model matches the original"
        return res
    lo, hi = 0, len(records)  # invariant: lo passes, hi fails
    good_proto = original
    bad_proto, bad_result = full_proto, full
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result, proto, verdict = attempt(mid)
        res.runs += 1
        if verdict is None:
            lo, good_proto = mid, proto
        else:
            hi, bad_proto, bad_result, bad = mid, proto, result, verdict
    if lo > 0 and good_proto is original:
        _, good_proto, _ = attempt(lo)
        res.runs += 1
    res.first_bad = hi
    res.record = next(r for r in bad_result.report.passes if r.application == hi)
    before, after = _node_ids(good_proto), _node_ids(bad_proto)
    res.removed = sorted(f"{k} ({v})" for k, v in before.items() if k not in after)
    res.added = sorted(f"{k} ({v})" for k, v in after.items() if k not in before)
    res.changed = sorted(f"{k} ({before[k]} -> {v})" for k, v in after.items() if k in before and before[k] != v)
    res.detail = V.describe(bad)
    res.fp16_emulated = emulated[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res.last_good = model_io.save_proto(good_proto, out / "last_good.onnx")
    res.first_bad_model = model_io.save_proto(bad_proto, out / "first_bad.onnx")
    return res
