"""graphpass beside Huawei's own ONNX optimizer, auto_optimizer (the `ait-surgeon` package),
on the onnx light models and the real-exporter corpus.

    python benchmarks/auto_optimizer.py --setup                 # makes auto_optimizer's venv (once)
    python benchmarks/auto_optimizer.py [--corpus exporters light] [--target ascend910a] [--json ao.json]
    python benchmarks/auto_optimizer.py --render ao.json        # the README's Markdown; runs nothing

auto_optimizer pins an old onnxruntime (>= 1.14.1, < 1.16) and its own packages, so it lives in a
venv of its own (``--ao-venv``, default /tmp/graphpass-ao-venv). ``--setup`` creates it: onnx,
numpy < 2, onnxruntime 1.15, click and click_aliases from the registry, then the ait-surgeon
source (``pip download --no-deps ait-surgeon``, or ``--ao-source`` a downloaded sdist) installed
without its dependencies: the ONNX-only parts used here (the graph, the knowledges, the
optimizer) need nothing else (``ms-ait`` and ``skl2onnx`` serve its inference and other tools).
Nothing of auto_optimizer enters graphpass's install or test path.

Per model, each tool in a fresh process on the same file (auto_optimizer with its default
knowledges, the ones its CLI applies: every registered one but its "default off" list; graphpass
``optimize`` with the default pipeline and ``--target``):

- nodes left (every graph and subgraph, peers.py's ``node_count``);
- AI CPU ops: nodes the cost model's data puts on AI CPU on the target (graphpass's estimate of
  each output; the same op tables judge both tools);
- whether the outputs still match the original's in onnxruntime on the same seeded inputs
  (graphpass.check.verify.check_outputs: exact for integers, floats within 1e-4 relative);
- the tool's process time.

The table marks each model where graphpass leaves more nodes or more AI CPU ops than
auto_optimizer ("behind"), and each output that does not match.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

import graphpass  # noqa: F401  (before peers puts tests/ on sys.path: its tests/graphpass folder would shadow it)

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
from peers import models, node_count  # noqa: E402

DEFAULT_VENV = Path(tempfile.gettempdir()) / "graphpass-ao-venv"

#: run inside auto_optimizer's venv: argv = src dst; prints the applied knowledges as JSON
_AO_JOB = """
import json, sys
from auto_optimizer.common.click_utils import default_off_knowledges
from auto_optimizer.graph_optimizer.optimizer import GraphOptimizer
from auto_optimizer.graph_refactor.onnx.graph import OnnxGraph
from auto_optimizer.pattern.knowledge_factory import KnowledgeFactory
names = [k for k in KnowledgeFactory.get_knowledge_pool() if k not in default_off_knowledges]
graph = OnnxGraph.parse(sys.argv[1], add_name_suffix=False)
graph, applied = GraphOptimizer(names).apply_knowledges(graph)
graph.save(sys.argv[2])
print(json.dumps({"applied": applied}))
"""


def setup(venv: Path, source: str | None) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["onnxruntime>=1.14.1,<1.16", "onnx>=1.14,<1.17", "numpy<2", "click", "click_aliases"], check=True)
    if source is None:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "download", "-q", "--no-deps", "ait-surgeon",
                            "-d", tmp], check=True)
            source = str(next(Path(tmp).iterdir()))
            subprocess.run(pip + ["--no-deps", source], check=True)
    else:
        subprocess.run(pip + ["--no-deps", source], check=True)


def _run(cmd: list[str], cwd: Path, timeout: int) -> tuple[float, subprocess.CompletedProcess | str]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, f"timed out after {timeout} s"
    return time.perf_counter() - t0, proc


def aicpu_ops(path: Path, target: str) -> int | None:
    """Nodes the target's cost model places on AI CPU in the model at ``path``."""
    import graphpass as gp
    from graphpass.errors import GraphpassError

    try:
        report = gp.estimate(gp.load(path), target=target)
    except GraphpassError:
        return None
    return sum(1 for rec in report.nodes if rec.get("engine") == "AICPU")


def measure(name: str, src: Path, feeds: dict, folder: Path, venv: Path, target: str, timeout: int) -> list[dict]:
    from graphpass.check import verify as V

    ref = V.run(V.session(str(src)), feeds)
    rows = [{"model": name, "tool": "(original)", "nodes": node_count(onnx.load(str(src), load_external_data=False)),
             "aicpu": aicpu_ops(src, target), "seconds": None, "matches": True, "error": None, "applied": None}]
    graphpass_exe = shutil.which("graphpass") or str(Path(sys.executable).parent / "graphpass")
    tools = {
        "graphpass": lambda dst: [graphpass_exe, "optimize", str(src.resolve()), "-o", str(dst), "--target", target, "-q"],
        "auto_optimizer": lambda dst: [str(venv / "bin" / "python"), "-c", _AO_JOB, str(src.resolve()), str(dst)],
    }
    for tool, command in tools.items():
        out_dir = folder / tool / name
        out_dir.mkdir(parents=True, exist_ok=True)
        dst = (out_dir / src.name).resolve()
        row = {"model": name, "tool": tool, "nodes": None, "aicpu": None, "seconds": None, "matches": False,
               "error": None, "applied": None}
        rows.append(row)
        seconds, proc = _run(command(dst), out_dir, timeout)
        if isinstance(proc, str):
            row["error"] = proc
            continue
        row["seconds"] = round(seconds, 2)
        if proc.returncode or not dst.exists():
            lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
            row["error"] = (lines or ["failed"])[-1][:120]
            continue
        if tool == "auto_optimizer":
            try:
                row["applied"] = json.loads(proc.stdout.strip().splitlines()[-1])["applied"]
            except (ValueError, IndexError, KeyError):
                row["applied"] = None
        row["nodes"] = node_count(onnx.load(str(dst), load_external_data=False))
        row["aicpu"] = aicpu_ops(dst, target)
        try:
            got = V.run(V.session(str(dst)), feeds)
        except Exception as e:  # noqa: BLE001 - a result that does not run is a result
            row["error"] = "does not run: " + (str(e).splitlines() or [""])[0][:100]
            continue
        checked = V.check_outputs(ref, got, feeds)
        row["matches"] = checked.ok
        if not checked.ok:
            row["error"] = checked.describe().splitlines()[0][:120]
    return rows


def behind(rows: list[dict]) -> list[dict]:
    """Models where graphpass leaves more nodes or more AI CPU ops than auto_optimizer (both ran)."""
    by = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["tool"]] = r
    out = []
    for model, t in by.items():
        g, a = t.get("graphpass"), t.get("auto_optimizer")
        if not g or not a or g["nodes"] is None or a["nodes"] is None or not a["matches"]:
            continue
        worse = [k for k in ("nodes", "aicpu") if g[k] is not None and a[k] is not None and g[k] > a[k]]
        if worse:
            out.append({"model": model, "worse": worse, "graphpass": {k: g[k] for k in ("nodes", "aicpu")},
                        "auto_optimizer": {k: a[k] for k in ("nodes", "aicpu")}})
    return out


def render(rows: list[dict]) -> str:
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["tool"]] = r
    lines = ["| model | nodes: original / graphpass / auto_optimizer | AI CPU ops: original / graphpass / auto_optimizer "
             "| outputs match: graphpass / auto_optimizer | time s: graphpass / auto_optimizer | auto_optimizer applied |",
             "|---|---|---|---|---|---|"]

    def cell(r, k):
        if r is None:
            return "-"
        if r.get("error") and r.get(k) is None:
            return "failed"
        return "-" if r.get(k) is None else str(r[k])

    def ok(r):
        if r is None:
            return "-"
        if r["matches"]:
            return "yes"
        err = r.get("error") or ""
        return "**no** (does not run)" if err.startswith("does not run") else "**no** (failed)" if r["nodes"] is None \
            else "**no** (outputs differ)"

    lagging = {b["model"] for b in behind(rows)}
    for model, t in by.items():
        o, g, a = t.get("(original)"), t.get("graphpass"), t.get("auto_optimizer")
        mark = " (behind)" if model in lagging else ""
        applied = ", ".join(k.removeprefix("Knowledge") for k in (a or {}).get("applied") or []) or "-"
        lines.append(f"| {model}{mark} | {cell(o, 'nodes')} / {cell(g, 'nodes')} / {cell(a, 'nodes')} "
                     f"| {cell(o, 'aicpu')} / {cell(g, 'aicpu')} / {cell(a, 'aicpu')} | {ok(g)} / {ok(a)} "
                     f"| {cell(g, 'seconds')} / {cell(a, 'seconds')} | {applied} |")
    n = len(by)
    broke = sum(1 for t in by.values() if t.get("auto_optimizer") and not t["auto_optimizer"]["matches"])
    gbroke = sum(1 for t in by.values() if t.get("graphpass") and not t["graphpass"]["matches"])
    lines += ["", f"{n} models; graphpass behind auto_optimizer on {len(lagging)}; outputs changed: graphpass {gbroke}, "
              f"auto_optimizer {broke}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="create auto_optimizer's venv and exit")
    ap.add_argument("--ao-venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--ao-source", default=None, help="an ait-surgeon sdist/zip (default: pip download it)")
    ap.add_argument("--corpus", nargs="+", default=["exporters", "light"])
    ap.add_argument("--models", nargs="*", default=None, help="only these model names")
    ap.add_argument("--target", default="ascend910a")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--render", default=None, metavar="ROWS.json", help="print the Markdown of saved rows; runs nothing")
    args = ap.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())["rows"]))
        return 0
    if args.setup:
        setup(args.ao_venv, args.ao_source)
        return 0
    if not (args.ao_venv / "bin" / "python").exists():
        print(f"no auto_optimizer venv at {args.ao_venv}: run with --setup first", file=sys.stderr)
        return 2
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, src, feeds in models(args.corpus, args.models, folder):
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows += measure(name, src, feeds, folder, args.ao_venv, args.target, args.timeout)
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "rows": rows, "behind": behind(rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
