"""The ATC hand-off verbs of the command line (issue 27): ``atc`` (write a conversion kit for a
model), ``atc-check`` (read back what ATC did) and ``optimize --atc DIR``'s options; their
parsers (:func:`add_atc_verbs`, :func:`add_optimize_atc_args`, called by
:func:`graphpass.cli.build_parser`). The library side is :mod:`graphpass.atc`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from graphpass.errors import UsageError

__all__ = ["add_atc_verbs", "add_optimize_atc_args", "check_optimize_atc_args", "write_optimize_kit"]


def _cann_help() -> str:
    """--cann-version's help, made when help is shown (reading the releases is ~25 ms per run)."""
    from graphpass.cli import LazyHelp

    def make() -> str:
        from graphpass.cost_model import cann

        return (f"the CANN release whose ATC the kit is for ({', '.join(cann.releases())}; default the newest "
                f"documented, {cann.NEWEST})")

    return LazyHelp(make)


def add_optimize_atc_args(o: argparse.ArgumentParser) -> None:
    o.add_argument("--atc", default=None, metavar="DIR",
                   help="also write an ATC conversion kit (atc.sh, the files it names, README.md) for the result")
    o.add_argument("--cann-version", default=None, metavar="X.Y", help=_cann_help())
    o.add_argument("--shape-profile", action="append", default=[], metavar="PROFILE",
                   help="with --atc: one gear of a dynamic model (repeatable): DIM=V[,DIM=V] or NAME:D1,D2,...[;NAME:...]")


def check_optimize_atc_args(args: argparse.Namespace) -> None:
    """Usage errors of --atc's options, before the model is read."""
    if not args.atc:
        if args.cann_version or args.shape_profile:
            raise UsageError("--cann-version and --shape-profile go with --atc DIR")
        return
    from graphpass.atc.gears import parse_profile
    from graphpass.cost_model import cann
    from graphpass.outputs import check_output_folder

    cann.release(args.cann_version)
    _need_hardware(args.target, "--atc")
    for p in args.shape_profile:
        parse_profile(p)
    check_output_folder(Path(args.atc), "--atc", may_not_exist=True)


def _need_hardware(target, who: str) -> None:
    from graphpass.cost_model.target import Target

    if target is not None and not Target.resolve(target).has_hardware:
        raise UsageError(f"{who} needs a hardware target (ATC's --soc_version comes from it), not '{target}'")


def write_optimize_kit(args: argparse.Namespace, model, outputs) -> list[str]:
    """``optimize --atc DIR``: the kit for the optimized ``model``, staged with the run's outputs."""
    from graphpass.atc import write_kit
    from graphpass.passes.fusion_switch import fusion_passes

    disabled = set(",".join(args.disable or []).split(","))
    switches = {n: (n not in disabled) for n in fusion_passes()}
    staged = outputs.folder(args.atc)
    kit = write_kit(model, staged, target=args.target, cann=args.cann_version, profiles=args.shape_profile,
                    precision_mode=args.mixed_precision or args.precision_mode,
                    keep_fp32=getattr(args, "atc_keep_fp32", None) or [], switches=switches, seed=args.seed,
                    name=Path(args.output).stem, final_folder=args.atc, drop_missing_keep=True)
    return kit.summary()


def cmd_atc(args: argparse.Namespace) -> int:
    from graphpass.atc import write_kit
    from graphpass.cli import _apply_fusion_switches, _split_names, parse_input_shapes
    from graphpass.outputs import Outputs, check_output_folder
    from graphpass.passes.fusion_switch import fusion_passes

    check_atc = argparse.Namespace(atc=args.output, cann_version=args.cann_version, shape_profile=args.shape_profile,
                                   target=args.target)
    check_output_folder(Path(args.output), "-o", may_not_exist=True)
    check_optimize_atc_args(check_atc)
    args.enable = None
    _apply_fusion_switches(args)
    disabled = set(_split_names(args.disable))
    unknown = disabled - set(fusion_passes())
    if unknown:
        raise UsageError(f"--disable: {', '.join(sorted(unknown))} is not a fusion (known: {', '.join(fusion_passes())})")
    switches = {n: (n not in disabled) for n in fusion_passes()}
    shapes = parse_input_shapes(args.input_shape)
    import graphpass as gp

    model = gp.load(args.model, input_shapes=shapes or None)
    keep: list[str] = []
    if args.keep_fp32 == "auto":
        from graphpass.check import precision as P

        keep = P.analyze(gp.to_proto(model), seed=args.seed, input_shapes=shapes or None).keep_fp32
    elif args.keep_fp32:
        keep = _split_names([args.keep_fp32])
    with Outputs() as outputs:
        staged = outputs.folder(args.output)
        kit = write_kit(model, staged, target=args.target, cann=args.cann_version, profiles=args.shape_profile,
                        precision_mode=args.precision_mode, keep_fp32=keep, switches=switches, seed=args.seed,
                        name=Path(args.model).stem, final_folder=args.output)
        outputs.commit()
    if not args.quiet:
        print("\n".join(kit.summary()))
    return 0


def cmd_atc_check(args: argparse.Namespace) -> int:
    from graphpass.atc.readback import atc_check
    from graphpass.cli import parse_input_shapes

    _need_hardware(args.target, "atc-check")
    report = atc_check(args.model, args.fusion_result, ge_graph=args.ge_graph, kit=args.kit, target=args.target,
                       input_shapes=parse_input_shapes(args.input_shape) or None)
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.to_table(verbose=args.verbose), end="")
    return 1 if report.mismatches else 0


def add_atc_verbs(sub, common: argparse.ArgumentParser) -> None:
    from graphpass.cli import _seed_arg
    from graphpass.cost_model import DEFAULT_TARGET, KNOWN_TARGETS, NONE_TARGET, get_target

    modes = get_target(NONE_TARGET).precision_mode_names()
    a = sub.add_parser("atc", parents=[common], help="write an ATC conversion kit (atc.sh, its files, README.md) for a model")
    a.add_argument("model", help="the ONNX model to hand to ATC (e.g. graphpass optimize's output)")
    a.add_argument("-o", "--output", required=True, metavar="DIR", help="the kit's folder")
    a.add_argument("--target", default=DEFAULT_TARGET, help=f"hardware profile: ATC's --soc_version ({', '.join(KNOWN_TARGETS)})")
    a.add_argument("--cann-version", default=None, metavar="X.Y", help=_cann_help())
    a.add_argument("--shape-profile", action="append", default=[], metavar="PROFILE",
                   help="one gear of a dynamic model (repeatable): DIM=V[,DIM=V] or NAME:D1,D2,...[;NAME:...]")
    a.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...", help="fix an input's shape (repeatable)")
    a.add_argument("--precision-mode", default=None, choices=modes,
                   help="ATC precision mode (default: the profile's, ATC's force_fp16)")
    a.add_argument("--keep-fp32", default=None, metavar="NAMES|auto",
                   help="nodes ATC keeps in their dtype (--keep_dtype); 'auto': the ones graphpass precision recommends")
    a.add_argument("--disable", action="append", help="fusions to switch off in ATC (comma-separated)")
    a.add_argument("--fusion-off", action="store_true", help="switch every fusion off")
    a.add_argument("--fusion-switch", default=None, metavar="FILE", help="start from this fusion switch file")
    a.add_argument("--seed", type=_seed_arg, default=0, help="seed of the inputs that verify an opset conversion")
    a.set_defaults(func=cmd_atc)

    c = sub.add_parser("atc-check", parents=[common], help="compare what ATC did (fusion_result.json, GE dumps) with graphpass's plan")
    c.add_argument("model", help="the model handed to ATC")
    c.add_argument("--fusion-result", required=True, metavar="FILE", help="ATC's fusion_result.json")
    c.add_argument("--ge-graph", default=None, metavar="DIR|FILE",
                   help="GE's graph dumps (DUMP_GE_GRAPH=2): the folder of ge_proto*.txt, or one file")
    c.add_argument("--kit", default=None, metavar="DIR", help="the kit graphpass wrote (its switches, target and gears)")
    c.add_argument("--target", default=None, help=f"hardware profile (default: the kit's, else {DEFAULT_TARGET})")
    c.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...", help="the shapes ATC compiled for")
    c.add_argument("--format", default="table", choices=["table", "json"])
    c.set_defaults(func=cmd_atc_check)
