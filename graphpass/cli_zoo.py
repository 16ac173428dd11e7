"""Model zoos on the command line: ``optimize``/``evaluate`` over many models (folders, globs) with
``--jobs``, ``--timeout``, ``--force``, ``--backend``, and the ``zoo-report`` verb. The work is in
:mod:`graphpass.zoo`."""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from pathlib import Path

from graphpass.errors import UsageError

__all__ = ["add_zoo_args", "add_zoo_verbs", "zoo_mode", "cmd_zoo"]

#: a model's status -> the exit code it weighs in the batch's (the worst one wins)
_EXIT = {"ok": 0, "verify-failed": 1, "bad-input": 2, "timeout": 2, "memory": 2, "crash": 3, "internal-error": 3}

#: optimize's options that a run over several models passes to each model (the rest are refused)
_PASSED = ("target", "pipeline", "passes", "disable", "enable", "input_shape", "dim", "max_memory", "precision_mode",
           "verify", "rtol", "atol", "seed", "emit", "layout", "fusion_off", "mixed_precision", "max_rounds")


def add_zoo_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several models (a folder, a glob, or more than one file; see 'Model zoos' in the README)")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="models run at once, each in its own worker process (default: the number of cores)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="a model's worker is killed after this long and recorded as 'timeout'")
    g.add_argument("--force", action="store_true",
                   help="rerun models already in the results (by default a model whose file and options are "
                        "unchanged is skipped: an interrupted batch resumes)")
    g.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="local worker processes (default), or Ray tasks (the optional 'ray' extra)")
    g.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="with --backend ray: join this cluster (default: start a local one)")


def zoo_mode(args: argparse.Namespace, inputs: list[str]) -> bool:
    """Whether this run is over several models: more than one input, a folder or a glob among
    them, or one of the several-model options given."""
    if len(inputs) > 1 or any(Path(s).is_dir() or (not Path(s).exists() and glob.has_magic(s)) for s in inputs):
        return True
    return (args.jobs is not None or args.timeout is not None or args.force or args.backend != "local"
            or args.ray_address is not None)


def _options(args: argparse.Namespace, verb: str) -> dict:
    from graphpass.cli import _split_names

    opts = {}
    for name in _PASSED:
        if not hasattr(args, name):
            continue
        v = getattr(args, name)
        if name in ("passes", "disable", "enable"):
            v = _split_names(v) or None
        opts[name] = v
    if verb == "optimize":
        defaults = {"layout": "optimal", "emit": "portable", "max_rounds": 4, "seed": 0}
        for k, d in defaults.items():
            if opts.get(k) == d:
                opts.pop(k)
        refused = [flag for flag, attr, default in (
            ("--report", "report", None), ("--dump-dir", "dump_dir", None), ("--explain", "explain", None),
            ("--keep-failed", "keep_failed", False), ("--verify-each", "verify_each", False),
            ("--profile", "profile", False), ("--fold-growing", "fold_growing", False),
            ("--fold-size-limit", "fold_size_limit", None), ("--keep-fp32", "keep_fp32", None),
            ("--fusion-switch", "fusion_switch", None), ("--freeze-initializers", "freeze_initializers", False),
            ("--iterations-per-loop", "iterations_per_loop", 1), ("--atc", "atc", None))
            if getattr(args, attr, default) != default]
        if refused:
            raise UsageError(f"{', '.join(refused)} cannot be used with several models (run the model alone)")
    return {k: v for k, v in opts.items() if v not in (None, False, [], "")}


def _progress(stream):
    last = [0.0]

    def show(state: dict) -> None:
        now = time.monotonic()
        if now - last[0] < 0.5 and state["done"] < state["total"]:
            return
        last[0] = now
        running = state["running"]
        slow = ""
        if running:
            name, t0 = min(running.items(), key=lambda kv: kv[1])
            slow = f" (slowest: {name}, {now - t0:.0f} s)"
        stream.write(f"\rgraphpass: {state['done']}/{state['total']} done, {state['failed']} failed, "
                     f"{len(running)} running{slow}\x1b[K")
        stream.flush()
    return show


def cmd_zoo(args: argparse.Namespace, verb: str, inputs: list[str], out_dir: str | None) -> int:
    """A run over several models; exit: the worst model's (0 all ok, 1 a verification failed, 2 a
    bad, hanging or too big model, 3 a crash or a graphpass bug)."""
    from graphpass import zoo

    if out_dir is None:
        raise UsageError(f"{verb} over several models needs -o OUTDIR (the folder of the results)")
    out = Path(out_dir)
    if out.suffix == ".onnx":
        raise UsageError(f"-o {out_dir}: with several models -o names a folder, not a model file")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    options = _options(args, verb)
    tty = sys.stderr.isatty() and not args.quiet
    worst = 0
    rows = []
    for r in zoo.run(inputs, out, verb=verb, options=options, jobs=args.jobs, timeout=args.timeout,
                     force=args.force, backend=args.backend, ray_address=args.ray_address,
                     on_progress=_progress(sys.stderr) if tty else None):
        rows.append(r)
        worst = max(worst, _EXIT.get(r["status"], 3))
        if not args.quiet and not tty and args.verbose:
            print(f"graphpass: {r['model']}: {r['status']}" + (" (unchanged: kept)" if r.get("skipped") else ""),
                  file=sys.stderr)
    if tty:
        sys.stderr.write("\n")
    if not args.quiet:
        from graphpass.zoo import report

        s, paths = report.write_reports(out)
        print(report.to_text(s), end="")
        skipped = sum(1 for r in rows if r.get("skipped"))
        print(f"results: {out / zoo.DB_NAME}; report: {', '.join(str(p) for p in paths)}"
              + (f"; {skipped} unchanged model(s) kept from an earlier run (--force reruns them)" if skipped else ""))
    return worst


def cmd_zoo_report(args: argparse.Namespace) -> int:
    from graphpass.zoo import report

    s, paths = report.write_reports(args.folder, args.output)
    if not args.quiet:
        if args.format == "json":
            sys.stdout.write(Path(paths[1]).read_text("utf-8"))
        elif args.format == "md":
            sys.stdout.write(report.to_markdown(s))
        else:
            sys.stdout.write(report.to_text(s))
            print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


def add_zoo_verbs(sub, common) -> None:
    r = sub.add_parser("zoo-report", parents=[common],
                       help="summarize a run over several models: totals, failures by error, gain per model")
    r.add_argument("folder", metavar="OUTDIR", help="the -o folder of 'graphpass optimize/evaluate' over several models")
    r.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="where zoo-report.md/.json/.html go (default: OUTDIR)")
    r.add_argument("--format", default="text", choices=["text", "md", "json"], help="what is printed")
    r.set_defaults(func=cmd_zoo_report)
