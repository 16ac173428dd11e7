"""``graphpass calibrate``: the estimate against msprof's per-op timings from a real chip.

msprof (and torch_npu's profiler) write ``op_summary_*.csv`` with one row per task; the columns
read here are ``Op Name``, ``OP Type``, ``Task Type`` and ``Task Duration(us)`` (the headers of
Ascend/pytorch ``torch_npu/profiler/analysis/prof_common_func/_csv_headers.py``,
``OP_SUMMARY_SHOW_HEADERS``). Each row is matched to the graph's node of the same name (ATC keeps
ONNX node names; a UB-fused kernel carries the name of its first node), else, by its Ascend op
type, to the ONNX op whose op-info row names it. Rows of an op name that occurs several times
(several inferences) are averaged per name.

The measured and estimated totals per ONNX op type give a factor per op type; the corrected
target file is the target's profile with an ``[op_scale]`` table of those factors, which the
estimate applies to each node of that type (after fusion): with it, each op type's estimated
total is the measured one. Pass the file with ``--target FILE``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from graphpass.errors import UsageError

__all__ = ["COLUMNS", "OpTypeError", "read_op_summary", "calibrate", "corrected_profile_text"]

#: the op_summary columns calibrate reads
COLUMNS = ("Op Name", "OP Type", "Task Type", "Task Duration(us)")


@dataclasses.dataclass(frozen=True)
class OpTypeError:
    op: str
    measured_us: float
    estimated_us: float

    @property
    def factor(self) -> float:
        return self.measured_us / self.estimated_us if self.estimated_us > 0 else 1.0


def read_op_summary(path: str | Path) -> dict[str, tuple[str, float]]:
    """Op Name -> (OP Type, mean Task Duration in us). A missing column or a bad number is a
    UsageError naming the file, the row and the column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the op summary: {e}") from e
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise UsageError(f"{path}: not an msprof op_summary CSV: no column {', '.join(repr(c) for c in missing)}")
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    kind: dict[str, str] = {}
    for i, row in enumerate(reader, start=2):
        try:
            us = float(row["Task Duration(us)"])
        except (TypeError, ValueError):
            raise UsageError(f"{path}: row {i}: 'Task Duration(us)' is not a number: {row['Task Duration(us)']!r}") from None
        if not math.isfinite(us) or us < 0:
            raise UsageError(f"{path}: row {i}: 'Task Duration(us)' is not a finite non-negative number: {row['Task Duration(us)']!r}")
        name = row["Op Name"]
        total[name] += us
        count[name] += 1
        kind[name] = row["OP Type"]
    if not total:
        raise UsageError(f"{path}: the op summary has no rows")
    over = next((name for name, t in total.items() if not math.isfinite(t)), None)
    if over is not None:
        raise UsageError(f"{path}: the durations of op '{over}' add up past the largest float")
    return {name: (kind[name], total[name] / count[name]) for name in total}


def calibrate(graph: Any, csv_path: str | Path, target: Any, **estimate_options: Any) -> tuple[list[OpTypeError], list[str]]:
    """Per ONNX op type: measured (CSV) and estimated device time; and the CSV rows matched to
    no node. ``target``: a Target."""
    measured = read_op_summary(csv_path)
    cm = target.cost_model
    report = cm.estimate(graph, **estimate_options)
    by_name = {n["name"]: n for n in report.nodes if n.get("name")}
    by_ascend: dict[str, str] = {}
    for n in graph.nodes:
        info = cm.ops.lookup(n.op, n.domain)
        if info is not None:
            by_ascend.setdefault(info.ascend, n.op)
    est: dict[str, float] = defaultdict(float)
    for n in report.nodes:
        if n.get("engine") != "compile-time":
            est[n["op"]] += n["us"]
    meas: dict[str, float] = defaultdict(float)
    unmatched = []
    for name, (ascend_type, us) in measured.items():
        node = by_name.get(name)
        op = node["op"] if node is not None else by_ascend.get(ascend_type)
        if op is None:
            unmatched.append(name)
            continue
        meas[op] += us
    if not meas:
        shown = ", ".join(unmatched[:5]) + (", ..." if len(unmatched) > 5 else "")
        raise UsageError(f"{Path(csv_path)}: its {len(unmatched)} op names matched no node of the model and its op types "
                         f"no op of the model's ops ({shown}): an op summary of another model?")
    rows = [OpTypeError(op, meas[op], est.get(op, 0.0)) for op in sorted(meas)]
    return rows, unmatched


def corrected_profile_text(target: Any, rows: list[OpTypeError], csv_path: str | Path) -> str:
    """The target's profile file with an [op_scale] table of the measured factors."""
    base = target.profile.path.read_text(encoding="utf-8")
    lines = [line for line in base.rstrip("\n").split("\n")]
    old = dict(target.profile.op_scale)
    if "[op_scale]" in base:  # a calibrated file calibrated again: the factors compose
        cut = lines.index("[op_scale]")
        end = next((i for i in range(cut + 1, len(lines)) if lines[i].startswith("[")), len(lines))
        lines = lines[:cut] + lines[end:]
    out = "\n".join(lines).rstrip("\n") + "\n\n[op_scale]\n"
    out += f'src = "graphpass calibrate: measured / estimated device time per ONNX op type, from {Path(csv_path).name}"\n'
    for r in rows:
        if r.estimated_us > 0 and r.measured_us > 0:
            out += f'"{r.op}" = {r.factor * old.get(r.op, 1.0):.6g}\n'
    return out
