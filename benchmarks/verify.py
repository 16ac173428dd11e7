"""Time of ``graphpass verify --all-tensors`` on models with 1,000+ intermediate tensors (issue 8: < 30 s).

    python benchmarks/verify.py [--sizes 1000 5000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import residual_stack  # noqa: E402

from graphpass import verify as V  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    t = Table(title="verify --all-tensors (seconds)")
    for col in ("nodes", "tensors compared", "seconds", "ok"):
        t.add_column(col, justify="right")
    for n in args.sizes:
        model = residual_stack(n, channels=16)
        t0 = time.perf_counter()
        report = V.verify_models(model, model, all_tensors=True)
        t.add_row(str(len(model.graph.node)), str(len(report.tensors)), f"{time.perf_counter() - t0:.2f}", str(report.ok))
    Console(width=100).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
