"""The cost model against published Ascend throughput (issue 21): estimated / published fps per row.

    python benchmarks/calibration.py [--target ascend310p3] [--models DIR] [--rows] [--markdown]

Rows: cost_model/data/calibration.toml (published 310P3 fp16 fps from the Ascend ModelZoo-PyTorch
READMEs, with source). Graphs: benchmarks/data/calibration/*.onnx.gz (weights stripped; rebuild
with benchmarks/calibration_models.py, which needs torch), or full exports in --models DIR.
Each row is estimated with the batch fixed and the row's precision mode (force_fp16, ATC's
default), on the shapes ATC proves when it compiles (graphpass.passes.shape_proof, as `graphpass
cost` does: the exporter's shape arithmetic folded, no dim left to assume). The ratio compares the NPU-only estimate with the published NPU-only figure; the
end-to-end estimate (with the step's launch, copies and sync) is printed beside it. Summaries per
kind (cnn judged, transformer reported), for the networks used in fitting and the ones kept out.
All estimated figures are cost-model estimates, not measurements.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from graphpass.cost_model.calibration import evaluate, excluded, fit, summary
from graphpass.passes.shape_proof import prove_shapes


def proven(graph):
    """The graph with the shapes ATC proves at compile time (what ``graphpass cost`` estimates)."""
    return prove_shapes(graph).graph


# the stripped graphs hold weight headers without bytes: fold_constants cannot evaluate a node that
# reads one (ViT's Expand of class_token) and says so; that node is priced as it is, which is right
logging.getLogger("graphpass.passes.cleanup.fold_constants").setLevel(logging.ERROR)


def _fmt(s: dict) -> str:
    if not s.get("rows"):
        return "no rows"
    return (f"{s['rows']} rows, {s['networks']} networks: median {s['median']:.2f}, IQR {s['q1']:.2f}-{s['q3']:.2f}, "
            f"range {s['min']:.2f}-{s['max']:.2f}, worst {s['worst']:.2f} ({s['worst_row']}), off by 2x+: {s['off_2x']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="ascend310p3")
    ap.add_argument("--models", type=Path, default=None, help="folder of full exports (NAME.onnx)")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--fit", action="store_true", help="fit cube_efficiency and kernel_launch_us on the networks not kept out")
    ap.add_argument("--markdown", action="store_true", help="rows and summary as Markdown (for the README)")
    ap.add_argument("--per-network", action="store_true", help="one Markdown line per network (the README's table)")
    args = ap.parse_args(argv)
    results = evaluate(args.target, models=args.models, prepare=proven)
    if args.fit:
        e, lu, score = fit(results)
        print(f"fit on the networks not kept out: cube_efficiency {e:.2f}, kernel_launch_us {lu:.1f} "
              f"(mean squared log ratio {score:.4f}); write them into cost_model/data/{args.target}.toml")
    if args.per_network:
        print("| network | kind | fit | batches | published fps | estimated fps (NPU-only) | ratio min-max |")
        print("|---|---|---|---|---|---|---|")
        nets = list(dict.fromkeys(r.row.network for r in results))
        for net in nets:
            rs = sorted((r for r in results if r.row.network == net), key=lambda r: r.row.batch)
            ratios = [r.ratio for r in rs if not r.row.excluded]
            out = [f"b{r.row.batch} excluded ({r.ratio:.2f})" for r in rs if r.row.excluded]
            print(f"| {net} | {rs[0].row.kind} | {'; '.join(['kept out' if rs[0].kept_out else 'fit', *out])} | "
                  f"{' / '.join(str(r.row.batch) for r in rs)} | {' / '.join(f'{r.row.fps:,.0f}' for r in rs)} | "
                  f"{' / '.join(f'{r.est_fps:,.0f}' for r in rs)} | {min(ratios):.2f}-{max(ratios):.2f} |")
    if args.rows or args.markdown:
        if args.markdown:
            print("| network | batch | published fps | estimated fps (NPU) | ratio | estimated fps (end-to-end) | fit |")
            print("|---|---:|---:|---:|---:|---:|---|")
        for r in results:
            used = ("excluded, " if r.row.excluded else "") + ("kept out" if r.kept_out else "fit")
            if args.markdown:
                print(f"| {r.row.network} | {r.row.batch} | {r.row.fps:,.0f} | {r.est_fps:,.0f} | {r.ratio:.2f} | "
                      f"{r.est_fps_e2e:,.0f} | {used} |")
            else:
                print(f"{r.row.network:20s} b{r.row.batch:<4d} published {r.row.fps:9.1f}  estimated {r.est_fps:9.1f} "
                      f"ratio {r.ratio:5.2f}  end-to-end {r.est_fps_e2e:9.1f}  {used}")
    print()
    for r in excluded(results):
        print(f"excluded from the summaries and the fit: {r.row.network} b{r.row.batch} published {r.row.fps:,.1f} "
              f"estimated {r.est_fps:,.1f} ratio {r.ratio:.2f}: {r.row.excluded}")
    for kind in ("cnn", "transformer"):
        rows = [r for r in results if r.row.kind == kind]
        label = "judged" if kind == "cnn" else "reported, not judged yet"
        print(f"{args.target} {kind} ({label}):")
        print(f"  all       {_fmt(summary(rows))}")
        print(f"  fitted on {_fmt(summary([r for r in rows if not r.kept_out]))}")
        print(f"  kept out  {_fmt(summary([r for r in rows if r.kept_out]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
