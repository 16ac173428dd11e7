"""One self-contained HTML file: the summary, then each rewrite's neighbourhood before and after,
side by side, as inline SVG. No network access is needed to view it.

Pictures are laid out by graphviz ``dot`` when it is installed, otherwise by a built-in layered
layout (longest-path layers, nodes in first-seen order): the neighbourhoods are small (the
rewrite's nodes plus one hop of context). Removed nodes are red, added green, context grey.
A small script records, once the page is rendered, how many node boxes each side drew and
their size (``<body data-rendered=...>``), so a headless browser can check the pictures render.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess

from graphpass.diff.core import GraphDiff
from graphpass.diff.render import _io_lines, _summary_lines, to_dict
from graphpass.diff.views import GraphView

__all__ = ["to_html", "dot_source", "dot_string"]

_W, _H, _GX, _GY = 170, 34, 30, 34
_FILL = {"removed": "#f6c9c9", "added": "#c9efc9", "context": "#eeeeee"}


def _neighbourhood(g: GraphView, core: list[int]) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    core_set = set(core)
    nodes = {i: "core" for i in core}
    for i in core:
        n = g.nodes[i]
        for t in n.inputs:
            p = g.producer.get(t)
            if p is not None and p[0] not in core_set:
                nodes.setdefault(p[0], "context")
        for t in n.outputs:
            for c in g.consumers.get(t, ())[:4]:
                if c not in core_set:
                    nodes.setdefault(c, "context")
    edges = []
    for i in nodes:
        for t in g.nodes[i].inputs:
            p = g.producer.get(t)
            if p is not None and p[0] in nodes:
                edges.append((p[0], i))
    return list(nodes.items()), edges


def _layers(ids: list[int], edges: list[tuple[int, int]]) -> dict[int, int]:
    """Longest-path layer of each node (Kahn order; nodes on a cycle go last)."""
    succ: dict[int, list[int]] = {i: [] for i in ids}
    indeg = {i: 0 for i in ids}
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    layer = {i: 0 for i in ids}
    ready = sorted(i for i in ids if indeg[i] == 0)
    while ready:
        i = ready.pop(0)
        for c in succ[i]:
            layer[c] = max(layer[c], layer[i] + 1)
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    return layer


def _builtin_svg(g: GraphView, nodes: list[tuple[int, str]], edges, kind: str, side: str) -> str:
    ids = [i for i, _ in nodes]
    layer = _layers(ids, edges)
    rows: dict[int, list[int]] = {}
    for i in sorted(ids, key=lambda i: (layer[i], i)):
        rows.setdefault(layer[i], []).append(i)
    pos = {}
    width = max((len(r) for r in rows.values()), default=1) * (_W + _GX) + _GX
    for d, row in rows.items():
        off = (width - len(row) * (_W + _GX) + _GX) / 2
        for k, i in enumerate(row):
            pos[i] = (off + k * (_W + _GX), _GY + d * (_H + _GY))
    height = (max(rows, default=0) + 1) * (_H + _GY) + _GY
    out = [f'<svg class="graph {side}" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}">',
           '<defs><marker id="arr" markerWidth="8" markerHeight="8" refX="8" refY="4" orient="auto">'
           '<path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>']
    for a, b in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f'<line x1="{x1 + _W / 2:.0f}" y1="{y1 + _H:.0f}" x2="{x2 + _W / 2:.0f}" y2="{y2:.0f}" '
                   f'stroke="#666" marker-end="url(#arr)"/>')
    for i, role in nodes:
        x, y = pos[i]
        n = g.nodes[i]
        fill = _FILL[kind if role == "core" else "context"]
        op = n.op.split("::")[-1]
        out.append(f'<g class="node {kind if role == "core" else "context"}"><title>{html.escape(n.label)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{_W}" height="{_H}" rx="5" fill="{fill}" stroke="#444"/>'
                   f'<text x="{x + _W / 2:.0f}" y="{y + 14:.0f}" text-anchor="middle" font-size="12" font-weight="bold">'
                   f'{html.escape(op[:24])}</text><text x="{x + _W / 2:.0f}" y="{y + 27:.0f}" text-anchor="middle" '
                   f'font-size="9" fill="#333">{html.escape(n.label[-28:])}</text></g>')
    out.append("</svg>")
    return "".join(out)


def dot_string(text: str) -> str:
    """``text`` as the body of a DOT double-quoted label, shown literally: backslashes (graphviz
    escapes such as ``\\N``), quotes, line breaks and ``&`` (entities such as ``&lt;``) escaped."""
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("&", "&amp;")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")


def dot_source(g: GraphView, nodes, edges, kind: str) -> str:
    """The DOT source of one neighbourhood: node ids are numbers, every name is in a quoted label."""
    lines = ["digraph G { node [shape=box, style=\"rounded,filled\", fontsize=10];"]
    for i, role in nodes:
        n = g.nodes[i]
        fill = _FILL[kind if role == "core" else "context"]
        label = dot_string(n.op.split("::")[-1]) + "\\n" + dot_string(n.label[-28:])
        lines.append(f'n{i} [label="{label}", fillcolor="{fill}", class="node"];')
    lines += [f"n{a} -> n{b};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines)


def _dot_svg(g: GraphView, nodes, edges, kind: str, side: str) -> str | None:
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        svg = subprocess.run([dot, "-Tsvg"], input=dot_source(g, nodes, edges, kind), capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    start = svg.find("<svg")
    return svg[start:].replace("<svg", f'<svg class="graph {side}"', 1) if start >= 0 else None


def _picture(g: GraphView, core: list[int], kind: str, side: str) -> str:
    if not core:
        return f'<svg class="graph {side} empty" xmlns="http://www.w3.org/2000/svg" width="200" height="40">' \
               f'<text x="10" y="24" font-size="12" fill="#777">(nothing)</text></svg>'
    nodes, edges = _neighbourhood(g, core)
    return _dot_svg(g, nodes, edges, kind, side) or _builtin_svg(g, nodes, edges, kind, side)


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}
.site{border:1px solid #ccc;border-radius:6px;margin:14px 0;padding:10px}
.pair{display:flex;gap:24px;align-items:flex-start;overflow-x:auto}.side{flex:1}
.side h4{margin:4px 0;color:#555}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px}
.ok{color:#070}.changed{color:#a00}"""

_SCRIPT = """window.addEventListener('load',function(){var r={};['before','after'].forEach(function(s){
var boxes=document.querySelectorAll('svg.'+s+' g.node rect, svg.'+s+' g.node polygon, svg.'+s+' g.node path');
var drawn=0;boxes.forEach(function(b){var bb=b.getBBox();if(bb.width>0&&bb.height>0)drawn++;});
var svgs=document.querySelectorAll('svg.'+s);var area=0;svgs.forEach(function(v){var q=v.getBoundingClientRect();area+=q.width*q.height;});
r[s]={svgs:svgs.length,boxes:boxes.length,drawn:drawn,area:Math.round(area)};});
document.body.setAttribute('data-rendered',JSON.stringify(r));});"""


def to_html(d: GraphDiff, max_sites: int = 40) -> str:
    title = f"graphpass diff {d.names.get('before', '')} → {d.names.get('after', '')}"
    parts = ["<!doctype html><html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style><script>{_SCRIPT}</script></head><body>", f"<h1>{html.escape(title)}</h1>"]
    cls = "ok" if d.equivalent else "changed"
    parts.append(f"<ul class='{cls}'>" + "".join(f"<li>{html.escape(x)}</li>" for x in _summary_lines(d)
                                                    + ([] if d.equivalent else _io_lines(d))) + "</ul>")
    if d.rewrites:
        parts.append("<table><tr><th>rewrite</th><th>pass</th><th>sites</th><th>est. Δ µs</th></tr>")
        for r in d.rewrites:
            delta = "-" if r.cost_delta_us is None else f"{r.cost_delta_us:+,.1f}"
            parts.append(f"<tr><td>{html.escape(r.label)}</td><td>{html.escape(r.pass_name)}</td>"
                         f"<td>{len(r.sites)}</td><td>{delta}</td></tr>")
        parts.append("</table>")
    shown = 0
    groups = sorted(d.groups, key=lambda ga: -(len(ga[0]) + len(ga[1])))
    for rem, add in groups:
        if shown >= max_sites:
            parts.append(f"<p>{len(groups) - shown} more sites are listed in the JSON output.</p>")
            break
        shown += 1
        label = " + ".join(sorted({d.before.nodes[i].op for i in rem})) or "∅"
        label += " → " + (" + ".join(sorted({d.after.nodes[i].op for i in add})) or "∅")
        parts.append(f"<div class='site'><h3>{html.escape(label)}</h3><div class='pair'>"
                     f"<div class='side'><h4>before</h4>{_picture(d.before, rem, 'removed', 'before')}</div>"
                     f"<div class='side'><h4>after</h4>{_picture(d.after, add, 'added', 'after')}</div></div></div>")
    parts.append("<details><summary>JSON</summary><pre>" + html.escape(json.dumps(to_dict(d), indent=1, default=str)[:200_000])
                 + "</pre></details>")
    parts.append("</body></html>")
    return "".join(parts)
