"""Models per minute of a model-zoo run: ``graphpass optimize FOLDER -o OUT`` over the onnx light
models and the exporter corpus (tests/data/exporters), with --jobs 1, --jobs 2 and (when the
``ray`` package is installed) --backend ray, each from scratch (--force), one after another.

    python benchmarks/zoo.py                 # prints a Markdown table
    python benchmarks/zoo.py --verify        # with --verify on every model

The time is the batch's wall time (the driver's whole process: workers' interpreter starts
included); every model runs in its own worker process (graphpass.zoo)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parents[1]


def corpus(folder: Path) -> int:
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    (folder / "light").mkdir(parents=True)
    (folder / "exporters").mkdir()
    n = 0
    for f in sorted(light.glob("*.onnx")):
        shutil.copy(f, folder / "light" / f.name)
        n += 1
    for f in sorted((REPO / "tests" / "data" / "exporters").iterdir()):
        if f.suffix in (".onnx", ".data"):
            shutil.copy(f, folder / "exporters" / f.name)
            n += f.suffix == ".onnx"
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="verify every model in onnxruntime")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    try:
        import ray  # noqa: F401
        have_ray = True
    except ImportError:
        have_ray = False
    runs = [("local, --jobs 1", ["--jobs", "1"]), ("local, --jobs 2", ["--jobs", "2"])]
    if have_ray:
        runs.append(("ray (local cluster, 2 CPUs)", ["--jobs", "2", "--backend", "ray"]))
    print(f"cores: {os.cpu_count()}; ray: {'installed' if have_ray else 'not installed (pip install ray)'}")
    print("| run | models | ok | failed | wall s | models per minute |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="graphpass-zoo-bench-") as tmp:
        models = Path(tmp) / "models"
        n = corpus(models)
        for label, extra in runs:
            out = Path(tmp) / f"out-{len(extra)}-{extra[-1]}"
            cmd = [sys.executable, "-m", "graphpass", "optimize", str(models), "-o", str(out), "--force", "-q",
                   "--timeout", str(args.timeout)] + (["--verify"] if args.verify else []) + extra
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            sys.path.insert(0, str(REPO))
            from graphpass.zoo import summarize

            s = summarize(out)
            ok = s["status"].get("ok", 0)
            print(f"| {label} | {n} | {ok} | {s['models'] - ok} | {wall:.1f} | {60 * n / wall:.1f} |", flush=True)
            if proc.returncode not in (0, 1, 2):
                print(f"  (exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
