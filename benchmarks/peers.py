"""graphpass's pipelines beside the portable ONNX optimizers, on real exports and the light models.

    pip install -e '.[peers]'
    python benchmarks/peers.py                                 # the exporter corpus + the light models
    python benchmarks/peers.py --corpus exporters --json peers.json
    python benchmarks/peers.py --corpus /tmp/corpus-full       # export_corpus.py --full's folder
    python benchmarks/peers.py --corpus light synthetic --models light_resnet50 --repeat 20

Corpora (``--corpus``, several may be given; default ``exporters light``):

- ``exporters``: tests/data/exporters, what torch's TorchScript and dynamo exporters write
  (benchmarks/export_corpus.py); fed seeded inputs of the export's example shapes, token ids
  within the vocabulary (the manifest says);
- ``light``: the model-zoo architectures shipped with onnx, their 0.02 weight fills replaced by
  seeded random weights as in the tests;
- ``synthetic``: residual stacks of 1k and 10k nodes;
- a folder holding a manifest.json written by export_corpus.py (``--full`` exports).

Tools (``--tools``): graphpass's ``neutral`` pipeline (``--target none``: the cleanup passes and
the fusions whose result is standard ONNX) and its ``default`` pipeline (default target, portable
output), onnxsim, onnxslim, onnxoptimizer, onnxruntime's offline optimizer at the basic and the
extended level (``SessionOptions.optimized_model_filepath``; the extended output holds
com.microsoft ops, not standard ONNX), and Polygraphy (``polygraphy surgeon sanitize
--fold-constants``). Each tool runs in its own process on the same file (load, optimize, save:
the time is that whole job, interpreter start included). For each result: nodes left (the nodes
of the main graph, of every If/Loop/Scan body and of local functions, counted by one function,
:func:`node_count`, for every tool), the file size with its external data, whether the output
is standard ONNX (only the ai.onnx domains), whether onnxruntime runs it, and whether its outputs
match the original's on the same inputs (graphpass's default tolerance, the same for every tool;
the column gives the largest difference relative to the largest absolute output).
``--repeat N`` adds onnxruntime CPU latency (median of N runs, ORT_ENABLE_ALL / ORT_DISABLE_ALL).
``--json FILE`` writes every row for other scripts. After the table, per model: where graphpass's
neutral pipeline leaves more nodes than the best standard peer, or a bigger file.
A tool that is not installed or fails shows its error in the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "tests"))
sys.path.insert(0, str(_HERE.parent / "tests" / "exporters"))
from _synthetic import residual_stack  # noqa: E402

# a source with external data: the result's initializers go to a data file of its own (onnxruntime
# would otherwise point them at the source's file, which is not beside the result)
_ORT = ("import onnx, onnxruntime as ort, os, sys\n"
        "so = ort.SessionOptions()\n"
        "so.graph_optimization_level = ort.GraphOptimizationLevel.{level}\n"
        "so.optimized_model_filepath = sys.argv[2]\n"
        "m = onnx.load(sys.argv[1], load_external_data=False)\n"
        "if any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer):\n"
        "    so.add_session_config_entry('session.optimized_model_external_initializers_file_name',\n"
        "                                os.path.basename(sys.argv[2]) + '.data')\n"
        "    so.add_session_config_entry('session.optimized_model_external_initializers_min_size_in_bytes', '1024')\n"
        "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n")

#: tool -> a Python job (argv: source, destination) or a command (``{src}``, ``{dst}``)
_JOBS: dict[str, str | list[str]] = {
    "graphpass-neutral": "import graphpass as gp, sys\n"
                         "r = gp.optimize(sys.argv[1], pipeline='neutral', target='none')\n"
                         "gp.save(r.model, sys.argv[2])\n",
    "graphpass-default": "import graphpass as gp, sys\n"
                         "r = gp.optimize(sys.argv[1])\n"
                         "gp.save(r.model, sys.argv[2])\n",
    "onnxsim": "import onnx, onnxsim, sys\n"
               "m, ok = onnxsim.simplify(onnx.load(sys.argv[1]))\n"
               "assert ok, 'onnxsim could not validate its result'\n"
               "onnx.save(m, sys.argv[2])\n",
    "onnxslim": "import onnxslim, sys\n"
                "onnxslim.slim(sys.argv[1], sys.argv[2])\n",
    "onnxoptimizer": "import onnx, onnxoptimizer, sys\n"
                     "m = onnxoptimizer.optimize(onnx.load(sys.argv[1]))\n"
                     "onnx.save(m, sys.argv[2])\n",
    "ort-basic": _ORT.format(level="ORT_ENABLE_BASIC"),
    "ort-extended": _ORT.format(level="ORT_ENABLE_EXTENDED"),
    "polygraphy": ["polygraphy", "surgeon", "sanitize", "{src}", "--fold-constants", "-o", "{dst}"],
}
_STANDARD_DOMAINS = {"", "ai.onnx", "ai.onnx.ml"}
NEUTRAL = "graphpass-neutral"


# ------------------------------------------------------------------------------------------
# what every tool's output is measured by (one function each, the same for every tool)

def _graphs(model: onnx.ModelProto):
    """The main graph, every subgraph (If/Loop/Scan bodies, nested) and every local function's body
    (as a node list)."""
    todo = [model.graph]
    while todo:
        g = todo.pop()
        yield g
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    todo.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    todo.extend(a.graphs)
    for f in model.functions:
        yield f


def node_count(model: onnx.ModelProto) -> int:
    """Nodes of the main graph, of every subgraph and of every local function: the one count
    used for every tool's output and for the original."""
    return sum(len(g.node) for g in _graphs(model))


def is_standard(model: onnx.ModelProto) -> bool:
    """Every node is in an ai.onnx domain (or calls a local function of the model)."""
    local = {(f.domain, f.name) for f in model.functions}
    return all(n.domain in _STANDARD_DOMAINS or (n.domain, n.op_type) in local for g in _graphs(model) for n in g.node)


def file_bytes(path: Path) -> int:
    """The file and the external data files its tensors point to (each counted once)."""
    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for g in _graphs(model):
        tensors = list(getattr(g, "initializer", []))
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    tensors.append(a.t)
                elif a.type == onnx.AttributeProto.TENSORS:
                    tensors.extend(a.tensors)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                locations.update(e.value for e in t.external_data if e.key == "location")
    return path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations
                                     if (path.parent / loc).exists())


# ------------------------------------------------------------------------------------------
# corpora: (name, path, feeds)

def _exporters(folder: Path, names: list[str] | None) -> list[tuple[str, Path, dict]]:
    from _corpus import exported, feeds_for

    out = []
    for e in exported(folder):
        name = e["file"].removesuffix(".onnx")
        if names and name not in names and e["model"] not in names:
            continue
        out.append((name, folder / e["file"], feeds_for(e)))
    return out


def _light(folder: Path, names: list[str] | None) -> list[tuple[str, Path, dict]]:
    from conftest import randomize_light_weights  # the tests' helper

    from graphpass.check import verify as V
    from graphpass.conformance import light_models

    out = []
    for p in light_models():
        name = Path(p).stem
        if names and name not in names:
            continue
        dst = folder / f"{name}.onnx"
        onnx.save(randomize_light_weights(onnx.load(p)), dst)
        out.append((name, dst, V.random_inputs(V.session(str(dst)), seed=0)))
    return out


def _synthetic(folder: Path, names: list[str] | None) -> list[tuple[str, Path, dict]]:
    from graphpass.check import verify as V

    out = []
    for n in (1_000, 10_000):
        name = f"residual_{n // 1000}k"
        if names and name not in names:
            continue
        dst = folder / f"{name}.onnx"
        onnx.save(residual_stack(n, channels=16, weight_scale=0.01), dst)  # stays finite
        out.append((name, dst, V.random_inputs(V.session(str(dst)), seed=0)))
    return out


def models(corpora: list[str], names: list[str] | None, folder: Path) -> list[tuple[str, Path, dict]]:
    from _corpus import DATA

    out = []
    for c in corpora:
        if c == "exporters":
            out += _exporters(DATA, names)
        elif c == "light":
            out += _light(folder, names)
        elif c == "synthetic":
            out += _synthetic(folder, names)
        elif (Path(c) / "manifest.json").exists():
            out += _exporters(Path(c), names)
        else:
            print(f"--corpus {c}: not exporters, light, synthetic or a folder with a manifest.json", file=sys.stderr)
            raise SystemExit(2)
    return out


# ------------------------------------------------------------------------------------------

def _latency(path: Path, feeds: dict, level, repeat: int) -> float:
    from graphpass.check import runtime

    sess = runtime.session(str(path), optimize=True, graph_optimization_level=level, intra_op_num_threads=1)
    sess.run(None, feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _command(tool: str, src: Path, dst: Path) -> list[str]:
    job = _JOBS[tool]
    if isinstance(job, str):
        return [sys.executable, "-c", job, str(src), str(dst)]
    exe = Path(sys.executable).parent / job[0]
    head = str(exe) if exe.exists() else (shutil.which(job[0]) or job[0])
    return [head] + [a.format(src=src, dst=dst) for a in job[1:]]


def measure(name: str, src: Path, feeds: dict, tools: list[str], folder: Path, timeout: int, repeat: int) -> list[dict]:
    """One row for the original and one per tool."""
    import onnxruntime as ort

    from graphpass.check import verify as V

    levels = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    original = onnx.load(str(src), load_external_data=False)
    ref = V.run(V.session(str(src)), feeds)
    rows = [{"model": name, "tool": "(original)", "seconds": None, "nodes": node_count(original),
             "bytes": file_bytes(src), "standard": is_standard(original), "runs": True, "matches": True,
             "max_rel_diff": 0.0, "error": None}]
    if repeat:
        rows[0]["ms"] = [_latency(src, feeds, lv, repeat) for lv in levels]
    for tool in tools:
        out_dir = folder / tool / name
        out_dir.mkdir(parents=True, exist_ok=True)
        dst = out_dir / src.name
        row = {"model": name, "tool": tool, "seconds": None, "nodes": None, "bytes": None, "standard": None,
               "runs": False, "matches": False, "max_rel_diff": None, "error": None}
        rows.append(row)
        t0 = time.perf_counter()
        try:
            # each tool runs in its own output folder: some write temporaries (uuid-named external
            # data, onnxruntime's sym_shape_infer_temp.onnx) into the current directory
            proc = subprocess.run(_command(tool, src.resolve(), dst.resolve()), capture_output=True, text=True, timeout=timeout,
                                  cwd=out_dir)
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {timeout} s"
            continue
        except OSError as e:
            row["error"] = f"not installed: {e}"
            continue
        row["seconds"] = round(time.perf_counter() - t0, 2)
        if proc.returncode or not dst.exists():
            lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
            row["error"] = (lines or ["failed"])[-1][:120]
            continue
        out = onnx.load(str(dst), load_external_data=False)
        row.update(nodes=node_count(out), bytes=file_bytes(dst), standard=is_standard(out))
        try:
            got = V.run(V.session(str(dst)), feeds)
        except Exception as e:  # noqa: BLE001 - a result that does not run is a result
            row["error"] = "does not run: " + (str(e).splitlines() or [""])[0][:100]
            continue
        row["runs"] = True
        missing = [k for k in ref if k not in got]
        if missing:
            row["error"] = f"outputs missing: {missing}"
            continue
        checked = V.check_outputs(ref, got, feeds)
        row["matches"] = checked.ok
        row["max_rel_diff"] = max((float(np.max(np.abs(np.asarray(got[k], np.float64) - np.asarray(ref[k], np.float64))))
                                   / max(float(np.max(np.abs(np.asarray(ref[k], np.float64)))), 1e-30)
                                   for k in ref if np.asarray(ref[k]).size and np.asarray(ref[k]).dtype.kind in "fiu"),
                                  default=0.0)
        if not checked.ok:
            row["error"] = checked.describe().splitlines()[0][:120]
        if repeat:
            row["ms"] = [_latency(dst, feeds, lv, repeat) for lv in levels]
    return rows


def _size(b: int | None) -> str:
    return "" if b is None else f"{b / 1e6:.2f} MB" if b >= 1e6 else f"{b / 1e3:.0f} kB"


def _fmt_row(r: dict, repeat: int) -> str:
    size = _size

    cells = [r["model"], r["tool"], "-" if r["seconds"] is None and r["tool"] == "(original)" else
             ("" if r["seconds"] is None else f"{r['seconds']:.2f}"),
             "" if r["nodes"] is None else f"{r['nodes']:,}", size(r["bytes"]),
             "" if r["standard"] is None else ("yes" if r["standard"] else "no"),
             "yes" if r["runs"] else "no",
             "-" if r["tool"] == "(original)" else ("yes" if r["matches"] else "no") +
             ("" if r["max_rel_diff"] is None else f" ({r['max_rel_diff']:.1g})")]
    if repeat:
        cells += [f"{m:.2f}" for m in r.get("ms", ["", ""])] if r.get("ms") else ["", ""]
    cells.append(r["error"] or "")
    return "| " + " | ".join(cells) + " |"


def gaps(rows: list[dict]) -> list[dict]:
    """Per model: the neutral pipeline against the best peer whose output is standard ONNX, runs
    and matches (fewest nodes; the smallest file among those)."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        orig = next(r for r in mine if r["tool"] == "(original)")
        gp_row = next((r for r in mine if r["tool"] == NEUTRAL), None)
        peers = [r for r in mine if not r["tool"].startswith("graphpass") and r["tool"] != "(original)"
                 and r["standard"] and r["matches"]]
        if gp_row is None or not peers:
            continue
        best = min(peers, key=lambda r: (r["nodes"], r["bytes"]))
        out.append({"model": name, "original_nodes": orig["nodes"], "original_bytes": orig["bytes"],
                    "graphpass_nodes": gp_row["nodes"], "graphpass_bytes": gp_row["bytes"],
                    "graphpass_ok": bool(gp_row["matches"]), "best_peer": best["tool"], "best_nodes": best["nodes"],
                    "best_bytes": best["bytes"],
                    "more_nodes": None if gp_row["nodes"] is None else gp_row["nodes"] - best["nodes"],
                    "growth": None if gp_row["bytes"] is None else gp_row["bytes"] / orig["bytes"] - 1})
    return out


def summary(rows: list[dict], field: str = "nodes") -> str:
    """One line per model, one column per tool: nodes left (or the file size in MB); a result
    that does not run or does not match is marked with its reason; ``*``: not standard ONNX."""
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    lines = ["| model | " + " | ".join(tools) + " |", "|---|" + "---:|" * len(tools)]
    for name in dict.fromkeys(r["model"] for r in rows):
        cells = []
        for tool in tools:
            r = next((r for r in rows if r["model"] == name and r["tool"] == tool), None)
            if r is None or r[field] is None:
                cells.append("fails" if r is not None else "")
                continue
            v = f"{r[field]:,}" if field == "nodes" else _size(r[field])
            if r["standard"] is False:
                v += "*"
            if not r["runs"]:
                v += " (does not run)"
            elif not r["matches"]:
                v += " (differs)"
            cells.append(v)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", nargs="+", default=["exporters", "light"],
                    help="exporters, light, synthetic, or a folder with export_corpus.py's manifest.json")
    ap.add_argument("--models", nargs="*", default=None, help="names (resnet18, resnet18.dynamo, light_resnet50, ...)")
    ap.add_argument("--tools", nargs="*", default=list(_JOBS), choices=list(_JOBS))
    ap.add_argument("--repeat", type=int, default=0, help="latency runs per model and tool (0: no latency)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per tool and model")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and the gaps to this file")
    ap.add_argument("--render", type=Path, default=None, help="print the summaries of an earlier --json file; run nothing")
    args = ap.parse_args(argv)
    if args.render:
        _report(json.loads(args.render.read_text())["rows"])
        return 0
    for c in args.corpus:
        if c not in ("exporters", "light", "synthetic") and not (Path(c) / "manifest.json").exists():
            ap.error(f"--corpus {c}: not exporters, light, synthetic or a folder with a manifest.json")

    head = ["model", "tool", "seconds", "nodes", "size", "standard", "runs", "matches (max diff)"]
    if args.repeat:
        head += ["ORT ms (ENABLE_ALL)", "ORT ms (DISABLE_ALL)"]
    head.append("error")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if h in ("seconds", "nodes", "size") else "---" for h in head) + "|")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, src, feeds in models(args.corpus, args.models, folder):
            for r in measure(name, src, feeds, args.tools, folder, args.timeout, args.repeat):
                rows.append(r)
                print(_fmt_row(r, args.repeat), flush=True)
    found = _report(rows)
    if args.json:
        totals = _totals(rows)
        args.json.write_text(json.dumps({"rows": rows, "gaps": found, "total_seconds": totals}, indent=1) + "\n")
    return 0


def _totals(rows: list[dict]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for r in rows:
        if r["seconds"] is not None:
            totals[r["tool"]] = round(totals.get(r["tool"], 0.0) + r["seconds"], 2)
    return totals


def _report(rows: list[dict]) -> list[dict]:
    """The summaries after the table: nodes and sizes per model and tool, the neutral pipeline's
    gaps, the total time per tool."""
    print("\nNodes left (* not standard ONNX):\n")
    print(summary(rows, "nodes"))
    print("\nFile size, external data included:\n")
    print(summary(rows, "bytes"))
    found = gaps(rows)
    print("\nWhere graphpass's neutral pipeline is behind the best standard peer (nodes) or grows the file:")
    behind = [g for g in found if (g["more_nodes"] or 0) > 0 or (g["growth"] or 0) > 0.01 or not g["graphpass_ok"]]
    for g in behind:
        if g["graphpass_nodes"] is None:
            print(f"- {g['model']}: graphpass failed")
            continue
        print(f"- {g['model']}: {g['graphpass_nodes']} nodes against {g['best_nodes']} ({g['best_peer']}); "
              f"file {g['growth']:+.1%} of the original ({g['graphpass_bytes'] / 1e6:.2f} MB; "
              f"{g['best_peer']}'s {g['best_bytes'] / 1e6:.2f} MB)" + ("" if g["graphpass_ok"] else "; output does not match"))
    if not behind:
        print("- nowhere")
    totals = _totals(rows)
    print("\nTotal seconds per tool: " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()))
    return found


if __name__ == "__main__":
    sys.exit(main())
