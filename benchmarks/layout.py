"""Layout propagation + TransData elimination at scale (issue: 100k nodes in under 10 s).

    python benchmarks/layout.py                  # 10k and 100k-node residual stacks
    python benchmarks/layout.py --sizes 1000 10000

The graph is the residual stack of benchmarks/_synthetic.py (Conv/BN fixed in NC1HWC0, Relu,
Add, Mul, Sigmoid, Max format-agnostic, Transpose pairs as ND islands). Timed: building the
plan (cost-model oracle for every node), the min-cut, inserting TransData, and the elimination
pass (with the GC frozen, as the pass manager runs passes); not timed: loading. Prints a table; times are wall-clock seconds on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic import residual_stack  # noqa: E402

import graphpass as gp  # noqa: E402
from graphpass.cost_model import create  # noqa: E402
from graphpass.passes.framework.context import PassContext  # noqa: E402
from graphpass.ir.model_io import gc_frozen  # noqa: E402
from graphpass.passes import eliminate_transdata, propagate_layout  # noqa: E402


def run(size: int, mode: str) -> dict:
    graph = gp.load(residual_stack(size))
    ctx = PassContext(cost_model=create("ascend910a"), check_contract=False)
    ctx.options = {"propagate_layout": {"mode": mode}}
    nodes = len(graph.nodes)
    with gc_frozen():  # as the pass manager runs passes
        t0 = time.perf_counter()
        res = propagate_layout(graph, ctx)
        t1 = time.perf_counter()
        elim = eliminate_transdata(graph, ctx)
        t2 = time.perf_counter()
    return {"size": size, "mode": mode, "nodes": nodes, "choice": res.stats.get("choice_nodes", 0),
            "td": res.stats.get("transdata", 0), "td_us": res.stats.get("transdata_us", 0.0),
            "elim": sum(v for v in elim.stats.values() if isinstance(v, int)), "propagate_s": t1 - t0, "eliminate_s": t2 - t1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--modes", nargs="+", default=["optimal"], choices=["optimal", "greedy"])
    args = ap.parse_args(argv)
    print("| graph | mode | nodes | choice nodes | TransData | TransData est. us | eliminated | propagate s | eliminate s | total s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        for mode in args.modes:
            r = run(size, mode)
            print(f"| residual {size:,} | {mode} | {r['nodes']:,} | {r['choice']:,} | {r['td']:,} | {r['td_us']:,.1f} | "
                  f"{r['elim']} | {r['propagate_s']:.2f} | {r['eliminate_s']:.2f} | {r['propagate_s'] + r['eliminate_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
