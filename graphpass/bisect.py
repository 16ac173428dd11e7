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
from graphpass.ir import model_io

__all__ = ["BisectResult", "bisect"]


@dataclasses.dataclass
class BisectResult:
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


def _node_ids(model: onnx.ModelProto) -> dict[str, str]:
    """node label -> op, labels being names or, for unnamed nodes, their first output."""
    return {(n.name or (n.output[0] if n.output else "?")): n.op_type for n in model.graph.node}


def bisect(model: model_io.ModelSource, out_dir: str | Path, rtol: float | None = None, atol: float | None = None,
           seed: int = 0, fp16_emulate: bool = True, **optimize_kwargs: Any) -> BisectResult:
    """Binary-search the first failing application; ``optimize_kwargs`` as for :func:`optimize`.

    Each run is judged like ``optimize --verify``: at ``rtol``/``atol`` when given, else at the
    tolerance the applied passes promise (exact when only exact passes ran); models holding
    float16 run with fp16 emulation unless ``fp16_emulate`` is False.
    """
    original = model_io.load_proto(model)
    shapes = optimize_kwargs.get("input_shapes")
    feeds, reference, _, runner, _ = V.reference(original, seed=seed, input_shapes=shapes, fp16_emulate=fp16_emulate)
    V.check_deterministic("the model", original, runner, feeds, reference)
    emulated = [runner.emulated]

    def attempt(limit: int | None):
        result = optimize(original, max_applications=limit, seed=seed, **optimize_kwargs)
        proto = model_io.to_proto(result.graph)
        applied = [r.name for r in result.report.passes if r.application]
        try:
            cand = V.Runner(proto, fp16_emulate)
            emulated[0] = emulated[0] or cand.emulated
            tol = V.tolerance_for(V.promises_of(applied), rtol, atol, fp16=runner.fp16 or cand.fp16)
            comps = V.compare(reference, cand.run(feeds), tol.rtol, tol.atol)
            bad = next((c for c in comps if not c.ok), None)
            if bad is not None:
                bad.note = (bad.note + f"; at {tol}").strip("; ")
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
