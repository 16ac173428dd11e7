"""graphpass's hardware-neutral pipeline beside onnxsim, onnxslim and onnxoptimizer.

    pip install -e '.[peers]'
    python benchmarks/peers.py                       # light models + synthetic graphs
    python benchmarks/peers.py --models light_resnet50 --repeat 20

Each tool runs in its own process on the same model (load, optimize, save; the time is that
whole job). Then, for each result: its node count, onnxruntime CPU latency (median of
``--repeat`` runs after a warm-up, with ORT_ENABLE_ALL and ORT_DISABLE_ALL) and the largest
absolute output difference from the original on the same seeded input, relative to the largest
absolute output (the synthetic stacks' outputs reach 1e6, where float rounding alone is ~1). graphpass runs its
``neutral`` pipeline with ``--target none``: the cleanup passes plus the fusions whose result is
standard ONNX (BN/pad folding, Conv bias, MatMul+Add, Concat merging), no Ascend decisions. The zoo's ConstantOfShape weight fills are replaced by random weights first, as in
the tests, so that every tool sees real initializers. A tool that is not installed or fails
shows its error in the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _synthetic import residual_stack  # noqa: E402

_JOBS = {
    "graphpass": "import graphpass as gp, sys\n"
                 "r = gp.optimize(sys.argv[1], pipeline='neutral', target='none')\n"
                 "gp.save(r.graph, sys.argv[2])\n",
    "onnxsim": "import onnx, onnxsim, sys\n"
               "m, ok = onnxsim.simplify(onnx.load(sys.argv[1]))\n"
               "assert ok, 'onnxsim could not validate its result'\n"
               "onnx.save(m, sys.argv[2])\n",
    "onnxslim": "import onnxslim, sys\n"
                "onnxslim.slim(sys.argv[1], sys.argv[2])\n",
    "onnxoptimizer": "import onnx, onnxoptimizer, sys\n"
                     "m = onnxoptimizer.optimize(onnx.load(sys.argv[1]))\n"
                     "onnx.save(m, sys.argv[2])\n",
}


def _models(names: list[str] | None, folder: Path) -> list[tuple[str, Path]]:
    from conftest import randomize_light_weights  # the tests' helper

    from graphpass.conformance import light_models

    out = []
    for p in light_models():
        name = Path(p).stem
        if names and name not in names:
            continue
        dst = folder / f"{name}.onnx"
        onnx.save(randomize_light_weights(onnx.load(p)), dst)
        out.append((name, dst))
    for n in (1_000, 10_000):
        name = f"residual_{n // 1000}k"
        if names and name not in names:
            continue
        dst = folder / f"{name}.onnx"
        onnx.save(residual_stack(n, channels=16, weight_scale=0.01), dst)  # stays finite
        out.append((name, dst))
    return out


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=None, help="light_resnet50 ... residual_1k residual_10k")
    ap.add_argument("--tools", nargs="*", default=list(_JOBS))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per tool and model")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from graphpass.check import verify as V

    print("| model | tool | seconds | nodes | ORT ms (ENABLE_ALL) | ORT ms (DISABLE_ALL) | max diff / max abs output |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, src in _models(args.models, folder):
            sess = V.session(onnx.load(src))
            feeds = V.random_inputs(sess, seed=0)
            ref = V.run(sess, feeds)
            base = len(onnx.load(src, load_external_data=False).graph.node)
            lat = (_latency(src, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, args.repeat),
                   _latency(src, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, args.repeat))
            print(f"| {name} | (original) | - | {base:,} | {lat[0]:.2f} | {lat[1]:.2f} | - |", flush=True)
            for tool in args.tools:
                dst = folder / f"{name}.{tool}.onnx"
                t0 = time.perf_counter()
                try:
                    proc = subprocess.run([sys.executable, "-c", _JOBS[tool], str(src), str(dst)], capture_output=True,
                                          text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"| {name} | {tool} | > {args.timeout} | timed out | | | |", flush=True)
                    continue
                dt = time.perf_counter() - t0
                if proc.returncode or not dst.exists():
                    err = (proc.stderr.strip().splitlines() or ["failed"])[-1][:80]
                    print(f"| {name} | {tool} | {dt:.2f} | error: {err} | | | |", flush=True)
                    continue
                nodes = len(onnx.load(dst, load_external_data=False).graph.node)
                try:
                    got = V.run(V.session(onnx.load(dst)), feeds)
                    diff = max(float(np.abs(np.asarray(got[k], np.float64) - ref[k]).max())
                               / max(float(np.abs(ref[k]).max()), 1e-30) for k in ref)
                    lat = (_latency(dst, feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, args.repeat),
                           _latency(dst, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, args.repeat))
                    print(f"| {name} | {tool} | {dt:.2f} | {nodes:,} | {lat[0]:.2f} | {lat[1]:.2f} | {diff:.2g} |", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"| {name} | {tool} | {dt:.2f} | {nodes:,} | result does not run: {json.dumps(str(e)[:60])} | | |",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
