"""Models per minute of a model-zoo run: ``graphpass optimize FOLDER -o OUT`` over 50 models: the
onnx light models (9), the exporter corpus (tests/data/exporters, 27), 11 generated synthetic
CNNs and transformers (benchmarks/_synthetic.py, 100 to 2,000 nodes), and three bad ones: a
corrupt file, a Loop whose verification never ends (killed by --timeout) and a model over
--max-memory; with --jobs 1, --jobs 2 and (when the ``ray`` package is installed) --backend ray,
each from scratch (--force), one after another.

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
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.path.insert(0, str(REPO / "tests" / "zoo"))
    from _synthetic import residual_stack, transformer_stack

    (folder / "generated").mkdir()
    for size in (100, 200, 500, 1000, 2000, 300):
        onnx.save(residual_stack(size, channels=8, hw=8, weight_scale=0.01), folder / "generated" / f"cnn{size}.onnx")
        n += 1
    for size in (100, 200, 500, 1000, 2000):
        onnx.save(transformer_stack(size), folder / "generated" / f"transformer{size}.onnx")
        n += 1
    from test_zoo import _big, _hang  # the suite's bad models

    (folder / "bad").mkdir()
    (folder / "bad" / "corrupt.onnx").write_bytes(b"\x08\x07garbage, not a model")
    _hang(folder / "bad" / "hang.onnx")
    _big(folder / "bad" / "big.onnx", n=40_000_000)  # 160 MB: over the --max-memory below
    return n + 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="verify every model in onnxruntime")
    ap.add_argument("--timeout", type=float, default=60, help="per model (the never-ending one waits this long)")
    ap.add_argument("--max-memory", default="128M", help="per model (the big one is over it)")
    ap.add_argument("--runs", nargs="+", default=["jobs1", "jobs2", "ray"], choices=["jobs1", "jobs2", "ray"],
                    help="which runs (ray only where the package is installed)")
    args = ap.parse_args(argv)
    try:
        import ray  # noqa: F401
        have_ray = True
    except ImportError:
        have_ray = False
    runs = [("local, --jobs 1", ["--jobs", "1"])] if "jobs1" in args.runs else []
    if "jobs2" in args.runs:
        runs.append(("local, --jobs 2", ["--jobs", "2"]))
    if have_ray and "ray" in args.runs:
        runs.append(("ray (local cluster, 2 CPUs)", ["--jobs", "2", "--backend", "ray"]))
    print(f"cores: {os.cpu_count()}; ray: {'installed' if have_ray else 'not installed (pip install ray)'}")
    print("| run | models | ok | not ok | wall s | models per minute |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="graphpass-zoo-bench-") as tmp:
        models = Path(tmp) / "models"
        n = corpus(models)
        for label, extra in runs:
            out = Path(tmp) / f"out-{len(extra)}-{extra[-1]}"
            cmd = [sys.executable, "-m", "graphpass", "optimize", str(models), "-o", str(out), "--force", "-q",
                   "--timeout", str(args.timeout), "--max-memory", args.max_memory] + (["--verify"] if args.verify else []) + extra
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            sys.path.insert(0, str(REPO))
            from graphpass.zoo import summarize

            s = summarize(out)
            ok = s["status"].get("ok", 0)
            bad = ", ".join(f"{k} {v}" for k, v in s["status"].items() if k != "ok")
            print(f"| {label} | {s['models']} | {ok} ({s['verified']} verified) | {bad} | {wall:.1f} | "
                  f"{60 * s['models'] / wall:.1f} |", flush=True)
            if proc.returncode not in (0, 1, 2):
                print(f"  (exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
