"""``graphpass zoo-report OUTDIR``: the summary of a model-zoo run from its SQLite file: totals,
failures grouped by their error, the models that gain least or take longest, gain per model; as a
text table, Markdown, JSON and a sortable HTML page (no script from elsewhere)."""

from __future__ import annotations

import html
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from graphpass.errors import UsageError
from graphpass.zoo.store import DB_NAME, Store

__all__ = ["summarize", "to_text", "to_markdown", "to_html", "write_reports"]

STATUSES = ("ok", "verify-failed", "bad-input", "timeout", "memory", "crash", "internal-error")


def _gain(r: dict[str, Any]) -> float | None:
    b, a = r.get("cost_before_us"), r.get("cost_after_us")
    return 100.0 * (b - a) / b if b and a is not None else None


def _error_kind(error: str | None) -> str:
    """An error line with its specifics (paths, numbers, quoted names) blanked: failures of one
    kind group together."""
    if not error:
        return "(no message)"
    e = re.sub(r"[^\s'\"]+\.onnx\b", "MODEL", error)
    e = re.sub(r"'[^']*'", "'…'", e)
    e = re.sub(r"\b\d[\d,.]*", "N", e)
    return e[:200]


def summarize(folder: str | Path) -> dict[str, Any]:
    """The summary of the latest run of every model in ``folder``'s results."""
    folder = Path(folder)
    if not (folder / DB_NAME).is_file():
        raise UsageError(f"no zoo results in '{folder}' (no {DB_NAME}): run graphpass optimize or evaluate "
                         f"on several models with -o {folder} first")
    with Store(folder) as store:
        rows = list(store.rows(latest=True))
    counts = Counter(r["status"] for r in rows)
    failures: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r["status"] != "ok":
            failures[f"{r['status']}: {_error_kind(r.get('error'))}"].append(r["model"])
    ok = [r for r in rows if r["status"] == "ok"]
    for r in rows:
        r["gain_pct"] = _gain(r)
    gains = [r["gain_pct"] for r in ok if r["gain_pct"] is not None]
    return {
        "schema": "graphpass.zoo_report/1",
        "folder": str(folder),
        "models": len(rows),
        "status": {s: counts.get(s, 0) for s in STATUSES if counts.get(s)} | {s: n for s, n in counts.items()
                                                                             if s not in STATUSES},
        "verified": sum(1 for r in ok if r.get("verify")),
        "nodes_before": sum(r.get("nodes_before") or 0 for r in ok),
        "nodes_after": sum(r.get("nodes_after") or 0 for r in ok),
        "mean_gain_pct": sum(gains) / len(gains) if gains else None,
        "wall_s": sum(r.get("wall_s") or 0.0 for r in rows),
        "failures": [{"kind": k, "count": len(v), "models": sorted(v)} for k, v in
                     sorted(failures.items(), key=lambda kv: (-len(kv[1]), kv[0]))],
        "least_gain": [r["model"] for r in sorted((r for r in ok if r["gain_pct"] is not None),
                                                  key=lambda r: r["gain_pct"])[:5]],
        "slowest": [r["model"] for r in sorted(rows, key=lambda r: -(r.get("wall_s") or 0.0))[:5]],
        "rows": rows,
    }


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec or ",.1f")
    return str(v)


_COLS = (("model", "model"), ("status", "status"), ("nodes", None), ("est. us before", "cost_before_us"),
         ("est. us after", "cost_after_us"), ("gain %", "gain_pct"), ("TransData", "transdata"),
         ("AI CPU ops", "aicpu_ops"), ("verified", "verify"), ("s", "wall_s"), ("peak MB", "peak_rss_mb"),
         ("error", "error"))


def _cells(r: dict[str, Any]) -> list[str]:
    out = []
    for _, key in _COLS:
        if key is None:
            out.append(f"{_fmt(r.get('nodes_before'))} -> {_fmt(r.get('nodes_after'))}")
        elif key == "verify":
            out.append("yes" if r.get("verify") else "-")
        elif key == "gain_pct":
            out.append(_fmt(r.get(key), "+.1f"))
        else:
            out.append(_fmt(r.get(key)))
    return out


def _head(s: dict[str, Any]) -> list[str]:
    status = ", ".join(f"{n} {k}" for k, n in s["status"].items())
    lines = [f"{s['models']} model(s): {status}; {s['verified']} verified; nodes {s['nodes_before']:,} -> "
             f"{s['nodes_after']:,} (models that finished)"]
    if s["mean_gain_pct"] is not None:
        lines.append(f"mean estimated gain {s['mean_gain_pct']:+.1f}% (cost-model estimates, not measurements)")
    for f in s["failures"]:
        lines.append(f"{f['count']} x {f['kind']}: {', '.join(f['models'][:5])}"
                     + (f" and {len(f['models']) - 5} more" if len(f["models"]) > 5 else ""))
    if s["least_gain"]:
        lines.append(f"least gain: {', '.join(s['least_gain'])}")
    if s["slowest"]:
        lines.append(f"slowest: {', '.join(s['slowest'])}")
    return lines


def to_text(s: dict[str, Any]) -> str:
    rows = [[name for name, _ in _COLS]] + [_cells(r) for r in s["rows"]]
    rows = [[c if len(c) <= 60 else c[:57] + "..." for c in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLS))]
    table = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(_head(s) + [""] + table) + "\n"


def to_markdown(s: dict[str, Any]) -> str:
    def esc(c: str) -> str:
        return c.replace("|", "\\|")

    lines = ["# graphpass model-zoo report", ""] + [f"- {ln}" for ln in _head(s)] + [""]
    lines.append("| " + " | ".join(name for name, _ in _COLS) + " |")
    lines.append("|" + "---|" * len(_COLS))
    lines += ["| " + " | ".join(esc(c) for c in _cells(r)) + " |" for r in s["rows"]]
    return "\n".join(lines) + "\n"


_SORT_JS = r"""
document.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
  const tb = th.closest('table').tBodies[0];
  const asc = th.dataset.asc !== '1'; th.dataset.asc = asc ? '1' : '0';
  const key = td => { const t = td.dataset.v ?? td.textContent; const n = parseFloat(t);
                      return isNaN(n) ? t : n; };
  [...tb.rows].sort((a, b) => { const x = key(a.cells[i]), y = key(b.cells[i]);
    return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); }).forEach(r => tb.appendChild(r));
}));
const want = location.hash.match(/sort=(\d+)/);  // page.html#sort=N: sorted by column N on load
if (want) document.querySelectorAll('th')[+want[1]].click();
document.body.dataset.rows = document.querySelectorAll('tbody tr').length;
"""


def to_html(s: dict[str, Any]) -> str:
    e = html.escape
    head = "".join(f"<li>{e(ln)}</li>" for ln in _head(s))
    ths = "".join(f"<th>{e(name)}</th>" for name, _ in _COLS)
    body = []
    for r in s["rows"]:
        cells = []
        for (_, key), text in zip(_COLS, _cells(r)):
            v = r.get(key) if key else r.get("nodes_after")
            data = f' data-v="{e(str(v))}"' if isinstance(v, (int, float)) else ""
            cells.append(f"<td{data}>{e(text)}</td>")
        body.append(f"<tr class=\"{e(r['status'])}\">{''.join(cells)}</tr>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>graphpass model-zoo report</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:2px 6px}th{cursor:pointer;background:#eee}tr:not(.ok) td{background:#fee}</style></head><body>"
            f"<h1>graphpass model-zoo report</h1><ul>{head}</ul><table><thead><tr>{ths}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table><script>{_SORT_JS}</script></body></html>\n")


def write_reports(folder: str | Path, out: str | Path | None = None) -> tuple[dict[str, Any], list[Path]]:
    """Write zoo-report.md/.json/.html into ``out`` (default: the results folder)."""
    s = summarize(folder)
    dest = Path(out) if out is not None else Path(folder)
    dest.mkdir(parents=True, exist_ok=True)
    paths = [dest / "zoo-report.md", dest / "zoo-report.json", dest / "zoo-report.html"]
    paths[0].write_text(to_markdown(s), "utf-8")
    paths[1].write_text(json.dumps(s, indent=1, default=str) + "\n", "utf-8")
    paths[2].write_text(to_html(s), "utf-8")
    return s, paths
