"""How graphpass scales beside the peers: synthetic models of 1k to 1M nodes, one process per tool.

    pip install -e '.[peers]'
    python benchmarks/scaling.py                                  # 1k, 10k, 100k; CNN and transformer
    python benchmarks/scaling.py --sizes 1000 10000 --json scaling.json
    nice -n 10 python benchmarks/scaling.py --sizes 1000000 --families cnn --tools graphpass
    python benchmarks/scaling.py --render scaling.json            # the README's Markdown; runs nothing

Models (``--families``, seeded random weights, small so that a 1M-node model stays a few
hundred MB; written with external data past 2 GB):

- ``cnn``: residual blocks Conv-BatchNorm-Relu-Conv-BatchNorm-Add-Relu with a little of what
  the cleanup passes remove (an Identity, a Transpose pair, a constant Add, duplicate Sigmoids),
  15 nodes per block, 8 channels, 8x8 (``_synthetic.residual_stack``);
- ``transformer``: layers of MatMul+Add projections, Transpose, scaled MatMul, Softmax,
  LayerNorm spelled out in its 9 parts, a Relu FFN and residual Adds, 38 nodes per layer,
  hidden 16 (``_synthetic.transformer_stack``).

Tools (``--tools``), each in a fresh process on the same file, with the folder of its output as
the working directory (some write temporaries there), one after another, each under
``--timeout`` seconds (default 600): ``graphpass`` (``graphpass optimize`` with the default
pipeline and target, ``--profile``), ``onnx`` (onnx.load + onnx.save: the floor), ``onnxsim``,
``onnxslim``, ``ort-basic`` and ``ort-extended`` (onnxruntime's offline optimizer:
``SessionOptions.optimized_model_filepath``; the extended output holds com.microsoft ops). The
runners are benchmarks/peers.py's. The time is the whole process (interpreter start and imports
included); the peak RSS is the tool's own (``os.wait4``'s ``ru_maxrss``, the tool started by a
~10 MB launcher: a fork counts the RSS it inherits before exec); nodes left are counted
by peers.py's ``node_count`` for every tool. Ratios: graphpass's time (peak RSS) over the
tool's, so below 1 means graphpass is faster (smaller). For graphpass, the footprint per node:
its peak RSS above the RSS it had before loading the model (from its ``--profile``), per input
node; and the phases that took the most time. A tool that is missing, fails or runs out of time
shows why in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
from _synthetic import residual_stack, transformer_stack  # noqa: E402
from peers import _JOBS, _command, node_count  # noqa: E402

FAMILIES = {
    "cnn": lambda n: residual_stack(n, channels=8, hw=8, weight_scale=0.01),
    "transformer": lambda n: transformer_stack(n),
}
#: above this the synthetic model is written with external data (protobuf's 2 GB limit)
EXTERNAL_ABOVE = 2_000_000_000
TOOLS = ["graphpass", "onnx", "onnxsim", "onnxslim", "ort-basic", "ort-extended"]
_EXTRA_JOBS = {
    "onnx": "import onnx, sys\nonnx.save(onnx.load(sys.argv[1]), sys.argv[2])\n",
}


def tool_command(tool: str, src: Path, dst: Path) -> list[str]:
    if tool == "graphpass":
        return [sys.executable, "-m", "graphpass", "optimize", str(src), "-o", str(dst), "-q", "--profile"]
    if tool in _EXTRA_JOBS:
        return [sys.executable, "-c", _EXTRA_JOBS[tool], str(src), str(dst)]
    return _command(tool, src, dst)


def write_model(family: str, n: int, folder: Path) -> tuple[Path, int]:
    """The synthetic model of ``family`` with about ``n`` nodes, in ``folder``; (path, nodes)."""
    model = FAMILIES[family](n)
    nodes = node_count(model)
    path = folder / f"{family}_{n}.onnx"
    if sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_ABOVE:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data",
                  size_threshold=1024)
    else:
        onnx.save(model, path)
    return path, nodes


#: Runs the tool as its child and writes "seconds peak_rss_kib exit_code" to argv[1]. A small
#: process between the benchmark and the tool: a forked child's ru_maxrss counts the RSS it
#: inherited before exec, and this one holds ~10 MB where the benchmark holds whole models.
_LAUNCHER = """import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as e:
        os.write(2, ("not installed: %s\\n" % e).encode())
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write("%r %d %d" % (time.perf_counter() - t0, usage.ru_maxrss, os.waitstatus_to_exitcode(status)))
"""


def run_child(cmd: list[str], cwd: Path, timeout: float) -> dict:
    """Run ``cmd`` in its own session with ``cwd``; its wall seconds, its own peak RSS (bytes),
    exit code and stderr; killed (with its process group) after ``timeout`` seconds."""
    result = cwd / "launcher.txt"
    result.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(cwd / "stdout.txt", "wb") as out, open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, str(result), *cmd], cwd=cwd, stdout=out,
                                stderr=err, start_new_session=True)
    try:
        proc.wait(timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the tool
        except ProcessLookupError:
            pass
        proc.wait()
    stderr = (cwd / "stderr.txt").read_text(errors="replace")
    if timed_out or not result.exists():
        return {"seconds": time.perf_counter() - t0, "peak_rss": None, "returncode": proc.returncode,
                "timed_out": timed_out, "stderr": stderr}
    seconds, peak, code = result.read_text().split()
    return {"seconds": float(seconds), "peak_rss": int(peak) * (1 if sys.platform == "darwin" else 1024),
            "returncode": int(code), "timed_out": False, "stderr": stderr}


_PROFILE_ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<calls>\d+)\s+(?P<total>[\d.]+)\s+(?P<self>[\d.]+)\s+"
                          r"(?P<peak>\d+)\s+(?P<raised>[+-]\d+)$")


def parse_profile(stderr: str) -> list[dict]:
    """The rows of ``graphpass optimize --profile``'s table (seconds, MB)."""
    rows = []
    for line in stderr.splitlines():
        m = _PROFILE_ROW.match(line)
        if m:
            rows.append({"phase": m["name"], "calls": int(m["calls"]), "seconds": float(m["total"]),
                         "self_seconds": float(m["self"]), "peak_mb": int(m["peak"]), "raised_mb": int(m["raised"])})
    return rows


def measure(family: str, n: int, tools: list[str], folder: Path, timeout: float) -> list[dict]:
    src, nodes = write_model(family, n, folder)
    rows = []
    for tool in tools:
        out_dir = folder / tool
        out_dir.mkdir(exist_ok=True)
        dst = out_dir / src.name
        row = {"family": family, "size": n, "nodes": nodes, "MB": round(src.stat().st_size / 1e6, 1), "tool": tool,
               "seconds": None, "peak_rss": None, "nodes_left": None, "error": None}
        rows.append(row)
        try:
            r = run_child(tool_command(tool, src.resolve(), dst.resolve()), out_dir, timeout)
        except OSError as e:
            row["error"] = f"not installed: {e}"
            continue
        row["seconds"] = round(r["seconds"], 2)
        row["peak_rss"] = r["peak_rss"]
        if r["timed_out"]:
            row["error"] = f"timed out after {timeout:g} s"
        elif r["returncode"] or not dst.exists():
            lines = [ln for ln in r["stderr"].strip().splitlines() if ln.strip() and not _PROFILE_ROW.match(ln)]
            row["error"] = (lines or [f"exit {r['returncode']}"])[-1][:120]
        else:
            row["nodes_left"] = node_count(onnx.load(str(dst), load_external_data=False))
        if tool == "graphpass":
            row["profile"] = parse_profile(r["stderr"])
        for f in out_dir.iterdir():  # the next tool and size start from an empty folder
            f.unlink()
    src.unlink()
    Path(str(src) + ".data").unlink(missing_ok=True)
    _ratios(rows)
    return rows


def _ratios(rows: list[dict]) -> None:
    gp = next((r for r in rows if r["tool"] == "graphpass" and r["error"] is None), None)
    for r in rows:
        ok = gp is not None and r["error"] is None and r["seconds"]
        r["time_ratio"] = round(gp["seconds"] / r["seconds"], 2) if ok else None
        r["rss_ratio"] = round(gp["peak_rss"] / r["peak_rss"], 2) if ok and r["peak_rss"] else None
    if gp is not None and gp.get("profile"):
        load = next((p for p in gp["profile"] if p["phase"] == "load"), None)
        if load is not None:  # the high-water mark before the model was read: the interpreter and imports
            before = (load["peak_mb"] - load["raised_mb"]) * 2**20
            gp["bytes_per_node"] = round((gp["peak_rss"] - before) / gp["nodes"])
            gp["rss_before_load"] = before


def _cells(r: dict) -> list[str]:
    ratio = lambda v: "" if v is None or r["tool"] == "graphpass" else f"{v:.2f}"  # noqa: E731
    return [r["family"], f"{r['nodes']:,}", r["tool"],
            "" if r["seconds"] is None else f"{r['seconds']:.1f}",
            "" if r["peak_rss"] is None else f"{r['peak_rss'] / 2**20:,.0f}",
            "" if r["nodes_left"] is None else f"{r['nodes_left']:,}",
            ratio(r.get("time_ratio")), ratio(r.get("rss_ratio")), r["error"] or ""]


HEAD = ["model", "nodes", "tool", "seconds", "peak RSS MB", "nodes left", "graphpass/tool time",
        "graphpass/tool RSS", "error"]


def render(rows: list[dict], out=None) -> None:
    """The Markdown table and, per graphpass run, its footprint per node and costliest phases."""
    out = out or sys.stdout
    print("| " + " | ".join(HEAD) + " |", file=out)
    print("|---|" + "---:|" * 3 + "---:|" * 4 + "---|", file=out)
    for r in rows:
        print("| " + " | ".join(_cells(r)) + " |", file=out)
    print(file=out)
    for r in rows:
        if r["tool"] != "graphpass" or not r.get("profile"):
            continue
        top = sorted((p for p in r["profile"] if p["self_seconds"] > 0), key=lambda p: -p["self_seconds"])[:6]
        per_node = r.get("bytes_per_node")
        print(f"- graphpass, {r['family']} {r['nodes']:,} nodes: "
              + (f"{per_node / 1024:.1f} KiB per node above the {r['rss_before_load'] / 2**20:.0f} MB it held before "
                 f"loading; " if per_node is not None else "")
              + "most time in " + ", ".join(f"{p['phase']} {p['self_seconds']:.2f} s ({p['calls']}x)" for p in top),
              file=out)


def _compile_graphpass() -> None:
    """Byte-compile graphpass's sources, as ``pip install`` does for the peers: an editable
    install run with ``PYTHONDONTWRITEBYTECODE`` (as in some CI images) would otherwise compile
    every module in every run (~0.2 s of the process time at any size)."""
    import compileall

    import graphpass
    import graphpass.cost_model
    import graphpass.passes

    for package in (graphpass, graphpass.passes, graphpass.cost_model):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000],
                    help="nodes per model (default 1000 10000 100000; 1000000 is the large one)")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per tool and model (default 600)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows to this file")
    ap.add_argument("--render", type=Path, default=None, help="print the Markdown of an earlier --json file; run nothing")
    args = ap.parse_args(argv)
    if args.render:
        try:
            rows = json.loads(args.render.read_text())["rows"]
        except (OSError, ValueError, KeyError) as e:
            print(f"scaling.py: --render {args.render}: {e}", file=sys.stderr)
            return 2
        render(rows)
        return 0
    if any(n < 1 for n in args.sizes) or args.timeout <= 0:
        ap.error("--sizes and --timeout must be positive")
    if "graphpass" in args.tools:
        _compile_graphpass()
    rows: list[dict] = []
    print("| " + " | ".join(HEAD) + " |", flush=True)
    with tempfile.TemporaryDirectory(prefix="graphpass-scaling-") as tmp:
        for n in args.sizes:
            for family in args.families:
                for r in measure(family, n, args.tools, Path(tmp), args.timeout):
                    rows.append(r)
                    print("| " + " | ".join(_cells(r)) + " |", flush=True)
                if args.json:  # written after every model: a long run interrupted keeps what it measured
                    args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print()
    render(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
