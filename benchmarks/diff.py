"""``graphpass diff`` on big graphs (issue: two 100k-node graphs in under 10 s).

    python benchmarks/diff.py                 # 10k and 100k-node residual stacks
    python benchmarks/diff.py --sizes 100000

The after-graph is the before-graph with every node name stripped and every Identity removed
(a rewrite at 1 of 15 nodes), so the diff has to match by structure and group thousands of
sites. Timed: reading both files, matching, grouping, the JSON rendering. Per-node cost
estimates are skipped above 20k nodes (as the CLI does). Prints a table.
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

from graphpass.diff import diff_models, to_json  # noqa: E402


def after_of(model: onnx.ModelProto) -> onnx.ModelProto:
    b = onnx.ModelProto()
    b.CopyFrom(model)
    bypass, keep = {}, []
    for n in b.graph.node:
        n.name = ""
        if n.op_type == "Identity":
            bypass[n.output[0]] = n.input[0]
        else:
            keep.append(n)
    for n in keep:
        for i, t in enumerate(n.input):
            n.input[i] = bypass.get(t, t)
    del b.graph.node[:]
    b.graph.node.extend(keep)
    return b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = ap.parse_args(argv)
    print("| graph | nodes before | nodes after | removed | rewrites | sites | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            a = residual_stack(size, channels=8)
            pa, pb = Path(tmp) / "a.onnx", Path(tmp) / "b.onnx"
            onnx.save(a, pa)
            onnx.save(after_of(a), pb)
            t0 = time.perf_counter()
            d = diff_models(pa, pb)
            to_json(d)
            dt = time.perf_counter() - t0
            print(f"| residual {size:,} | {len(d.before.nodes):,} | {len(d.after.nodes):,} | {len(d.removed):,} | "
                  f"{len(d.rewrites)} | {sum(len(r.sites) for r in d.rewrites):,} | {dt:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
