"""What ATC did, read back and set against graphpass's plan (``graphpass atc-check``).

Read (formats in cost_model/data/cann_atc.toml ``[readback]``):
- ``fusion_result.json`` (``--export_compile_stat``): ``{"session_and_graph_id_<s>_<g>":
  {"graph_fusion": {<pass>: {"match_times", "effect_times"}}, "ub_fusion": {<pass>: {...,
  "repository_hit_times"}}}}``; a pass switched off is absent.
- the GE graph dumps (``DUMP_GE_GRAPH``): ``ge_proto_*_<stage>.txt``, protobuf text of GE's
  ModelDef (``graph { op { name type input attr { key value { s } } } }``); the last stage
  (``*_Build.txt``, else ``*_PreRunAfterBuild.txt``, else the newest) is the compiled graph.

Compared: fusions (graphpass's switch choices and the sites its own fusion passes still find
in the model, against ATC's effect_times), TransData (the cost model's forecast: where a format
change is priced, by producer node, against the TransData ops ATC inserted), and the ops ATC
placed on AI CPU (``_ge_attr_op_kernel_lib_name`` aicpu_*) against the cost model's AICPU nodes.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from graphpass.errors import UsageError
from graphpass.reporting import Report

__all__ = ["read_fusion_result", "read_ge_graph", "AtcCheckReport", "atc_check"]


def _read_text(p: Path, what: str) -> str:
    """A regular file of at most the run's memory budget, as text (refused in one line: a device,
    a FIFO, a folder, too big, not UTF-8)."""
    from graphpass.ir import limits
    from graphpass.ir.files import read_regular_file

    try:
        raw = read_regular_file(p, limits.resolve_max_memory(None), what)
    except OSError as e:
        raise UsageError(f"{p}: cannot read the {what}: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{p}: the {what} is not UTF-8 text (byte {e.start})") from None


def _read_json(p: Path, what: str) -> Any:
    text = _read_text(p, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{p}: line {e.lineno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise UsageError(f"{p}: the {what} nests too deeply to be one") from None


def read_fusion_result(path: str | Path) -> dict[str, dict[str, int]]:
    """pass name -> {"section", "match", "effect"} summed over every session and graph."""
    p = Path(path)
    data = _read_json(p, "fusion result")
    if not isinstance(data, dict):
        raise UsageError(f"{p}: expected an object of session_and_graph_id_* entries")
    out: dict[str, dict[str, Any]] = {}
    for sid, graphs in data.items():
        if not isinstance(graphs, dict):
            raise UsageError(f"{p}: {sid}: expected an object with graph_fusion / ub_fusion")
        for section, passes in graphs.items():
            if section not in ("graph_fusion", "ub_fusion"):
                continue
            if not isinstance(passes, dict):
                raise UsageError(f"{p}: {sid}.{section}: expected an object of pass: counts")
            for name, counts in passes.items():
                try:
                    match, effect = int(counts.get("match_times", 0)), int(counts.get("effect_times", 0))
                except (AttributeError, TypeError, ValueError):
                    raise UsageError(f"{p}: {sid}.{section}.{name}: match_times/effect_times must be numbers") from None
                row = out.setdefault(name, {"section": section, "match": 0, "effect": 0})
                row["match"] += match
                row["effect"] += effect
    return out


_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|([A-Za-z_][A-Za-z0-9_]*)\s*:?\s*(?=\{)|([A-Za-z_][A-Za-z0-9_]*)\s*:\s*'
                    r'("(?:[^"\\]|\\.)*"|[^\s{}]+)|(\{)|(\}))')


def _parse_text(text: str, where: str) -> list:
    """Protobuf text as nested [(key, value | list)] (values are raw strings)."""
    stack: list[list] = [[]]
    keys: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            if text[pos:].strip():
                raise UsageError(f"{where}: not protobuf text at offset {pos}: {text[pos:pos + 40]!r}")
            break
        pos = m.end()
        comment, block, key, value, opn, close = m.groups()
        if comment:
            continue
        if block:
            keys.append(block)
            continue
        if opn:
            stack.append([])
            continue
        if close:
            if len(stack) < 2 or not keys:
                raise UsageError(f"{where}: unbalanced '}}' at offset {pos}")
            done = stack.pop()
            stack[-1].append((keys.pop(), done))
            continue
        if key:
            if value.startswith('"'):  # C escapes; non-ASCII as octal UTF-8 bytes (protobuf text format)
                value = codecs.escape_decode(value[1:-1].encode("utf-8"))[0].decode("utf-8", "replace")
            stack[-1].append((key, value))
    if len(stack) != 1:
        raise UsageError(f"{where}: unbalanced '{{'")
    return stack[0]


def _get(items: list, key: str) -> list:
    return [v for k, v in items if k == key]


def _attr_strings(value: list) -> list[str]:
    out = [v for v in _get(value, "s")]
    for lst in _get(value, "list"):
        out += _get(lst, "s")
    return out


def _stage_file(folder: Path) -> Path:
    files = sorted(folder.glob("ge_proto*.txt"))
    if not files:
        raise UsageError(f"{folder}: no ge_proto*.txt dump (run ATC with DUMP_GE_GRAPH=2)")
    for suffix in ("_Build.txt", "_PreRunAfterBuild.txt"):
        hits = [f for f in files if f.name.endswith(suffix)]
        if hits:
            return max(hits, key=lambda f: (f.stat().st_mtime, f.name))
    return max(files, key=lambda f: (f.stat().st_mtime, f.name))


def read_ge_graph(path: str | Path) -> tuple[Path, list[dict[str, Any]]]:
    """The ops of a GE dump (a ge_proto*.txt file, or the folder holding the dumps: the compiled
    graph's): each {"name", "type", "inputs", "engine", "pass_name", "original"}."""
    p = Path(path)
    f = _stage_file(p) if p.is_dir() else p
    from graphpass.ir import limits
    from graphpass.ir.files import read_regular_file

    try:  # GE writes its strings as protobuf text (octal escapes): undecodable bytes are replaced
        text = read_regular_file(f, limits.resolve_max_memory(None), "GE graph dump").decode("utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"{f}: cannot read the GE graph dump: {e.strerror}") from None
    tree = _parse_text(text, str(f))
    graphs = _get(tree, "graph") or [tree]
    ops = []
    for g in graphs:
        for op in _get(g, "op"):
            attrs = {}
            for a in _get(op, "attr"):
                key = next(iter(_get(a, "key")), None)
                val = next(iter(_get(a, "value")), None)
                if key is not None and isinstance(val, list):
                    attrs[key] = _attr_strings(val)
            ops.append({"name": next(iter(_get(op, "name")), ""), "type": next(iter(_get(op, "type")), ""),
                        "inputs": [i for i in _get(op, "input") if i],
                        "engine": next(iter(attrs.get("_ge_attr_op_kernel_lib_name", [])), ""),
                        "pass_name": attrs.get("pass_name", []),
                        "original": attrs.get("_datadump_original_op_names", [])})
    if not ops:
        raise UsageError(f"{f}: no op in the GE graph dump")
    return f, ops


@dataclasses.dataclass
class AtcCheckReport(Report):
    SCHEMA = "graphpass.atc-check/1"

    fusions: list[dict[str, Any]]
    transdata: dict[str, Any]
    aicpu: dict[str, Any]
    ge_graph: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def mismatches(self) -> int:
        n = sum(1 for f in self.fusions if f["verdict"] not in ("as planned", "applied (not forecast)"))
        if self.transdata:
            n += len(self.transdata.get("only_forecast", [])) + len(self.transdata.get("only_atc", []))
        if self.aicpu:
            n += len(self.aicpu.get("only_forecast", [])) + len(self.aicpu.get("only_atc", []))
        return n

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, "fusions": self.fusions, "transdata": self.transdata, "aicpu": self.aicpu,
                "ge_graph": self.ge_graph, "mismatches": self.mismatches, "notes": self.notes}

    def to_table(self, verbose: bool = False) -> str:
        lines = [f"atc-check: {self.mismatches} difference(s) between graphpass's plan and what ATC did"]
        lines.append("fusions (pass: graphpass's plan -> ATC's effect_times):")
        for f in self.fusions:
            if verbose or f["verdict"] != "as planned" or f["effect"]:
                lines.append(f"  {f['name']:<36} {f['plan']:<22} effect {f['effect']:<4} {f['verdict']}")
        for key, title in (("transdata", "TransData"), ("aicpu", "AI CPU ops")):
            d = getattr(self, key)
            if not d:
                lines.append(f"{title}: not compared (no --ge-graph)")
                continue
            lines.append(f"{title}: forecast {d['forecast']}, ATC {d['atc']}, at the same place {len(d['both'])}")
            if d["only_forecast"]:
                lines.append(f"  forecast, not in ATC's graph: {', '.join(d['only_forecast'][:20])}")
            if d["only_atc"]:
                lines.append(f"  in ATC's graph, not forecast: {', '.join(d['only_atc'][:20])}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def to_markdown(self) -> str:
        return "```\n" + self.to_table(verbose=True) + "```\n"


def _expected_sites(model, switches: dict[str, bool], target) -> dict[str, int]:
    """Ascend fusion name -> sites graphpass's own pass for it still finds in ``model``."""
    import graphpass as gp
    from graphpass.passes.fusion_switch import fusion_passes

    out: dict[str, int] = {}
    for name, cls in fusion_passes().items():
        if not cls.ascend_name or not switches.get(name, cls.default_enabled):
            continue
        try:
            res = gp.optimize(model, passes=[name], target=target, max_rounds=1)
        except Exception:  # noqa: BLE001 - a pass that cannot run here forecasts nothing
            continue
        sites = sum(1 for r in res.report.passes if r.name == name and r.application)
        out[cls.ascend_name] = out.get(cls.ascend_name, 0) + sites
    return out


def atc_check(model, fusion_result: str | Path, ge_graph: str | Path | None = None, kit: str | Path | None = None,
              target: str | None = None, input_shapes: dict[str, list[int]] | None = None) -> AtcCheckReport:
    """Compare ATC's files with graphpass's plan for ``model`` (the model handed to ATC)."""
    import graphpass as gp
    from graphpass.passes.fusion_switch import fusion_passes

    manifest: dict[str, Any] = {}
    if kit is not None:
        mf = Path(kit) / "graphpass_kit.json"
        manifest = _read_json(mf, "kit's manifest")
        if not isinstance(manifest, dict):
            raise UsageError(f"{mf}: the kit's manifest is not a JSON object")
        shapes_ok = lambda g: isinstance(g, dict) and all(  # noqa: E731
            isinstance(k, str) and isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in v)
            for k, v in g.items())
        for key, ok in (("target", lambda v: isinstance(v, str)), ("switches", lambda v: isinstance(v, dict)),
                        ("gears", lambda v: isinstance(v, list) and all(shapes_ok(g) for g in v))):
            if key in manifest and manifest[key] is not None and not ok(manifest[key]):
                raise UsageError(f"{mf}: the kit's manifest has a malformed '{key}'")
        target = target or manifest.get("target")
        if input_shapes is None and manifest.get("gears"):
            input_shapes = manifest["gears"][0]
    from graphpass.cost_model.target import DEFAULT_TARGET

    target = target or DEFAULT_TARGET
    from graphpass.cost_model.target import Target

    Target.load(target)  # an unknown name (from the kit's manifest too) is a UsageError
    switches: dict[str, bool] = {k: bool(v) for k, v in manifest.get("switches", {}).items()}
    applied = read_fusion_result(fusion_result)
    loaded = gp.load(model, input_shapes=input_shapes or None)
    expected = _expected_sites(gp.to_proto(loaded), switches, target)
    off = {c.ascend_name for n, c in fusion_passes().items() if c.ascend_name and not switches.get(n, c.default_enabled)}
    fusions = []
    for name in sorted(set(applied) | set(expected) | off):
        a = applied.get(name, {"match": 0, "effect": 0, "section": ""})
        if name in off:
            plan, verdict = "switched off", ("as planned" if a["effect"] == 0 else "applied though switched off")
        elif name in expected:
            plan = "expected" if expected[name] else "graphpass finds none"
            verdict = ("as planned" if (a["effect"] > 0) == (expected[name] > 0)
                       else ("expected, not applied" if expected[name] else "applied (not forecast)"))
        else:
            plan, verdict = "no forecast", "applied (not forecast)" if a["effect"] else "as planned"
        fusions.append({"name": name, "section": a["section"], "plan": plan, "match": a["match"],
                        "effect": a["effect"], "verdict": verdict})
    report = AtcCheckReport(fusions, {}, {})
    if ge_graph is None:
        report.notes.append("no --ge-graph: TransData and AI CPU placement not compared")
        return report
    f, ops = read_ge_graph(ge_graph)
    report.ge_graph = str(f)
    est = gp.estimate(loaded, target)
    producers = {t.name: n.name for n in loaded.graph.nodes for t in n.outputs}
    forecast = [producers.get(i["tensor"], i["tensor"]) for i in est.transdata.get("implicit_list", [])]
    forecast += [n["name"] for n in est.nodes if n.get("op") == "TransData"]
    atc_td = [op["inputs"][0].rsplit(":", 1)[0] if op["inputs"] else op["name"] for op in ops if op["type"] == "TransData"]
    report.transdata = _compare(forecast, atc_td)
    ai_forecast = [n["name"] for n in est.nodes if n.get("engine") == "AICPU"]
    ai_atc = []
    for op in ops:
        if op["engine"].lower().startswith("aicpu"):
            ai_atc += op["original"] or [op["name"]]
    report.aicpu = _compare(ai_forecast, ai_atc)
    return report


def _compare(forecast: list[str], atc: list[str]) -> dict[str, Any]:
    fs, as_ = set(forecast), set(atc)
    return {"forecast": len(forecast), "atc": len(atc), "both": sorted(fs & as_),
            "only_forecast": sorted(fs - as_), "only_atc": sorted(as_ - fs)}
