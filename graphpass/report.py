"""The optimization report: per pass time, nodes +/-, stats, cost before/after; op histograms.

Renders as a terminal table (rich), Markdown, or JSON. Cost figures come from the cost model
and are labelled as estimates everywhere they appear.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

from graphpass.passes.framework.context import Explanation
from graphpass.passes.framework.manager import PassRecord
from graphpass.reporting import Report, clip, group_messages, short_stats, text_console

__all__ = ["OptimizeReport"]


_SKIPPED = re.compile(r"^([a-z][a-z0-9_]*) skipped: (.*)$", re.S)

#: the per-pass table and the op histogram are for -v; every detail is in --report files
MORE = "-v: per-pass table and op histogram; -vv: everything; --report FILE.json|FILE.md: every detail"


def _fmt_cost(us: float | None) -> str:
    return "-" if us is None else f"{us:,.1f}"


@dataclasses.dataclass
class OptimizeReport(Report):
    SCHEMA = "graphpass.optimize_report/1"

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
            "schema": self.SCHEMA,
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
        if lay.get("kept_implicit"):
            lines[0] += "; the plan left to GE (implicit)"
            lines.append(f"  plan left implicit: {lay['kept_implicit']}")
        for why in lay.get("origin_format", []):
            lines.append(f"  kept in origin format: {why}")
        return lines

    def _applied(self) -> list[PassRecord]:
        return [r for r in self.passes if r.modified or r.rolled_back]

    # -- text ------------------------------------------------------------------------------

    def _head(self) -> str:
        return (f"graphpass optimize {self.model}  target={self.target}  "
                f"nodes {self.nodes_before} -> {self.nodes_after}  ({self.seconds:.2f} s)")

    def _cost_line(self) -> str | None:
        if self.cost_before_us is None:
            return None
        line = (f"estimated cost (cost model, not measured): {_fmt_cost(self.cost_before_us)} us -> "
                f"{_fmt_cost(self.cost_after_us)} us")
        if self.cost_after_us is not None and self.cost_before_us:
            line += f" ({100 * (self.cost_after_us - self.cost_before_us) / self.cost_before_us:+.1f}%)"
        return line

    def changed(self) -> list[tuple[str, int, dict[str, Any], bool]]:
        """The passes that changed the graph, each once: ``(name, node delta, summed numeric stats,
        rolled back every time)`` in order of their first change."""
        out: dict[str, list] = {}
        for r in self._applied():
            e = out.setdefault(r.name, [0, {}, True])
            if not r.rolled_back:
                e[0] += r.nodes_after - r.nodes_before
                e[2] = False
                for k, v in r.stats.items():
                    if isinstance(v, bool) or not isinstance(v, (int, float)):
                        continue
                    e[1][k] = e[1].get(k, 0) + v
        return [(name, d, stats, rb) for name, (d, stats, rb) in out.items()]

    def warnings(self) -> list[str]:
        """One line per kind of warning: a count and the first example (every one is in the
        JSON and Markdown reports, and with -vv)."""
        lines = []
        lay = self.layout or {}
        for _, n, first in group_messages(lay.get("origin_format", [])):
            what = "tensor kept" if n == 1 else f"{n} tensors kept"
            lines.append(f"warning: {what} in the origin format: {first}")
        reasons = [d["reason"] or "no reason recorded" for d in lay.get("transdata", [])]
        for _, n, first in group_messages(reasons):
            lines.append(f"warning: {n} TransData left: {first}")
        skipped: dict[str, list[str]] = {}
        others = []
        for note in self.notes:
            m = _SKIPPED.match(note)
            if m:
                skipped.setdefault(m.group(2), []).append(m.group(1))
            else:
                others.append(note)
        for why, names in skipped.items():
            lines.append(f"note: {len(names)} pass{'es' if len(names) > 1 else ''} skipped ({', '.join(names)}): {why}")
        for _, n, first in group_messages(others):
            lines.append(f"note: {first}" + (f" (and {n - 1} more like it)" if n > 1 else ""))
        return lines

    def to_summary(self, max_lines: int = 20, width: int = 160) -> str:
        """What ``graphpass optimize`` prints by default, in at most ``max_lines`` lines: the
        summary, the estimated cost, the passes that changed something with their key counts,
        one line per kind of warning. ``to_table`` (-v) and the report files hold the rest."""
        top = [self._head()] + [x for x in (self._cost_line(),) if x]
        lay = [clip(x, width) for x in self._layout_lines()[:1]]
        tail = [clip(w, width) for w in self.warnings()]
        if self.skipped:
            tail.append(clip(f"disabled: {', '.join(self.skipped)}", width))
        tail.append(f"({MORE})")
        changed = self.changed()
        room = max_lines - len(top) - len(lay) - len(tail) - 1  # -1: the "changed" heading
        if len(tail) > max_lines - len(top) - len(lay) - 3:  # keep room for two pass lines
            keep = max(max_lines - len(top) - len(lay) - 4, 1)
            tail = tail[: keep - 1] + [f"... {len(tail) - keep} more warnings and notes ({MORE})", tail[-1]]
            room = max_lines - len(top) - len(lay) - len(tail) - 1
        lines = list(top)
        if not changed:
            lines.append("no pass changed the graph")
        else:
            lines.append("passes that changed the graph:")
            shown = changed if len(changed) <= room else changed[: max(room - 1, 0)]
            w = max(len(name) for name, *_ in shown) if shown else 0
            for name, delta, stats, rolled_back in shown:
                what = "rolled back (the estimate got worse)" if rolled_back else f"{delta:+d} nodes"
                st = short_stats(stats, limit=3, width=70) if not rolled_back else ""
                lines.append(clip(f"  {name:{w}s}  {what}" + (f"  {st}" if st else ""), width))
            if len(shown) < len(changed):
                lines.append(f"  ... and {len(changed) - len(shown)} more passes (-v lists them)")
        lines += lay + tail
        return "\n".join(lines) + "\n"

    def to_table(self, width: int = 110, all_passes: bool = False, verbose: int = 1) -> str:
        """The per-pass table, the op histogram and the layout (-v; ``verbose=2`` or
        ``all_passes``: every application, every TransData and every warning)."""
        everything = all_passes or verbose > 1
        from rich.table import Table

        console, buf = text_console(width)
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
        rows = self.passes if everything else self._applied()
        for r in rows:
            delta = r.nodes_after - r.nodes_before
            t.add_row(
                str(r.index), r.name + (" (rolled back)" if r.rolled_back else ""), str(r.round),
                f"{r.seconds * 1000:.1f}", str(r.nodes_after), f"{delta:+d}",
                _fmt_cost(r.cost_after_us), clip(r.note, 60) if r.note else short_stats(r.stats),
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
        lay = self._layout_lines()
        for line in lay[:1] + (lay[1:] if everything else []):
            console.print(line)
        if not everything:
            for w in self.warnings():
                if w.startswith("warning: "):
                    console.print(w)
        left = (self.layout or {}).get("transdata", [])
        shown = left if everything else left[:12]
        for d in shown:
            console.print(f"  {d['src']} -> {d['dst']}  {d['tensor']}: {d['reason']}")
        if len(left) > len(shown):
            console.print(f"  ... {len(left) - len(shown)} more (-vv, the JSON and Markdown reports list all)")
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
                f"{_fmt_cost(r.cost_after_us)} | {r.note or short_stats(r.stats)} |"
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
