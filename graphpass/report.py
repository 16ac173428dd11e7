"""The optimization report: per pass time, nodes +/-, stats, cost before/after; op histograms.

Renders as a terminal table (rich), Markdown, or JSON. Cost figures come from the cost model
and are labelled as estimates everywhere they appear.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
from typing import Any

from graphpass.passes.framework.context import Explanation
from graphpass.passes.framework.manager import PassRecord

__all__ = ["OptimizeReport"]


def _fmt_stats(stats: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in stats.items() if v not in (0, None, "", False))


def _fmt_cost(us: float | None) -> str:
    return "-" if us is None else f"{us:,.1f}"


@dataclasses.dataclass
class OptimizeReport:
    model: str
    target: str
    passes: list[PassRecord]
    skipped: list[str]
    nodes_before: int
    nodes_after: int
    ops_before: collections.Counter
    ops_after: collections.Counter
    seconds: float
    cost_before_us: float | None = None
    cost_after_us: float | None = None
    explanations: list[Explanation] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: estimate per step for iterations_per_loop N (the big/small-loop setting), when costed
    iterations_per_loop: dict[int, float] = dataclasses.field(default_factory=dict)
    #: TransData before/after and the reason for each one left (see api.layout_summary)
    layout: dict[str, Any] | None = None

    # -- data ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "graphpass.optimize_report/1",
            "model": self.model,
            "target": self.target,
            "seconds": round(self.seconds, 4),
            "nodes": {"before": self.nodes_before, "after": self.nodes_after},
            "estimated_cost_us": {"before": self.cost_before_us, "after": self.cost_after_us,
                                  "note": "cost-model estimate, not a measurement"},
            "passes": [r.to_dict() for r in self.passes],
            "skipped": list(self.skipped),
            "ops": {
                op: {"before": self.ops_before.get(op, 0), "after": self.ops_after.get(op, 0)}
                for op in sorted(set(self.ops_before) | set(self.ops_after))
            },
            "explanations": [dataclasses.asdict(e) for e in self.explanations],
            "iterations_per_loop_us": {str(k): v for k, v in self.iterations_per_loop.items()},
            "layout": self.layout,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def _layout_lines(self) -> list[str]:
        lay = self.layout
        if not lay:
            return []

        def fmt(d):
            if not d:
                return "-"
            us = d.get("us")
            return f"{d['count']}" + (f" ({us:,.1f} us)" if us is not None else "")

        head = f"TransData (estimates): input graph {fmt(lay.get('before'))} -> {fmt(lay.get('after'))}"
        if lay.get("greedy") and lay.get("mode") == "optimal":
            head += f"; GE's greedy first-input rule would need {fmt(lay['greedy'])}"
        lines = [head]
        for why in lay.get("origin_format", []):
            lines.append(f"  kept in origin format: {why}")
        return lines

    def _applied(self) -> list[PassRecord]:
        return [r for r in self.passes if r.modified or r.rolled_back]

    # -- text ------------------------------------------------------------------------------

    def to_table(self, width: int = 110, all_passes: bool = False) -> str:
        from rich.console import Console
        from rich.table import Table

        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None, markup=False)
        head = (
            f"graphpass optimize {self.model}  target={self.target}  "
            f"nodes {self.nodes_before} -> {self.nodes_after}  ({self.seconds:.2f} s)"
        )
        console.print(head)
        if self.cost_before_us is not None:
            console.print(
                f"estimated cost (cost model, not measured): {_fmt_cost(self.cost_before_us)} us -> "
                f"{_fmt_cost(self.cost_after_us)} us"
            )
        t = Table(title=None, show_lines=False)
        for col, just in (("#", "right"), ("pass", "left"), ("round", "right"), ("time ms", "right"),
                          ("nodes", "right"), ("+/-", "right"), ("est. us", "right"), ("stats", "left")):
            t.add_column(col, justify=just)
        rows = self.passes if all_passes else self._applied()
        for r in rows:
            delta = r.nodes_after - r.nodes_before
            t.add_row(
                str(r.index), r.name + (" (rolled back)" if r.rolled_back else ""), str(r.round),
                f"{r.seconds * 1000:.1f}", str(r.nodes_after), f"{delta:+d}",
                _fmt_cost(r.cost_after_us), r.note or _fmt_stats(r.stats),
            )
        if not rows:
            console.print("no pass changed the graph")
        else:
            console.print(t)
        if self.skipped:
            console.print(f"disabled: {', '.join(self.skipped)}")
        h = Table(title="op histogram", show_lines=False)
        for col in ("op", "before", "after", "+/-"):
            h.add_column(col, justify="left" if col == "op" else "right")
        for op in sorted(set(self.ops_before) | set(self.ops_after), key=lambda o: (-self.ops_before.get(o, 0), o)):
            b, a = self.ops_before.get(op, 0), self.ops_after.get(op, 0)
            h.add_row(op, str(b), str(a), f"{a - b:+d}" if a != b else "")
        console.print(h)
        for line in self._layout_lines():
            console.print(line)
        left = (self.layout or {}).get("transdata", [])
        for d in left[:12]:
            console.print(f"  {d['src']} -> {d['dst']}  {d['tensor']}: {d['reason']}")
        if len(left) > 12:
            console.print(f"  ... {len(left) - 12} more (the JSON and Markdown reports list all)")
        if self.iterations_per_loop:
            console.print("iterations_per_loop (estimate per step): " + ", ".join(
                f"N={k}: {v:,.1f} us" for k, v in self.iterations_per_loop.items()))
        for n in self.notes:
            console.print(f"note: {n}")
        return buf.getvalue()

    def to_markdown(self) -> str:
        lines = [
            f"### graphpass optimize `{self.model}`",
            "",
            f"target `{self.target}` · nodes {self.nodes_before} → {self.nodes_after} · {self.seconds:.2f} s",
        ]
        if self.cost_before_us is not None:
            lines.append(
                f"· estimated cost {_fmt_cost(self.cost_before_us)} → {_fmt_cost(self.cost_after_us)} µs "
                "(cost-model estimate, not a measurement)"
            )
        lines += ["", "| # | pass | round | time ms | nodes | +/- | est. µs | stats |", "|---:|---|---:|---:|---:|---:|---:|---|"]
        for r in self._applied():
            lines.append(
                f"| {r.index} | `{r.name}`{' (rolled back)' if r.rolled_back else ''} | {r.round} | "
                f"{r.seconds * 1000:.1f} | {r.nodes_after} | {r.nodes_after - r.nodes_before:+d} | "
                f"{_fmt_cost(r.cost_after_us)} | {r.note or _fmt_stats(r.stats)} |"
            )
        if self.iterations_per_loop:
            lines += ["", "| iterations_per_loop | " + " | ".join(str(k) for k in self.iterations_per_loop) + " |",
                      "|---|" + "---:|" * len(self.iterations_per_loop),
                      "| est. µs per step | " + " | ".join(f"{v:,.1f}" for v in self.iterations_per_loop.values()) + " |"]
        lay_lines = self._layout_lines()
        if lay_lines:
            lines += ["", lay_lines[0].replace("->", "→")] + [f"- {x.strip()}" for x in lay_lines[1:]]
            left = (self.layout or {}).get("transdata", [])
            if left:
                lines += ["", "<details><summary>why each TransData is there</summary>", "",
                          "| tensor | from → to | reason |", "|---|---|---|"]
                lines += [f"| `{d['tensor']}` | {d['src']} → {d['dst']} | {d['reason']} |" for d in left]
                lines += ["", "</details>"]
        lines += ["", "<details><summary>op histogram</summary>", "", "| op | before | after |", "|---|---:|---:|"]
        for op in sorted(set(self.ops_before) | set(self.ops_after)):
            lines.append(f"| {op} | {self.ops_before.get(op, 0)} | {self.ops_after.get(op, 0)} |")
        lines += ["", "</details>", ""]
        return "\n".join(lines)
