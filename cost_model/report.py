"""CostReport: what the cost model estimated, per node and in total, as table, JSON or CSV.

JSON schema ``graphpass.cost_report/1`` (stable; new keys may be added, none removed):

    {
      "schema": "graphpass.cost_report/1",
      "target": str, "precision_mode": str, "iterations_per_loop": int,
      "estimate": true,                      # every figure is a cost-model estimate, not a measurement
      "total_us": float,
      "breakdown_us": {"nodes": float, "implicit_transdata": float, "crossings": float, "step": float},
      "per_engine_us": {engine: float}, "per_op_us": {op: float},
      "transdata": {"explicit": int, "implicit": int, "us": float, "share": float},
      "crossings": {"count": int, "bytes": int, "us": float, "list": [{tensor, from, to, bytes, us}]},
      "dynamic_regions": [{root, op, reason, nodes}],
      "unknown_ops": [op], "assumptions": [str],
      "nodes": [{name, op, engine, formats_in, formats_out, us, bound, cube_us, vector_us, memory_us, launch_us, note}]
    }
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any

from graphpass.reporting import Report, markdown_table, text_console

__all__ = ["CostReport", "SCHEMA"]

SCHEMA = "graphpass.cost_report/1"


@dataclasses.dataclass
class CostReport(Report):
    """An estimate for one graph. Every time is an estimate in microseconds, not a measurement."""

    SCHEMA = SCHEMA

    target: str
    total_us: float | None
    precision_mode: str = ""
    iterations_per_loop: int = 1
    nodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    breakdown_us: dict[str, float] = dataclasses.field(default_factory=dict)
    per_engine_us: dict[str, float] = dataclasses.field(default_factory=dict)
    per_op_us: dict[str, float] = dataclasses.field(default_factory=dict)
    transdata: dict[str, Any] = dataclasses.field(default_factory=dict)
    crossings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    dynamic_regions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unknown_ops: list[str] = dataclasses.field(default_factory=list)
    assumptions: list[str] = dataclasses.field(default_factory=list)
    #: symbolic dim name -> the value the estimate assumed for it (not fixed by --input-shape/--dim)
    assumed_dims: dict[str, int] = dataclasses.field(default_factory=dict)

    def assumed_dims_text(self) -> str:
        """``batch=1, seq=1``: the symbolic dims the estimate assumed, and their values."""
        return ", ".join(f"{k}={v}" for k, v in self.assumed_dims.items())

    @property
    def per_node(self) -> list[dict[str, Any]]:
        return self.nodes

    def to_dict(self) -> dict[str, Any]:
        cross_bytes = sum(c["bytes"] for c in self.crossings)
        return {
            "schema": SCHEMA,
            "target": self.target,
            "precision_mode": self.precision_mode,
            "iterations_per_loop": self.iterations_per_loop,
            "estimate": True,
            "total_us": self.total_us,
            "breakdown_us": self.breakdown_us,
            "per_engine_us": self.per_engine_us,
            "per_op_us": self.per_op_us,
            "transdata": self.transdata,
            "crossings": {"count": len(self.crossings), "bytes": cross_bytes,
                          "us": sum(c["us"] for c in self.crossings), "list": self.crossings},
            "dynamic_regions": self.dynamic_regions,
            "unknown_ops": self.unknown_ops,
            "assumptions": self.assumptions,
            "assumed_dims": self.assumed_dims,
            "nodes": self.nodes,
        }

    def to_csv(self) -> str:
        buf = io.StringIO()
        cols = ["name", "op", "engine", "formats_in", "formats_out", "us", "bound", "cube_us", "vector_us", "memory_us", "launch_us", "note"]
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for n in self.nodes:
            w.writerow({**n, "formats_in": " ".join(n.get("formats_in", [])), "formats_out": " ".join(n.get("formats_out", []))})
        return buf.getvalue()

    def to_table(self, top: int = 15, width: int = 120, brief: bool = False) -> str:
        """The estimate as text; ``brief`` (what ``graphpass cost`` prints without -v): long
        lists cut to a few lines and one line per kind of assumption, with counts."""
        from rich.table import Table

        from graphpass.reporting import clip, group_messages

        c, buf = text_console(width)
        few = min(top, 3) if brief else None

        def assumptions():
            if not brief:
                return [f"assumption: {a}" for a in self.assumptions]
            return [clip(f"assumption: {first}" + (f" (and {n - 1} more like it)" if n > 1 else ""), width)
                    for _, n, first in group_messages(self.assumptions)]
        c.print(f"cost estimate for {self.target} (precision {self.precision_mode}, iterations_per_loop "
                f"{self.iterations_per_loop}): " + ("no cost model, no estimate" if self.total_us is None
                                                      else f"{self.total_us:,.1f} us per step"))
        if self.total_us is None:  # the none target: no figures to show
            for a in assumptions():
                c.print(a)
            return buf.getvalue()
        c.print("  (every figure here is a cost-model estimate, not a measurement)")
        if self.assumed_dims:
            dims = f"  assumed dims: {self.assumed_dims_text()}"
            c.print(clip(dims, width) if brief else dims)
        b = self.breakdown_us
        c.print("  nodes {nodes:,.1f} us, implicit TransData {implicit_transdata:,.1f} us, crossings {crossings:,.1f} us, "
                "step (launch + I/O + sync) {step:,.1f} us".format(**{k: b.get(k, 0.0) for k in ("nodes", "implicit_transdata", "crossings", "step")}))
        td = self.transdata
        if td:
            c.print(f"  TransData: {td.get('explicit', 0)} explicit + {td.get('implicit', 0)} implicit, "
                    f"{td.get('us', 0.0):,.1f} us ({100 * td.get('share', 0.0):.1f}% of the total)")
        if self.crossings:
            c.print(f"  host/device and engine crossings: {len(self.crossings)} "
                    f"({sum(x['bytes'] for x in self.crossings):,} bytes, {sum(x['us'] for x in self.crossings):,.1f} us)")
            for x in self.crossings[:few or top]:
                c.print(f"    {x['tensor']}: {x['from']} -> {x['to']}, {x['bytes']:,} bytes, {x['us']:,.1f} us")
            if few and len(self.crossings) > few:
                c.print(f"    ... and {len(self.crossings) - few} more")
        for r in self.dynamic_regions[:few or None]:
            c.print(f"  host-scheduled region after {r['op']} '{r['root']}': {r['nodes']} nodes ({r['reason']})")
        if few and len(self.dynamic_regions) > few:
            c.print(f"  ... and {len(self.dynamic_regions) - few} more host-scheduled regions")
        if self.unknown_ops:
            c.print(f"  unknown ops (costed as AI CPU): {', '.join(self.unknown_ops)}")
        eng = Table(title="per engine")
        eng.add_column("engine")
        eng.add_column("us", justify="right")
        for k, v in sorted(self.per_engine_us.items(), key=lambda kv: -kv[1]):
            eng.add_row(k, f"{v:,.1f}")
        c.print(eng)
        ops = Table(title="per op type")
        for col in ("op", "us", "share"):
            ops.add_column(col, justify="left" if col == "op" else "right")
        total = sum(self.per_op_us.values()) or 1.0
        for k, v in sorted(self.per_op_us.items(), key=lambda kv: -kv[1])[:top]:
            ops.add_row(k, f"{v:,.1f}", f"{100 * v / total:.1f}%")
        c.print(ops)
        nodes = Table(title=f"top {top} nodes")
        for col in ("node", "op", "engine", "formats", "us", "bound"):
            nodes.add_column(col, justify="right" if col == "us" else "left")
        for n in sorted(self.nodes, key=lambda n: -n["us"])[:top]:
            fmts = ",".join(n.get("formats_in", [])[:1]) + "->" + ",".join(n.get("formats_out", [])[:1])
            nodes.add_row(n["name"][:40], n["op"], n["engine"], fmts, f"{n['us']:,.2f}", n["bound"])
        c.print(nodes)
        for a in assumptions():
            c.print(a)
        return buf.getvalue()

    def to_markdown(self, top: int = 15) -> str:
        b = self.breakdown_us
        total = "-" if self.total_us is None else f"{self.total_us:,.1f}"
        lines = [f"### graphpass estimate · `{self.target}`", "",
                 f"precision `{self.precision_mode}` · iterations_per_loop {self.iterations_per_loop} · "
                 f"**{total} µs per step** (cost-model estimate, not a measurement)", ""]
        lines += markdown_table(["part", ("est. µs", "right")],
                                [(k, f"{b.get(k, 0.0):,.1f}") for k in ("nodes", "implicit_transdata", "crossings", "step")])
        if self.per_engine_us:
            lines += [""] + markdown_table(["engine", ("est. µs", "right")],
                                           [(k, f"{v:,.1f}") for k, v in sorted(self.per_engine_us.items(), key=lambda kv: -kv[1])])
        if self.per_op_us:
            lines += ["", f"<details><summary>top {top} op types</summary>", ""]
            lines += markdown_table(["op", ("est. µs", "right")],
                                    [(k, f"{v:,.1f}") for k, v in sorted(self.per_op_us.items(), key=lambda kv: -kv[1])[:top]])
            lines += ["", "</details>"]
        if self.unknown_ops:
            lines += ["", f"unknown ops (costed as AI CPU): {', '.join(self.unknown_ops)}"]
        if self.assumed_dims:
            lines += ["", f"assumed dims: {self.assumed_dims_text()}"]
        lines += [f"- assumption: {a}" for a in self.assumptions]
        lines.append("")
        return "\n".join(lines)
