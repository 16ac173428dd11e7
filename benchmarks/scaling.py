"""How graphpass scales: load, each pass, save and the whole optimize on 1k/10k/100k nodes.

    python benchmarks/scaling.py                 # 1k, 10k, 100k residual stacks + wide fan-out
    python benchmarks/scaling.py --sizes 1000 10000
    python benchmarks/scaling.py --pipeline cleanup --target none   # the cleanup passes alone

The residual stack uses 44-channel 3x3 convolutions by default, so the 100k-node graph weighs
about 0.9 GB (the size of a large detector's weights); ``--channels`` changes it.
By default the pipeline is what ``graphpass optimize`` runs: the default pipeline (every default
pass, layout and placement included) with the ascend910a cost model scoring each application;
``--pipeline``/``--target`` choose another (benchmarks/cost_model.py times the estimate itself).
For each graph: the time of onnx.load + onnx.save of the same file (the baseline), graphpass's
load, every pass (summed over the fixed-point rounds), save, and the end-to-end
optimize (load + pipeline + save), with its ratio to the baseline. Then time(100k)/time(10k).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import residual_stack, wide_fanout  # noqa: E402

import graphpass as gp  # noqa: E402
from graphpass.ir.graph import count_nodes  # noqa: E402


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure(kind: str, n: int, folder: Path, channels: int = 44, pipeline: str | None = None,
            target: str = "ascend910a") -> dict:
    model = residual_stack(n, channels=channels) if kind == "residual" else wide_fanout(n)
    path = folder / f"{kind}_{n}.onnx"
    onnx.save(model, path)
    del model
    size = path.stat().st_size
    m, t_load = _timed(lambda: onnx.load(path))
    _, t_save = _timed(lambda: onnx.save(m, folder / "copy.onnx"))
    del m
    graph, gp_load = _timed(lambda: gp.load(path).graph)
    nodes = count_nodes(graph)
    result, gp_opt = _timed(lambda: gp.optimize(graph, pipeline=pipeline, target=target))
    _, gp_save = _timed(lambda: gp.save(result.graph, folder / "out.onnx"))
    per_pass = collections.defaultdict(float)
    for r in result.report.passes:
        per_pass[r.name] += r.seconds
    baseline = t_load + t_save
    total = gp_load + gp_opt + gp_save
    for f in ("copy.onnx", "out.onnx"):
        (folder / f).unlink(missing_ok=True)
    path.unlink()
    return {
        "graph": f"{kind} {n // 1000}k", "nodes": nodes, "nodes_after": result.report.nodes_after,
        "MB": size / 1e6, "onnx_load+save": baseline, "gp_load": gp_load, "pipeline": gp_opt,
        "gp_save": gp_save, "optimize_total": total, "ratio": total / baseline, "per_pass": dict(per_pass),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--kinds", nargs="+", default=["residual", "fanout"], choices=["residual", "fanout"])
    ap.add_argument("--pipeline", default=None, help="pipeline name (default: the default pipeline)")
    ap.add_argument("--target", default="ascend910a", help="cost-model target (none: no scoring)")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--channels", type=int, default=44,
                    help="conv width of the residual stack; 44 makes the 100k-node graph ~0.9 GB, the size "
                         "of a large detector's weights")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    if args.one:
        kind, n = args.one[0], int(args.one[1])
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(kind, n, Path(tmp), args.channels, args.pipeline, args.target)))
        return 0
    rows = []
    for kind in args.kinds:
        for n in args.sizes:
            # one fresh process per graph: heap state left by a big graph distorts the next one
            cmd = [sys.executable, __file__, "--one", kind, str(n), "--channels", str(args.channels),
                   "--target", args.target] + (["--pipeline", args.pipeline] if args.pipeline else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"measured {rows[-1]['graph']}", file=sys.stderr)
    what = f"pipeline {args.pipeline or 'default'}, target {args.target}"
    t = Table(title=f"graphpass scaling, {what} (seconds; ratio = optimize total (load + pipeline + save) / (onnx.load + onnx.save))")
    cols = ["graph", "nodes", "nodes_after", "MB", "onnx_load+save", "gp_load", "pipeline", "gp_save", "optimize_total", "ratio"]
    for c in cols:
        t.add_column(c, justify="left" if c == "graph" else "right")
    for r in rows:
        t.add_row(*[f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols])
    console = Console(width=160)
    console.print(t)
    p = Table(title="per pass (seconds, summed over rounds)")
    names = sorted({k for r in rows for k in r["per_pass"]})
    p.add_column("graph")
    for n in names:
        p.add_column(n.replace("eliminate_", "elim_"), justify="right")
    for r in rows:
        p.add_row(r["graph"], *[f"{r['per_pass'].get(n, 0):.2f}" for n in names])
    console.print(p)
    for kind in args.kinds:
        big = [r for r in rows if r["graph"].startswith(kind)]
        if len(big) >= 2:
            a, b = big[-2], big[-1]
            console.print(
                f"{kind}: {b['nodes'] / a['nodes']:.1f}x the nodes -> pipeline time x{b['pipeline'] / a['pipeline']:.1f}, "
                f"end-to-end x{b['optimize_total'] / a['optimize_total']:.1f} "
                f"(onnx.load + onnx.save alone x{b['onnx_load+save'] / a['onnx_load+save']:.1f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
