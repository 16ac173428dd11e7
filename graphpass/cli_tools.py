"""The model-surgery verbs: ``evaluate`` (which rewrites would fire, writing nothing) and
``extract`` (the subgraph between named tensors). Parsers and handlers; the work is in
graphpass/evaluate.py and graphpass/extract.py."""

from __future__ import annotations

import argparse
import json
import sys

from graphpass.cli import _split_names, parse_dims, parse_input_shapes, parse_size

__all__ = ["add_tool_verbs"]


def _fmt_us(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _table(results: list[dict]) -> str:
    lines = []
    for r in results:
        if r["status"] != "ok":
            lines.append(f"{r['model']}: {r['status']}: {r['error']}")
            continue
        gain = "" if r["gain_pct"] is None else f" ({-r['gain_pct']:+.1f}%)"
        lines.append(f"{r['model']}: nodes {r['nodes_before']} -> {r['nodes_after']}, estimated "
                     f"{_fmt_us(r['cost_before_us'])} -> {_fmt_us(r['cost_after_us'])} us{gain} on {r['target']}")
        for w in r["rewrites"]:
            stats = ", ".join(f"{k}={v}" for k, v in w["stats"].items())
            delta = "" if w["cost_delta_us"] is None else f", {w['cost_delta_us']:+,.1f} us"
            lines.append(f"  {w['pass']:<34} x{w['applications']}  {-w['nodes_removed']:+d} nodes{delta}"
                         + (f"  ({stats})" if stats else ""))
        for w in r["rolled_back"]:
            lines.append(f"  {w['pass']:<34} would not fire: {w['why']}")
        if not r["rewrites"] and not r["rolled_back"]:
            lines.append("  no rewrite fires")
    ok = sum(r["status"] == "ok" for r in results)
    lines.append(f"{len(results)} model(s): {ok} evaluated, {len(results) - ok} failed; nothing written")
    return "\n".join(lines) + "\n"


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Exit 0 when every model was evaluated; else the worst exit a single model's optimize would
    have had (2: a bad model or input, 3: a graphpass bug), after the whole table."""
    from graphpass.cli_zoo import cmd_zoo, zoo_mode
    from graphpass.evaluate import evaluate

    if args.output is not None or zoo_mode(args, []):  # workers, stored results
        return cmd_zoo(args, "evaluate", list(args.models), args.output)
    options = {"target": args.target, "pipeline": args.pipeline, "passes": _split_names(args.passes) or None,
               "disable": _split_names(args.disable), "enable": _split_names(args.enable),
               "input_shapes": parse_input_shapes(args.input_shape) or None, "dims": parse_dims(args.dim) or None,
               "max_memory": args.max_memory}
    results = []
    for r in evaluate(args.models, **options):
        results.append(r)
        if not args.quiet and args.format == "table" and args.verbose:
            print(f"graphpass: evaluated {r['model']} ({r['status']})", file=sys.stderr)
    if not args.quiet:
        if args.format == "json":
            sys.stdout.write(json.dumps(results, indent=2, default=str) + "\n")
        else:
            sys.stdout.write(_table(results))
    return max((r["exit_code"] for r in results), default=0)


def cmd_extract(args: argparse.Namespace) -> int:
    from graphpass.extract import extract_file
    from graphpass.ir.files import check_output_path

    check_output_path(args.output)
    m = extract_file(args.model, args.output, args.input_names, args.output_names, max_memory=args.max_memory)
    if not args.quiet:
        for note in m.meta.get("extract_notes", []):
            print(f"graphpass: note: {note}", file=sys.stderr)
        print(f"wrote {args.output}: {len(m.graph.nodes)} nodes, inputs {args.input_names}, outputs {args.output_names}")
    return 0


def cmd_concat(args: argparse.Namespace) -> int:
    from graphpass.concat import concat_files
    from graphpass.ir.files import check_output_path

    check_output_path(args.output)
    m = concat_files(args.first, args.second, args.output, args.io_map, prefix=args.prefix,
                     keep_outputs=args.keep_outputs, max_memory=args.max_memory)
    if not args.quiet:
        for note in m.meta.get("concat_notes", []):
            print(f"graphpass: note: {note}", file=sys.stderr)
        g = m.graph
        print(f"wrote {args.output}: {len(g.nodes)} nodes, inputs {','.join(t.name for t in g.inputs)}, "
              f"outputs {','.join(t.name for t in g.outputs)}")
    return 0


def add_tool_verbs(sub, common, default_target: str) -> None:
    e = sub.add_parser("evaluate", parents=[common],
                       help="which rewrites would fire on each model and the estimated gain; writes nothing")
    e.add_argument("models", nargs="+", metavar="MODEL|DIR|GLOB",
                   help="model files, folders (every .onnx inside, recursively) or glob patterns")
    e.add_argument("--target", default=default_target, help="hardware profile of the cost model ('none': no estimates)")
    e.add_argument("--pipeline", default=None, help="named pipeline (default: 'default')")
    e.add_argument("--passes", action="append", help="run exactly these passes (comma-separated)")
    e.add_argument("--disable", action="append", help="passes not to run (comma-separated)")
    e.add_argument("--enable", action="append", help="default-off passes to run (comma-separated)")
    e.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...", help="fix an input's shape (repeatable)")
    e.add_argument("--dim", action="append", metavar="NAME=VALUE", help="fix a symbolic dim by name (repeatable)")
    e.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE", help="memory budget per model")
    e.add_argument("--format", default="table", choices=["table", "json"])
    e.add_argument("-o", "--output", default=None, metavar="OUTDIR",
                   help="run each model in its own worker and keep the results (SQLite, report) in this folder")
    from graphpass.cli_zoo import add_zoo_args

    add_zoo_args(e)
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("extract", parents=[common], help="write the subgraph between named tensors as a runnable model")
    x.add_argument("model", help="the ONNX model to cut")
    x.add_argument("--input-names", required=True, metavar="A,B", help="tensors that become the subgraph's inputs")
    x.add_argument("--output-names", required=True, metavar="C,D", help="tensors that become its outputs")
    x.add_argument("-o", "--output", required=True, help="where to write the subgraph (external data as the model had it)")
    x.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE", help="memory budget of the run")
    x.set_defaults(func=cmd_extract)

    c = sub.add_parser("concat", parents=[common],
                       help="join two models: outputs of the first feed inputs of the second (--io-map OUT:IN,...)")
    c.add_argument("first", help="the model that runs first")
    c.add_argument("second", help="the model whose inputs the first's outputs feed")
    c.add_argument("--io-map", required=True, metavar="OUT:IN,...",
                   help="pairs of (output of the first, input of the second) to connect")
    c.add_argument("-o", "--output", required=True, help="where to write the joined model (external data where either had it)")
    c.add_argument("--prefix", default="b/", help="prefix for names of the second model that the first uses too (default b/)")
    c.add_argument("--keep-outputs", action="store_true", help="keep the first's connected outputs as outputs too")
    c.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE", help="memory budget of the run")
    c.set_defaults(func=cmd_concat)
