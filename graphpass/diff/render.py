"""Rendering a GraphDiff: text (terminal), Markdown (a pull-request comment), JSON.

JSON schema ``graphpass.diff/1`` (stable: fields are only ever added):

    {
      "schema": "graphpass.diff/1",
      "before": str, "after": str,                  # the two models as given
      "equivalent": bool,                           # no node, weight, attribute, I/O or opset change
      "summary": {"nodes": [before, after], "removed": int, "added": int, "matched": int,
                  "rewired": int, "attribute_changes": int,
                  "matched_by": {"structure": int, "name": int, "neighbours": int}},
      "ops": {op: [before, after]},                 # only ops whose count changed
      "transdata": {"before": int, "after": int,    # explicit graphpass.ascend::TransData nodes
                    "implicit_before"?, "implicit_after"?, "us_before"?, "us_after"?},
      "cost": null | {"target", "before_us", "after_us", "note",
                      "assumed_dims"?: {"before": {dim: value}, "after": {...}}} | {"target", "skipped"},
      "rewrites": [{"label": "Reshape×2+Transpose → Gather", "pass": str, "count": int,
                    "cost_delta_us": float | null,
                    "sites": [{"removed": [node], "added": [node], "cost_delta_us"?: float}]}],
      "attribute_changes": [{"node", "op", "attribute", "before", "after"}],
      "inputs" / "outputs": {"removed": [name], "added": [name],
                             "changed": [{"name", "before": {"dtype", "shape"}, "after": {...}}],
                             "renamed": [{"before", "after", "swapped": bool}],   # top-level graph only
                             "reordered"?: [name],                                # top-level graph only
                             "rewired"?: [{"name", "before", "carries"}]},        # outputs only
      "weights": {"removed": [name], "added": [name], "changed": [name],
                  "details": [{"name", "dtype", "shape", "elements_differ", "max_abs_diff", "nonfinite",
                               "before_name"?} | {"name", "before": {"dtype", "shape"}, "after": {...}}],
                  "count": [before, after], "bytes": [before, after]},
      "opsets": {"before": {domain: version}, "after": {...}},
      "subgraphs": [{"node", "op", "attribute", "diff": <the same object, without before/after/cost>}],
      "functions": [{"function": "domain::name", "change": "added" | "removed" | "signature" | "body",
                     "diff"?: <the same object, without before/after/cost>}],
      "uncompared": [str]                           # what the diff could not compare (never "equal")
    }
"""

from __future__ import annotations

import io
from typing import Any

from graphpass.diff.core import SCHEMA, GraphDiff
from graphpass.reporting import to_json as _to_json

__all__ = ["to_dict", "to_json", "to_text", "to_markdown", "SCHEMA"]


def to_dict(d: GraphDiff, top: bool = True) -> dict[str, Any]:
    how: dict[str, int] = {"structure": 0, "name": 0, "neighbours": 0}
    for h in d.matching.how.values():
        how[h] = how.get(h, 0) + 1
    out: dict[str, Any] = {}
    if top:
        out["schema"] = SCHEMA
        out["before"] = d.names.get("before", "")
        out["after"] = d.names.get("after", "")
    out["equivalent"] = d.equivalent
    out["summary"] = {"nodes": [len(d.before.nodes), len(d.after.nodes)], "removed": len(d.removed),
                      "added": len(d.added), "matched": len(d.matching.a_of_b), "rewired": len(d.rewired),
                      "attribute_changes": len(d.attribute_changes), "matched_by": how}
    out["ops"] = {op: list(v) for op, v in d.ops.items()}
    out["transdata"] = dict(d.transdata)
    if top:
        out["cost"] = d.cost
    out["rewrites"] = [r.to_dict() for r in d.rewrites]
    out["attribute_changes"] = d.attribute_changes
    out["inputs"] = d.inputs
    out["outputs"] = d.outputs
    out["weights"] = d.weights
    if top:
        out["opsets"] = d.opsets
    out["subgraphs"] = [{"node": s["node"], "op": s["op"], "attribute": s["attribute"], "diff": to_dict(s["diff"], top=False)}
                        for s in d.subgraphs]
    out["functions"] = [{k: (to_dict(v, top=False) if k == "diff" else v) for k, v in f.items()} for f in d.functions]
    out["uncompared"] = list(d.uncompared)
    return out


def to_json(d: GraphDiff) -> str:
    return _to_json(to_dict(d))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:+,.1f} us"


def _summary_lines(d: GraphDiff) -> list[str]:
    if d.equivalent:
        return ["no changes"]
    s = [f"nodes {len(d.before.nodes)} -> {len(d.after.nodes)}: {len(d.removed)} removed, {len(d.added)} added, "
         f"{len(d.rewired)} rewired, {len(d.attribute_changes)} attribute changes"]
    td = d.transdata
    line = f"TransData {td['before']} -> {td['after']} explicit"
    if "implicit_before" in td:
        line += (f"; with the cost model's implicit ones {td['before'] + td['implicit_before']} -> "
                 f"{td['after'] + td['implicit_after']} ({td['us_before']:,.1f} -> {td['us_after']:,.1f} us estimated)")
    s.append(line)
    if d.cost and "before_us" in d.cost:
        s.append(f"estimated cost ({d.cost['target']}, cost model, not measured): {d.cost['before_us']:,.1f} -> "
                 f"{d.cost['after_us']:,.1f} us ({d.cost['after_us'] - d.cost['before_us']:+,.1f})")
        assumed = d.cost.get("assumed_dims")
        if assumed:
            sides = {k: ", ".join(f"{n}={v}" for n, v in dims.items()) or "none" for k, dims in assumed.items()}
            text = sides["before"] if sides["before"] == sides["after"] else f"before {sides['before']}; after {sides['after']}"
            s.append(f"the estimates assume symbolic dims {text} (the models leave them dynamic)")
    elif d.cost and "skipped" in d.cost:
        s.append(f"estimated cost: {d.cost['skipped']}")
    w = d.weights
    if w["removed"] or w["added"] or w["changed"]:
        s.append(f"weights {w['count'][0]} -> {w['count'][1]} ({w['bytes'][0]:,} -> {w['bytes'][1]:,} bytes): "
                 f"{len(w['removed'])} removed, {len(w['added'])} added, {len(w['changed'])} changed")
    if d.opsets and d.opsets["before"] != d.opsets["after"]:
        s.append(f"opsets {d.opsets['before']} -> {d.opsets['after']}")
    if d.functions:
        s.append(f"functions: {len(d.functions)} differ")
    if d.uncompared:
        s.append(f"not compared (so not known to be equal): {len(d.uncompared)}")
    return s


#: Removed or added weights are named in text and Markdown when there are at most this many.
_LIST_WEIGHTS = 8


def _elements(k: int) -> str:
    return f"{k:,} element differs" if k == 1 else f"{k:,} elements differ"


def _num(v) -> str:
    return "-" if v is None else f"{v:.6g}"


def _weight_lines(d: GraphDiff) -> list[str]:
    out = []
    for w in d.weights.get("details", []):
        was = f" (was '{w['before_name']}')" if "before_name" in w else ""
        if "before" in w:
            out.append(f"weight {w['name']}{was}: {w['before']['dtype']}{w['before']['shape']} -> "
                       f"{w['after']['dtype']}{w['after']['shape']}")
        elif w.get("max_abs_diff") is None:
            out.append(f"weight {w['name']}{was} changed ({w['dtype']}{w['shape']}; values not comparable as numbers)")
        else:
            nf = f", {w['nonfinite']} NaN/inf mismatches" if w.get("nonfinite") else ""
            out.append(f"weight {w['name']}{was} changed: max abs diff {_num(w['max_abs_diff'])} "
                       f"({_elements(w['elements_differ'])}{nf})")
    for kind in ("removed", "added"):  # a rewrite removes and adds many: named only when few (the JSON has all)
        names = d.weights[kind]
        if names and len(names) <= _LIST_WEIGHTS:
            out.append(f"weights {kind}: {', '.join(names)}")
    return out


def _io_lines(d: GraphDiff) -> list[str]:
    out = []
    for kind, ch in (("input", d.inputs), ("output", d.outputs)):
        out += [f"graph {kind} removed: {n}" for n in ch["removed"]]
        out += [f"graph {kind} added: {n}" for n in ch["added"]]
        for c in ch["changed"]:
            out.append(f"graph {kind} {c['name']}: {c['before']['dtype']}{c['before']['shape']} -> "
                       f"{c['after']['dtype']}{c['after']['shape']}")
        for r in ch.get("renamed", []):
            if r["swapped"]:
                out.append(f"graph {kind} {r['after']} now carries what {r['before']} carried (swapped)")
            else:
                out.append(f"graph {kind} renamed: {r['before']} -> {r['after']}")
        for r in ch.get("rewired", []):
            out.append(f"graph {kind} {r['name']} now carries the before graph's {r['carries']} instead of {r['before']}")
        if ch.get("reordered"):
            out.append(f"graph {kind}s in another order: {', '.join(ch['reordered'])}")
    out += _weight_lines(d)
    for f in d.functions:
        out.append(f"function {f['function']}: {f['change'] if f['change'] != 'body' else 'body differs'}")
    out += [f"not compared: {u}" for u in d.uncompared]
    return out


def _site(site: dict) -> str:
    return (site["added"] or site["removed"] or ["?"])[0]


def to_text(d: GraphDiff, color: bool = False, max_sites: int = 3) -> str:
    red, green, bold, end = ("\033[31m", "\033[32m", "\033[1m", "\033[0m") if color else ("", "", "", "")
    buf = io.StringIO()
    print(f"{bold}graphpass diff {d.names.get('before', '')} {d.names.get('after', '')}{end}", file=buf)
    for line in _summary_lines(d):
        print(line, file=buf)
    if d.equivalent:
        return buf.getvalue()
    for line in _io_lines(d):
        print(line, file=buf)
    if d.rewrites:
        print(f"\n{bold}rewrites{end}", file=buf)
    for r in d.rewrites:
        sites = ", ".join(_site(s) for s in r.sites[:max_sites]) + (", ..." if len(r.sites) > max_sites else "")
        print(f"  {r.label}  [{r.pass_name}]  {len(r.sites)} site{'s' if len(r.sites) > 1 else ''}: {sites}"
              + (f"  est. {_us(r.cost_delta_us)}" if r.cost_delta_us is not None else ""), file=buf)
    if d.ops:
        print(f"\n{bold}ops{end}", file=buf)
        for op, (a, b) in d.ops.items():
            col = red if b < a else green
            print(f"  {col}{op}: {a} -> {b} ({b - a:+d}){end}", file=buf)
    for c in d.attribute_changes:
        extra = (f" (max abs diff {_num(c['max_abs_diff'])}, {_elements(c['elements_differ'])})"
                 if "max_abs_diff" in c else "")
        print(f"  attribute {c['node']} ({c['op']}).{c['attribute']}: {c['before']} -> {c['after']}{extra}", file=buf)
    for s in d.subgraphs:
        print(f"\n{bold}subgraph {s['node']}.{s['attribute']}{end}", file=buf)
        sub = to_text(s["diff"], color, max_sites).splitlines()[1:]
        print("\n".join("  " + line for line in sub), file=buf)
    for f in d.functions:
        if "diff" in f and not f["diff"].equivalent:
            print(f"\n{bold}function {f['function']}{end}", file=buf)
            sub = to_text(f["diff"], color, max_sites).splitlines()[1:]
            print("\n".join("  " + line for line in sub), file=buf)
    return buf.getvalue()


def to_markdown(d: GraphDiff, max_inline: int = 15) -> str:
    lines = [f"### graphpass diff `{d.names.get('before', '')}` → `{d.names.get('after', '')}`", ""]
    lines += [f"- {x}" for x in _summary_lines(d)]
    if d.equivalent:
        return "\n".join(lines) + "\n"
    lines += [f"- {x}" for x in _io_lines(d)]
    if d.rewrites:
        lines += ["", "| rewrite | pass | sites | est. Δ µs |", "|---|---|---:|---:|"]
        for r in d.rewrites[:max_inline]:
            lines.append(f"| {r.label} | `{r.pass_name}` | {len(r.sites)} | "
                         f"{'-' if r.cost_delta_us is None else f'{r.cost_delta_us:+,.1f}'} |")
        if len(d.rewrites) > max_inline:
            lines += ["", f"<details><summary>{len(d.rewrites) - max_inline} more rewrites</summary>", "",
                      "| rewrite | pass | sites | est. Δ µs |", "|---|---|---:|---:|"]
            for r in d.rewrites[max_inline:]:
                lines.append(f"| {r.label} | `{r.pass_name}` | {len(r.sites)} | "
                             f"{'-' if r.cost_delta_us is None else f'{r.cost_delta_us:+,.1f}'} |")
            lines += ["", "</details>"]
        lines += ["", "<details><summary>sites of each rewrite</summary>", ""]
        for r in d.rewrites:
            lines.append(f"- **{r.label}** (`{r.pass_name}`): " + ", ".join(f"`{_site(s)}`" for s in r.sites))
        lines += ["", "</details>"]
    if d.ops:
        lines += ["", "<details><summary>op counts that changed</summary>", "", "| op | before | after |", "|---|---:|---:|"]
        lines += [f"| {op} | {a} | {b} |" for op, (a, b) in d.ops.items()]
        lines += ["", "</details>"]
    if d.attribute_changes:
        lines += ["", "<details><summary>attribute changes</summary>", "", "| node | op | attribute | before | after |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{c['node']}` | {c['op']} | {c['attribute']} | `{c['before']}` | `{c['after']}` |" for c in d.attribute_changes]
        lines += ["", "</details>"]
    for s in d.subgraphs:
        lines += ["", f"<details><summary>subgraph {s['node']}.{s['attribute']}</summary>", "",
                  to_markdown(s["diff"], max_inline).split("\n", 2)[-1], "</details>"]
    for f in d.functions:
        if "diff" in f and not f["diff"].equivalent:
            lines += ["", f"<details><summary>function {f['function']}</summary>", "",
                      to_markdown(f["diff"], max_inline).split("\n", 2)[-1], "</details>"]
    lines.append("")
    return "\n".join(lines)
