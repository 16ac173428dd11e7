"""``graphpass verify --all-tensors`` on models with 1,000+ intermediate tensors (issue 8: < 30 s),
checked on the answers a reviewer relies on (issue 16: it used to compare a model with itself).

For each size: the original against its optimized version (default pipeline, portable output:
must pass with no divergent tensor) and against a deliberately broken copy of that optimized
version (one weight of the middle block changed: must fail, and name a tensor of that block as
the first divergence). Exit 1 when any answer is wrong.

    python benchmarks/verify.py [--sizes 1000 5000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import residual_stack  # noqa: E402

import graphpass as gp  # noqa: E402
from graphpass.check import verify as V  # noqa: E402


def _optimized(model: onnx.ModelProto) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "o.onnx")
        gp.save(gp.optimize(model, target="none").graph, path)
        return onnx.load(path)


def _broken(optimized: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """A copy with one weight of the middle Conv changed; returns it and that Conv's block (``b10``)."""
    m = onnx.ModelProto()
    m.CopyFrom(optimized)
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    conv = convs[len(convs) // 2]
    w = next(t for t in m.graph.initializer if t.name == conv.input[1])
    arr = onnx.numpy_helper.to_array(w).copy()
    arr[0] += 0.5  # every weight of output channel 0 (one weight alone may only read a channel Relu zeroed)
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    return m, conv.name.split(".")[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    t = Table(title="verify --all-tensors: original against optimized / broken (seconds)")
    for col in ("nodes", "pair", "tensors compared", "differ", "first divergence", "seconds", "verdict", "as expected"):
        t.add_column(col, justify="right" if col in ("nodes", "tensors compared", "differ", "seconds") else "left")
    wrong = 0
    for n in args.sizes:
        model = residual_stack(n, channels=16, weight_scale=0.01)  # small weights: a deep stack stays finite
        optimized = _optimized(model)
        broken, broken_at = _broken(optimized)
        for label, other, expect_ok in (("optimized", optimized, True), ("broken", broken, False)):
            t0 = time.perf_counter()
            report = V.verify_models(model, other, all_tensors=True)
            seconds = time.perf_counter() - t0
            bad = sum(not c.ok for c in report.tensors)
            if expect_ok:
                right = report.ok and report.first_divergence is None
            else:
                right = not report.ok and (report.first_divergence or "").split(".")[0] == broken_at
            wrong += not right
            t.add_row(str(len(model.graph.node)), label, str(len(report.tensors)), str(bad),
                      report.first_divergence or "none", f"{seconds:.2f}", "ok" if report.ok else "FAIL",
                      "yes" if right else "NO")
    Console(width=140).print(t)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
