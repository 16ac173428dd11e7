"""How long one cost-model estimate takes on 1k/10k/100k-node graphs (issue 3: < 2 s at 100k),
and the estimate of each graph on every target at ATC's default precision (issue 21: the 910B2
must come out faster than the 910A on every one).

    python benchmarks/cost_model.py [--sizes 1000 10000 100000] [--target ascend910a]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import residual_stack, wide_fanout  # noqa: E402

import graphpass as gp  # noqa: E402
from graphpass.cost_model import KNOWN_TARGETS, create  # noqa: E402
from graphpass.ir.graph import count_nodes  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--target", default="ascend910a")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    cm = create(args.target)
    t = Table(title=f"cost-model estimate time ({args.target}; best of 3)")
    others = [k for k in KNOWN_TARGETS if k != args.target]
    for col in ("graph", "nodes", "estimate s", "us/node", "estimated total us", *(f"{k} us" for k in others)):
        t.add_column(col, justify="left" if col == "graph" else "right")
    for kind, build in (("residual", lambda n: residual_stack(n, channels=16)), ("fanout", wide_fanout)):
        for n in args.sizes:
            graph = gp.load(build(n)).graph
            best, report = float("inf"), None
            for _ in range(3):
                t0 = time.perf_counter()
                report = cm.estimate(graph)
                best = min(best, time.perf_counter() - t0)
            nodes = count_nodes(graph)
            rest = [f"{create(k).estimate(graph).total_us:,.0f}" for k in others]
            t.add_row(f"{kind} {n // 1000}k", str(nodes), f"{best:.3f}", f"{1e6 * best / nodes:.1f}", f"{report.total_us:,.0f}", *rest)
    Console(width=120).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
