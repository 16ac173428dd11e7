"""Property-based fuzzing at scale: random models through the default pipeline.

    python benchmarks/fuzz.py                      # 10,000 examples in chunks of 1,000
    python benchmarks/fuzz.py --examples 2000 --out fuzz_failures

Each chunk is one hypothesis run with its own seed; a failing chunk stops at its first failure,
which hypothesis shrinks to a minimal model: that model is saved as ``<out>/failure_<seed>.onnx``
with the reason printed. The property and the generator are in graphpass/fuzzing.py.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import onnx
from hypothesis import HealthCheck, assume, given, seed, settings

from graphpass.fuzzing import check, models


def run_chunk(n: int, chunk_seed: int) -> tuple[int, onnx.ModelProto | None, str]:
    seen = [0]
    last: list = [None, ""]

    @seed(chunk_seed)
    @settings(max_examples=n, deadline=None, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(models())
    def prop(model):
        try:
            ok = check(model)
        except Exception as e:  # the last call is the shrunk example
            last[0], last[1] = model, f"{type(e).__name__}: {e}"
            raise
        assume(ok)  # an input onnxruntime itself cannot run is not counted
        seen[0] += 1

    try:
        prop()
    except Exception:  # noqa: BLE001
        return seen[0], last[0], last[1]
    return seen[0], None, ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--chunk", type=int, default=1_000)
    ap.add_argument("--out", default="fuzz_failures", help="folder for minimized reproducers")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    total, failures = 0, []
    chunks = max(1, (args.examples + args.chunk - 1) // args.chunk)
    for k in range(chunks):
        n = min(args.chunk, args.examples - k * args.chunk)
        ran, bad, why = run_chunk(n, 1000 + k)
        total += ran
        if bad is not None:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"failure_{1000 + k}.onnx"
            onnx.save(bad, path)
            failures.append((path, why))
            print(f"chunk {k}: FAILED after shrinking: {why.splitlines()[0]}\n  reproducer: {path}", flush=True)
        else:
            print(f"chunk {k}: {ran} examples, no failure", flush=True)
    dt = time.perf_counter() - t0
    print()
    print("| examples run | chunks | failing chunks | seconds |")
    print("|---:|---:|---:|---:|")
    print(f"| {total:,} | {chunks} | {len(failures)} | {dt:.0f} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
