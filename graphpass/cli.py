"""The ``graphpass`` command line: a thin layer over the Python API.

Exit codes: 0 success, 1 verification failed, 2 bad input or usage, 3 internal error (a bug:
the message names the failing pass; rerun with -v for the traceback).
"""

from __future__ import annotations

import argparse
import collections
import logging
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Sequence

from graphpass import reporting
from graphpass.errors import GraphpassError, UsageError, VerificationError
from graphpass.ir import limits

__all__ = ["main", "run"]

log = logging.getLogger("graphpass")

#: what a verb prints by default, at most (-v and -vv print more; the report files hold everything)
SUMMARY_LINES = 20
REPORT_LINES = 40


# ------------------------------------------------------------------------------------------
# argument helpers


#: between dims: a comma, or an x between two dims (1x3x224x224); an x inside a name stays
_DIM_SEP = re.compile(r",|(?<=[0-9?])x(?=[0-9?-])")
#: a dim given by name (``batch``, ``p2o.DynamicDimension.0``) keeps it symbolic
_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def parse_input_shapes(values: Sequence[str] | None) -> dict[str, list[int]]:
    """``["x:1,3,640,640", "y:4"]`` -> ``{"x": [1, 3, 640, 640], "y": [4]}``; ``-1``, ``?`` or a
    name (``x:batch,3,640,640``) keeps a dim symbolic (-1)."""
    shapes: dict[str, list[int]] = {}
    for item in values or []:
        for spec in item.split():
            name, sep, dims = spec.rpartition(":")
            if not sep or not name:
                raise UsageError(f"--input-shape '{spec}': expected NAME:D1,D2,... (e.g. x:1,3,224,224)")
            if name in shapes:  # --dim refuses a name given twice: so does --input-shape
                raise UsageError(f"--input-shape '{spec}': input '{name}' is given twice")
            parts = _DIM_SEP.split(dims) if dims.strip() else []
            if any(not d.strip() for d in parts):
                raise UsageError(f"--input-shape '{spec}': an empty dimension (expected NAME:D1,D2,... or "
                                 "NAME:D1xD2x..., integers; -1, ? or a name keep a dim symbolic)")
            shapes[name] = []
            for d in parts:
                d = d.strip()
                if d.lower() == "x":  # 'a:3,x' is a slip of 1x3 more likely than a dim named x
                    raise UsageError(f"--input-shape '{spec}': an empty dimension around 'x' (x separates dims as in "
                                     "1x3x224x224; -1, ? or a longer name keep a dim symbolic)")
                if d == "?" or _DIM_NAME.match(d):  # keep the dim symbolic, as -1 does
                    shapes[name].append(-1)
                    continue
                try:
                    shapes[name].append(int(d))
                except ValueError:
                    raise UsageError(f"--input-shape '{spec}': '{d}' is no dimension (an integer >= 1; -1, ? or a "
                                     "name keep a dim symbolic)") from None
            for k, d in enumerate(shapes[name]):
                if d > limits.MAX_DIM:
                    raise UsageError(f"--input-shape '{spec}': dimension {k} is {d}, above the limit of 2^31 "
                                     f"({limits.MAX_DIM}) graphpass accepts")
    return shapes


def parse_dims(values: Sequence[str] | None) -> dict[str, int]:
    """``["batch=1", "seq=128"]`` -> ``{"batch": 1, "seq": 128}`` (``--dim``, repeatable)."""
    dims: dict[str, int] = {}
    for item in values or []:
        for spec in item.split():
            name, sep, value = spec.rpartition("=")
            if not sep or not name:
                raise UsageError(f"--dim '{spec}': expected NAME=VALUE (e.g. batch=1)")
            try:
                v = int(value)
            except ValueError:
                raise UsageError(f"--dim '{spec}': the value must be an integer") from None
            if name in dims and dims[name] != v:
                raise UsageError(f"--dim '{name}' given twice: {dims[name]} and {v}")
            dims[name] = v
    return dims


def parse_size(text: str) -> int:
    """``"512M"`` -> 536870912; plain bytes or K/M/G/T (powers of 1024), as ``graphpass.ir.limits`` reads them."""
    from graphpass.ir.limits import parse_bytes

    try:
        return parse_bytes(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_input_bytes(model, shapes: dict[str, list[int]], limit: int, what: str) -> None:
    """Refuse generated inputs whose byte size exceeds ``limit`` before any is allocated
    (symbolic dims count as verify feeds them)."""
    from onnx import helper

    from graphpass.check.verify import SYMBOLIC_DIM

    inits = {t.name for t in model.graph.initializer}
    total = 0
    for inp in model.graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        given = shapes.get(inp.name)
        declared = [d.dim_value if d.HasField("dim_value") else SYMBOLIC_DIM for d in inp.type.tensor_type.shape.dim]
        dims = declared if given is None else [
            int(g) if int(g) >= 0 else (declared[k] if k < len(declared) else SYMBOLIC_DIM) for k, g in enumerate(given)]
        n = 1
        for d in dims:
            n *= max(int(d), 0)
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 8
        size = n * itemsize
        total += size
        if total > limit:
            raise UsageError(f"{what}: input '{inp.name}' of shape {dims} needs {size:,} bytes, above --max-memory "
                             f"({limit:,} bytes)")


def _number_arg(kind: type, ok, what: str):
    """An argparse ``type`` that parses ``kind`` (int or float) and refuses what ``ok`` rejects,
    saying ``what`` the value must be (one line, exit 2)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {'an integer' if kind is int else 'a number'}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{text}: {what}")
        return v

    return parse


#: --rtol/--atol: NaN or inf would pass every difference, a negative one none
_tolerance_arg = _number_arg(float, lambda v: math.isfinite(v) and v >= 0, "a tolerance is a finite number >= 0")
_seed_arg = _number_arg(int, lambda v: v >= 0, "a seed is an integer >= 0")
_bytes_arg = _number_arg(int, lambda v: v >= 0, "a size in bytes is an integer >= 0")
_cosine_arg = _number_arg(float, lambda v: -1.0 <= v <= 1.0, "a cosine similarity is between -1 and 1")  # NaN fails
_rounds_arg = _number_arg(int, lambda v: v >= 1, "the number of rounds is an integer >= 1")
_per_loop_arg = _number_arg(int, lambda v: v >= 1, "iterations per loop is an integer >= 1")
#: a Loop whose trip count is not a constant is costed as running this often (0 would hide its body)
_trips_arg = _number_arg(int, lambda v: v >= 1, "a trip count is an integer >= 1")
_top_arg = _number_arg(int, lambda v: v >= 1, "the number of rows is an integer >= 1")
_dim_value_arg = _number_arg(int, lambda v: 1 <= v <= limits.MAX_DIM, f"a dim value is an integer >= 1 and <= {limits.MAX_DIM}")
_share_arg = _number_arg(float, lambda v: 0.0 <= v < 1.0, "a share is between 0 and 1 (0 <= share < 1)")  # NaN fails


def _split_names(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(n.strip() for n in v.split(",") if n.strip())
    return out


def _check_pass_list(args: argparse.Namespace) -> None:
    """``--passes ''`` (or ``,``) names no pass: refused, never read as "the default pipeline"."""
    if getattr(args, "passes", None) is not None and not _split_names(args.passes):
        raise UsageError("--passes names no pass; give pass names (comma-separated), or leave --passes out "
                         "for the default pipeline")


def _write_text_atomic(path: Path, text: str) -> None:
    """Kept for old callers: :func:`graphpass.outputs.write_text_atomic`."""
    from graphpass.outputs import write_text_atomic

    write_text_atomic(path, text)


#: API argument -> the CLI flag that sets it, for errors that name one (``GraphpassError.option``).
_FLAGS = {
    "input_shapes": "--input-shape",
    "dims": "--dim",
    "max_memory": "--max-memory",
    "feeds": "--inputs FILE.npz",
    "emit": "--emit",
    "target": "--target",
    "loop_trips": "--loop-trips",
    "symbolic_dim": "--symbolic-dim",
    "profiles": "--shape-profile",
    "cann": "--cann-version",
    "input_names": "--input-names",
    "io_map": "--io-map",
    "prefix": "--prefix",
}


def error_text(e: BaseException) -> str:
    """The one line the CLI prints for ``e``: its message, with the API argument it (or an error
    it wraps) names as the fix replaced by the flag that sets it (``GraphpassError.option``)."""
    import re

    text, seen, x = str(e), set(), e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        option = getattr(x, "option", None)
        if option in _FLAGS:
            text = re.sub(rf"(?<![\w-]){re.escape(option)}(?![\w])", _FLAGS[option], text)
        x = x.__cause__ or x.__context__
    return text


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format="graphpass: %(levelname)s: %(message)s", stream=sys.stderr)
    _WARNINGS.reset(enabled=not verbose)
    for h in logging.getLogger().handlers:  # the stderr handler basicConfig made (not a test's capture)
        if type(h) is logging.StreamHandler and h.stream is sys.stderr and _WARNINGS not in h.filters:
            h.addFilter(_WARNINGS)


class _OncePerKind(logging.Filter):
    """Without -v, a warning shows once per kind (:func:`graphpass.reporting.message_kind`: the
    same words about another node or tensor); :meth:`summary` counts the ones held back."""

    def __init__(self):
        super().__init__()
        self.enabled, self.seen = True, {}

    def reset(self, enabled: bool) -> None:
        self.enabled, self.seen = enabled, {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.enabled or record.levelno != logging.WARNING:
            return True
        entry = self.seen.setdefault((record.name, reporting.message_kind(record.getMessage())), [0, record.getMessage()])
        entry[0] += 1
        return entry[0] == 1

    def summary(self) -> list[str]:
        return [f"graphpass: WARNING: {n - 1} more like '{reporting.clip(first, 100)}' (-v shows each)"
                for n, first in self.seen.values() if n > 1]


_WARNINGS = _OncePerKind()


#: a progress display appears only once a run has taken this long (seconds)
PROGRESS_DELAY = 1.0
#: verbs without a progress hook of their own: a spinner with the elapsed time
_SPINNER_VERBS = frozenset({"cost", "calibrate", "bisect", "precision", "diff", "verify"})


def _progress_wanted(args: argparse.Namespace) -> bool:
    """Progress goes to stderr, and only to a terminal: never with -q, in CI (the ``CI``
    variable every CI service sets) or on a dumb terminal."""
    if getattr(args, "quiet", False) or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Progress:
    """The one progress display of every verb (rich, on stderr, transient): a spinner with the
    elapsed time and what is running, shown only when the run lasts over PROGRESS_DELAY
    seconds. ``with _Progress(args, "bisecting") as p: ... p.update("round 2: fold_constants")``."""

    def __init__(self, args: argparse.Namespace, what: str):
        self.enabled = _progress_wanted(args)
        self.what = what
        self._progress = self._task = self._timer = self._stdout = None
        self._lock = __import__("threading").Lock()

    def __enter__(self) -> "_Progress":
        if self.enabled:
            import threading

            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(file=sys.stderr), transient=True, redirect_stdout=False,
                                      redirect_stderr=False)
            self._task = self._progress.add_task(self.what, total=None)
            self._timer = threading.Timer(PROGRESS_DELAY, self._start)
            self._timer.daemon = True
            self._timer.start()
            # the display ends before the verb's first line of output: on a terminal that shows
            # both streams, a live line and the report would overwrite each other
            self._stdout = sys.stdout
            sys.stdout = _StopOnWrite(sys.stdout, self.stop)
        return self

    def _start(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._progress.start()

    def update(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=f"{self.what}: {description}")

    def on_pass(self, name: str, rnd: int, k: int, total: int) -> None:
        """The pass manager's progress hook (``optimize(on_pass=...)``)."""
        self.update(f"round {rnd}: {name} ({k + 1}/{total})")

    def stop(self) -> None:
        """End the display (erased: it is transient); it does not come back."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self._progress.stop()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._stdout is not None:
            sys.stdout, self._stdout = self._stdout, None


class _StopOnWrite:
    """``stream``, calling ``stop`` before the first write (a progress display ends there)."""

    def __init__(self, stream, stop):
        self._stream, self._stop = stream, stop

    def write(self, text: str) -> int:
        self._stop()
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


# ------------------------------------------------------------------------------------------
# verbs


def _blame_fixed_shapes(model_path: str, shapes, seed: int) -> None:
    """Raise BadModelError when the input model itself cannot run in onnxruntime with its inputs of
    the ``shapes`` the run fixed (a sequence longer than its position table, say): then the fixed
    shapes, not graphpass, made the written model inconsistent. Returns when there is nothing to blame."""
    if not shapes:
        return
    from graphpass.check import verify as V
    from graphpass.errors import BadModelError
    from graphpass.ir import model_io

    try:
        original = model_io.load_proto(model_path)
        feeds, _ = V.make_inputs(original, seed=seed, input_shapes=shapes)
        V.run(V.session(original), feeds)
    except BadModelError as e:
        given = ", ".join(f"{k}: {list(v)}" for k, v in shapes.items())
        raise BadModelError(f"{model_path} does not run with its inputs fixed to {given} ({e}): fix the shapes "
                               f"to ones the model takes") from None
    except Exception:  # noqa: BLE001 - a diagnosis only: the original error stands
        return


def cmd_optimize(args: argparse.Namespace) -> int:
    """Optimize; the model, its external data, the report and the dumps are staged in
    temporaries (graphpass.outputs) and moved into place only after --verify passed."""
    from graphpass.ir import profiling
    from graphpass.cli_zoo import cmd_zoo, zoo_mode

    inputs = list(args.model)
    if zoo_mode(args, inputs):
        return cmd_zoo(args, "optimize", inputs, args.output)
    args.model = inputs[0]
    if args.profile:
        profiling.start()
    try:
        return _staged_optimize(args)
    finally:
        if args.profile:  # printed on failure too: where did the time go before it failed
            print(profiling.stop().to_table(), end="", file=sys.stderr)


def _staged_optimize(args: argparse.Namespace) -> int:
    from graphpass.outputs import Outputs

    with Outputs() as outputs:
        try:
            return _optimize(args, outputs)
        except Exception:
            if args.keep_failed:
                try:
                    kept = outputs.commit()
                except GraphpassError as e:  # the run's own error is the one to report
                    print(f"graphpass: --keep-failed: could not keep the files: {e}", file=sys.stderr)
                else:
                    if kept:
                        print(f"graphpass: --keep-failed: kept {', '.join(str(p) for p in kept)}", file=sys.stderr)
            raise


def _optimize(args: argparse.Namespace, outputs) -> int:
    import graphpass as gp
    from graphpass.ir import model_io, profiling
    from graphpass.ir.profiling import phase
    from graphpass.outputs import check_output_file, check_output_folder, write_error

    _check_pass_list(args)
    shapes = parse_input_shapes(args.input_shape)
    dims = parse_dims(args.dim)
    # refuse output paths before any work; the staging folders come only when needed (a run
    # killed while loading leaves nothing)
    check_output_file(args.output)
    _refuse_overwriting_external_input(args.model, args.output)
    if args.report:
        check_output_file(args.report, "report path")
    if args.dump_dir:
        check_output_folder(Path(args.dump_dir), "--dump-dir", may_not_exist=True)
    _apply_fusion_switches(args)
    from graphpass.cli_atc import check_optimize_atc_args

    check_optimize_atc_args(args)
    options = {}
    if args.fold_size_limit is not None:
        options["fold_constants"] = {"size_limit": args.fold_size_limit}
    if args.fold_growing:
        options.setdefault("fold_constants", {})["fold_growing"] = True
    if args.layout == "off":
        args.disable = [",".join(_split_names(args.disable) + ["propagate_layout"])]
    else:
        options["propagate_layout"] = {"mode": args.layout}
    if args.mixed_precision or args.keep_fp32:
        keep = _split_names([args.keep_fp32]) if args.keep_fp32 and args.keep_fp32 != "auto" else []
        if args.keep_fp32 == "auto":
            from graphpass.check import precision as P

            keep = P.analyze(model_io.load_proto(args.model), seed=args.seed, input_shapes=shapes).keep_fp32
        options["mixed_precision"] = {"mode": args.mixed_precision or "force_fp16", "keep_fp32": keep}
        args.atc_keep_fp32 = keep
        args.enable = [",".join(_split_names(args.enable) + ["mixed_precision"])]
        if args.passes and "mixed_precision" not in _split_names(args.passes):
            # --enable does not add to an explicit list: without this the pass never ran
            args.passes = [",".join(_split_names(args.passes) + ["mixed_precision"])]
    # Check pass names before loading the model: usage errors come first.
    from graphpass.passes import pipelines

    pipelines.build(args.pipeline, _split_names(args.passes) or None,
                    set(_split_names(args.disable)), set(_split_names(args.enable)))
    if args.explain:
        from graphpass.passes.framework.registry import get_pass

        for name in _split_names([args.explain]):
            get_pass(name)  # an unknown name is a usage error, with the closest one
    with phase("load"):
        graph = gp.load(args.model, input_shapes=shapes or None, dims=dims or None,
                        max_memory=args.max_memory, freeze_initializer_inputs=args.freeze_initializers)
    if dims:  # --verify feeds what --dim fixed too (-1 where a dim stays dynamic)
        from graphpass.ir.shapes import given_shapes

        shapes = given_shapes(graph.graph)["inputs"]
    staged_dumps = outputs.folder(args.dump_dir) if args.dump_dir else None
    with _Progress(args, "optimizing") as progress:
        result = gp.optimize(
            graph,
            pipeline=args.pipeline,
            passes=_split_names(args.passes) or None,
            disable=_split_names(args.disable),
            enable=_split_names(args.enable),
            target=args.target,
            input_shapes=shapes,
            dims=dims,
            verify_each=args.verify_each,
            dump_dir=staged_dumps,
            max_rounds=args.max_rounds,
            options=options,
            seed=args.seed,
            precision_mode=args.precision_mode,
            iterations_per_loop=args.iterations_per_loop,
            on_pass=progress.on_pass if progress.enabled else None,
            name=Path(args.model).name,
            max_memory=args.max_memory,
            freeze_initializer_inputs=args.freeze_initializers,
        )
    staged_model = outputs.file(args.output)
    staged_report = outputs.file(args.report) if args.report else None
    try:
        with phase("save"):
            model_io.save(result.graph, staged_model, emit=args.emit)
    except OSError as e:
        raise write_error(args.output, e) from None
    with phase("check written"):
        try:
            model_io.check_written(staged_model, args.model, shapes)  # never hand on an invalid model
        except model_io.InvalidOutputError:
            _blame_fixed_shapes(args.model, shapes, args.seed)  # the fixed shapes, if the input cannot run with them
            raise
    if args.verify:
        applied = [r.name for r in result.report.passes if r.application]
        with phase("verify"):
            result.report.notes.append(_verify_output(args, staged_model, shapes, applied))
    kit_lines = []
    if args.atc:
        from graphpass.cli_atc import write_optimize_kit

        kit_lines = write_optimize_kit(args, result.graph, outputs)
    profiling.enter("report")  # the report file and the table below (an error: closed when the profile stops)
    if staged_report is not None:
        text = result.report.to_markdown() if staged_report.suffix.lower() in (".md", ".markdown") else result.report.to_json()
        try:
            staged_report.write_text(text, encoding="utf-8")
        except OSError as e:
            raise write_error(args.report, e) from None
    outputs.commit()
    if not args.quiet:
        report = result.report
        print(report.to_table(verbose=args.verbose) if args.verbose else report.to_summary(max_lines=SUMMARY_LINES - 1),
              end="")
        if args.explain is not None:
            _print_explanations(report.explanations, args.explain)
        print(f"wrote {args.output}" + (f" (dumps in {args.dump_dir})" if args.dump_dir else ""))
        if kit_lines:
            print("\n".join(kit_lines))
    profiling.leave("report")
    return 0


def _refuse_overwriting_external_input(model: str, output: str) -> None:
    """``-o`` onto the input model itself is refused when the input keeps its weights in external
    data: the output's data goes beside them under a new name (the input's is read while it is
    written), which would leave the input's data files behind, orphaned."""
    try:
        same = os.path.samefile(model, output)
    except OSError:  # the output does not exist yet (or the input does not: load says so)
        return
    if not same:
        return
    import onnx

    try:
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model: loading it reports that properly
        return
    files = sorted({e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"})
    if files:
        raise UsageError(f"-o {output} is the input model, whose weights are in external data ({', '.join(files)}) "
                         "that would be left behind; write the optimized model to another path")


def _verify_output(args: argparse.Namespace, staged: Path, shapes: dict[str, list[int]], applied: list[str]) -> str:
    """Compare the written (staged) model with the input in onnxruntime; the report note, or raise.

    The input model not running is bad input (exit 2); the output not loading or not running
    where the input does, or differing, is a failed verification (exit 1).
    """
    from graphpass.check import verify as V
    from graphpass.errors import BadModelError
    from graphpass.ir import model_io

    original = model_io.load_proto(args.model)
    _check_input_bytes(original, shapes, limits.resolve_max_memory(args.max_memory), "--verify")
    try:
        feeds, ref, _, ra, notes = V.reference(original, seed=args.seed, input_shapes=shapes,
                                               fp16_emulate=args.fp16_emulate)
    except BadModelError as e:
        raise BadModelError(f"--verify: {args.model}: {e}") from None
    kept = "" if args.keep_failed else "; the output was not kept (use --keep-failed)"
    try:
        V.check_deterministic("the input model", original, ra, feeds, ref)
    except UsageError as e:  # --verify asked for a verified output: none can be given
        raise UsageError(f"{e}; --verify cannot judge it" + (kept and ", the output was not kept (use --keep-failed)")) from e
    from graphpass.passes.framework.registry import all_passes

    try:
        checked = V.check_outputs(ref, str(staged), feeds, promises=V.promises_of(applied, all_passes()),
                                  rtol=args.rtol, atol=args.atol, fp16_emulate=args.fp16_emulate, fp16=ra.fp16)
    except BadModelError as e:  # the input model ran: the output is ours to blame
        raise VerificationError(f"verification failed: the optimized model does not run where the input does: {e}"
                                + kept) from None
    if not checked.ok:
        approx = sorted({n for n in applied if getattr(all_passes().get(n), "promise", None) is not None
                         and all_passes()[n].promise.approximate})
        hint = (f"; {', '.join(approx)} ran: an approximation, whose error its report gives (max_abs_error); it "
                "loosens no check: give the error you accept with --atol/--rtol") if approx and args.atol is None \
            and args.rtol is None else ""
        raise VerificationError(f"verification failed: {checked.describe()}" + hint + kept)
    emulated = " with fp16 emulation" if ra.emulated or checked.emulated else ""
    return (f"verified with onnxruntime{emulated}: {len(checked.comparisons)} output(s) match at {checked.tolerance} "
            f"(seed {args.seed})" + "".join(f"; {n}" for n in notes))


def _apply_fusion_switches(args: argparse.Namespace) -> None:
    """Fold --fusion-off and --fusion-switch into --disable / --enable (names checked later).

    Precedence, broad to specific: --fusion-off, then the switch file, then the explicit
    --enable and --disable (a name given to both stays disabled).
    """
    from graphpass.passes.fusion_switch import fusion_passes, read_switch_file

    disable: set[str] = set(fusion_passes()) if getattr(args, "fusion_off", False) else set()
    enable: set[str] = set()
    if getattr(args, "fusion_switch", None):
        for name, on in read_switch_file(args.fusion_switch).items():
            (enable if on else disable).add(name)
            (disable if on else enable).discard(name)
    explicit_on, explicit_off = set(_split_names(args.enable)), set(_split_names(args.disable))
    enable = (enable | explicit_on) - explicit_off
    disable = (disable - explicit_on) | explicit_off
    args.disable = [",".join(sorted(disable))] if disable else None
    args.enable = [",".join(sorted(enable))] if enable else None


def _print_explanations(explanations, only: str) -> None:
    """Each refusal once (a pass refusing the same site in every round says it once)."""
    names = set(_split_names([only]))
    rows = list(dict.fromkeys((e.pass_name, e.op, e.node, e.reason) for e in explanations
                              if not names or e.pass_name in names))
    if not rows:
        print("explain: no pattern matched and was refused" + (f" by {only}" if only else ""))
    for pass_name, op, node, reason in rows:
        print(f"explain: {pass_name}: {op} '{node}': {reason}")


_PASS_LIST = re.compile(r"^[a-z][a-z0-9_]*(,[a-z][a-z0-9_]*)*$")


def _explain_takes_no_path(argv: list[str]) -> list[str]:
    """``--explain model.onnx``: the optional value of --explain is a pass name, never the model
    path that follows it (argparse would take it): an existing file, or anything that is not a
    list of snake_case names, stays a positional argument."""
    out = list(argv)
    for k, a in enumerate(out[:-1]):
        nxt = out[k + 1]
        if a == "--explain" and not nxt.startswith("-") and (not _PASS_LIST.match(nxt) or os.path.isfile(nxt)):
            out[k] = "--explain="
    return out


def cmd_cost(args: argparse.Namespace) -> int:
    import graphpass as gp
    from graphpass.cost_model import KNOWN_TARGETS, create, get_target
    from graphpass.passes.shape_proof import ShapeProof, annotate, prove_shapes

    model = create(args.target)  # an unknown target fails before the model is read
    target = get_target(args.target)
    if not target.estimates:
        raise UsageError(f"--target {target.name}: no cost model, nothing to estimate; give a hardware target "
                         f"({', '.join(KNOWN_TARGETS)}) or a profile file")
    if args.output:
        from graphpass.outputs import check_output_file

        check_output_file(args.output)
    graph = gp.load(args.model, input_shapes=parse_input_shapes(args.input_shape) or None,
                    dims=parse_dims(args.dim) or None).graph
    # open dims assumed, shape arithmetic folded, on a copy, as ATC compiles it (no model: nothing to prove for)
    proof = prove_shapes(graph) if model.active else ShapeProof(graph)
    report = annotate(model.estimate(proof.graph, precision_mode=args.precision_mode,
                                     iterations_per_loop=args.iterations_per_loop, loop_trips=args.loop_trips), proof)
    top = args.top if args.top is not None else (15 if args.verbose or args.output else 5)
    brief = not (args.verbose or args.output)
    text = {"json": report.to_json, "csv": report.to_csv}.get(args.format, lambda: report.to_table(top=top, brief=brief))()
    if args.output:
        _write_text_atomic(Path(args.output), text if text.endswith("\n") else text + "\n")
    else:
        _print_report(args, text, args.format == "table")
    return 0


def _print_report(args: argparse.Namespace, text: str, brief: bool) -> None:
    """Print a verb's text report: by default (``brief``, no -v) in at most REPORT_LINES lines
    (runs of one kind of line counted, long lines cut); -v prints it whole."""
    if brief and not args.verbose:
        text = reporting.brief_text(text, REPORT_LINES, more="-v prints everything; --format json holds it all")
    print(text, end="" if text.endswith("\n") else "\n")


def cmd_calibrate(args: argparse.Namespace) -> int:
    import graphpass as gp
    from graphpass.cost_model import get_target
    from graphpass.cost_model.msprof import calibrate, corrected_profile_text

    target = get_target(args.target)  # an unknown target fails before the model is read
    if target.profile is None:
        raise UsageError("calibrate needs a hardware target, not 'none'")
    from graphpass.outputs import check_output_file

    if not str(args.output).endswith(".toml"):
        raise UsageError(f"-o {args.output}: the corrected target file must end in .toml (it is read with --target FILE)")
    check_output_file(args.output)
    graph = gp.load(args.model, input_shapes=parse_input_shapes(args.input_shape) or None,
                    dims=parse_dims(args.dim) or None).graph
    symbolic = sorted({str(d) for t in graph.inputs for d in (t.shape or ["?"]) if not hasattr(d, "__index__")})
    if symbolic:  # the op summary was profiled at one shape: factors against a guessed one would be off by it
        raise UsageError(f"{args.model}: symbolic input dims {', '.join(symbolic)}: give the shapes the op summary "
                         "was profiled at with --input-shape or --dim (e.g. --dim batch=8)")
    rows, unmatched = calibrate(graph, args.op_summary, target, precision_mode=args.precision_mode)
    print(f"{'op type':24s} {'measured us':>12s} {'estimated us':>13s} {'estimate/measured':>18s}")
    for r in rows:
        ratio = f"{r.estimated_us / r.measured_us:.2f}" if r.measured_us else "-"
        print(f"{r.op:24s} {r.measured_us:12.1f} {r.estimated_us:13.1f} {ratio:>18s}")
    if unmatched:
        print(f"{len(unmatched)} op summary rows matched no node: {', '.join(unmatched[:10])}")
    zero = [r.op for r in rows if r.measured_us > 0 and not r.estimated_us > 0]
    if zero:
        print(f"measured but estimated at 0 us (fused or folded in the estimate), no factor written: {', '.join(zero)}")
    _write_text_atomic(Path(args.output), corrected_profile_text(target, rows, args.op_summary))
    print(f"wrote {args.output}: use it with --target {args.output}")
    return 0


def _render_diff(d, args: argparse.Namespace) -> str:
    """A diff in ``args.format`` (json, markdown, html, or text: colored on a terminal)."""
    from graphpass.diff import to_html, to_json, to_markdown, to_text

    if args.format == "json":
        return to_json(d) + "\n"
    if args.format == "markdown":
        return to_markdown(d)
    if args.format == "html":
        return to_html(d)
    return to_text(d, color=not args.output and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))


def cmd_diff(args: argparse.Namespace) -> int:
    from graphpass.cost_model import create
    from graphpass.diff import diff_models

    if args.git_args or os.devnull in (args.before, args.after) or args.open:
        from graphpass.cli_git import cmd_git_diff

        return cmd_git_diff(args)
    create(args.target)  # an unknown target fails before the models are read
    if args.output:
        from graphpass.outputs import check_output_file

        check_output_file(args.output)
    d = diff_models(args.before, args.after, target=args.target, names=(args.before, args.after))
    text = _render_diff(d, args)
    if args.output:
        _write_text_atomic(Path(args.output), text)
    else:
        _print_report(args, text, args.format == "text")
    return 1 if args.exit_code and not d.equivalent else 0


def cmd_passes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    import graphpass as gp
    from graphpass.passes import pipelines

    if args.write_fusion_switch:
        from graphpass.passes.fusion_switch import fusion_passes, write_switch_file

        _apply_fusion_switches(args)
        disable, enable = set(_split_names(args.disable)), set(_split_names(args.enable))
        pipelines.build(None, None, disable, enable)  # unknown names are usage errors
        settings = {n: (c.default_enabled or n in enable) and n not in disable for n, c in fusion_passes().items()}
        path = write_switch_file(args.write_fusion_switch, settings)
        print(f"wrote {path}")
        return 0

    default = set(pipelines.build(pipelines.DEFAULT_PIPELINE))  # with the plugins' default-enabled passes
    t = Table()
    for col in ("name", "kind", "default", "promise", "Ascend pass", "summary"):
        t.add_column(col)
    for name, cls in gp.all_passes().items():
        on = "on" if cls.default_enabled and name in default else "off"
        t.add_row(name, cls.kind.value, on, str(cls.promise), cls.ascend_name or "", cls.summary)
    Console(width=200).print(t)
    return 0


def _fmt_type(t) -> str:
    """An ONNX type as text: ``float[batch, 3, 224, 224]``, ``int64[] (scalar)``, ``float, shape
    unknown``, ``seq(float[?])``; dims as the file writes them (a name, a number, ? for neither)."""
    import onnx

    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(t, kind)
        dtype = onnx.TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type else "?"
        if kind == "sparse_tensor_type":
            dtype = f"sparse {dtype}"
        if not tt.HasField("shape"):
            return f"{dtype}, shape unknown"
        dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        return f"{dtype}[{', '.join(dims)}]" + (" (scalar)" if not dims else "")
    if kind == "sequence_type":
        return f"seq({_fmt_type(t.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_fmt_type(t.optional_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(t.map_type.key_type).lower()
        return f"map({key}, {_fmt_type(t.map_type.value_type)})"
    return "type unknown"


def _fmt_shape(vi) -> str:
    return _fmt_type(vi.type)


def cmd_inspect(args: argparse.Namespace) -> int:
    import onnx
    from rich.console import Console
    from rich.table import Table

    from graphpass.ir import annotations as A
    from graphpass.ir import model_io

    # plain text: names and dims are shown as written ('[p2o.DynamicDimension.0, 3, ...]' is no markup)
    console = Console(width=120, markup=False, highlight=False, emoji=False)
    model = model_io.load_proto(args.model)
    size = Path(args.model).stat().st_size
    g = model.graph
    inits = {i.name for i in g.initializer}
    console.print(f"{args.model}: {size:,} bytes, IR {model.ir_version}, producer '{model.producer_name} {model.producer_version}'".rstrip())
    console.print("opsets: " + ", ".join(f"{o.domain or 'ai.onnx'}={o.version}" for o in model.opset_import))

    ops: collections.Counter = collections.Counter()
    subgraphs = 0
    engines: collections.Counter = collections.Counter()
    formats: collections.Counter = collections.Counter()

    def walk(graph):
        nonlocal subgraphs
        for n in graph.node:
            ops[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"] += 1
            for p in n.metadata_props:
                if p.key == A.ENGINE:
                    engines[p.value] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    subgraphs += 1
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    subgraphs += len(a.graphs)
                    for sg in a.graphs:
                        walk(sg)
        for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
            for p in vi.metadata_props:
                if p.key == A.FORMAT:
                    formats[p.value] += 1

    walk(g)
    dynamic = []
    t = Table(title="inputs / outputs")
    for col in ("kind", "name", "type"):
        t.add_column(col)
    for vi in g.input:
        if vi.name in inits:
            continue
        t.add_row("input", vi.name, _fmt_shape(vi))
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                dynamic.append(f"{vi.name}[{k}]={d.dim_param or '?'}")
    for vi in g.output:
        t.add_row("output", vi.name, _fmt_shape(vi))
    console.print(t)
    weight_bytes = sum(len(i.raw_data) for i in g.initializer)
    console.print(f"nodes: {sum(ops.values())} ({len(g.node)} in the main graph), subgraphs: {subgraphs}, "
                  f"local functions: {len(model.functions)}, initializers: {len(g.initializer)} ({weight_bytes:,} bytes)")
    console.print("dynamic dims: " + (", ".join(dynamic) if dynamic else "none"))
    if engines:
        console.print("engines: " + ", ".join(f"{k}={v}" for k, v in sorted(engines.items())))
    if formats:
        console.print("storage formats: " + ", ".join(f"{k}={v}" for k, v in sorted(formats.items())))
    h = Table(title="op histogram")
    h.add_column("op")
    h.add_column("count", justify="right")
    for op, c in ops.most_common():
        h.add_row(op, str(c))
    console.print(h)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from graphpass.check import verify as V
    from graphpass.ir import model_io

    a = model_io.load_proto(args.model_a)
    b = model_io.load_proto(args.model_b)
    shapes = parse_input_shapes(args.input_shape)
    V.check_input_shapes(a, shapes)
    if args.symbolic_dim < 1:
        raise UsageError(f"--symbolic-dim must be at least 1, got {args.symbolic_dim}")
    feeds = V.load_inputs(args.inputs, V.session(a), shapes) if args.inputs else None
    report = V.verify_models(a, b, feeds=feeds, seed=args.seed, input_shapes=shapes, rtol=args.rtol, atol=args.atol,
                             min_cosine=args.min_cosine, all_tensors=args.all_tensors, fp16_emulate=args.fp16_emulate,
                             symbolic_dim=args.symbolic_dim)
    report.inputs_from = args.inputs
    # standard JSON: an infinite difference is the string "inf", not Infinity (graphpass.reporting)
    print(report.to_json() if args.format == "json" else report.to_table(width=120), end="\n" if args.format == "json" else "")
    if not report.ok:
        where = f"; first divergent tensor: {report.first_divergence}" if report.first_divergence else ""
        raise VerificationError(f"{sum(not c.ok for c in report.outputs)} of {len(report.outputs)} outputs differ{where}")
    return 0


def cmd_precision(args: argparse.Namespace) -> int:
    from graphpass.check import precision as P
    from graphpass.check import verify as V
    from graphpass.ir import model_io

    for flag, share in (("--underflow-share", args.underflow_share), ("--absorption-share", args.absorption_share)):
        if not 0.0 <= share < 1.0:
            raise UsageError(f"{flag} {share:g}: a share between 0 and 1")
    model = model_io.load_proto(args.model)
    V.check_input_shapes(model, parse_input_shapes(args.input_shape))  # the check every verb shares
    shapes = parse_input_shapes(args.input_shape)
    feeds = V.load_inputs(args.inputs, V.session(model), shapes) if args.inputs else None
    report = P.analyze(model, feeds=feeds, seed=args.seed, input_shapes=parse_input_shapes(args.input_shape),
                       underflow_share=args.underflow_share, absorption_share=args.absorption_share,
                       check=not args.no_check, mode=args.mode)
    _print_report(args, report.to_json() if args.format == "json" else report.to_table(top=args.top, width=160),
                  args.format == "table")
    return 0


def cmd_bisect(args: argparse.Namespace) -> int:
    from graphpass.passes import pipelines
    from graphpass.bisect import bisect

    _check_pass_list(args)
    _apply_fusion_switches(args)
    shapes = parse_input_shapes(args.input_shape)
    passes, disable, enable = _split_names(args.passes) or None, _split_names(args.disable), _split_names(args.enable)
    pipelines.build(args.pipeline, passes, set(disable), set(enable))
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out-dir '{out}' exists and is not a folder")
    base = out.absolute()
    while not base.exists():  # checked before the search, which may take minutes
        base = base.parent
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"--out-dir '{out}' cannot be created or written ('{base}' is not a writable folder)")
    res = bisect(args.model, out, rtol=args.rtol, atol=args.atol, seed=args.seed, pipeline=args.pipeline, passes=passes,
                 disable=disable, enable=enable, target=args.target, input_shapes=shapes or None,
                 fp16_emulate=args.fp16_emulate)
    print(res.to_table(), end="")
    return 0 if res.first_bad is None else 1


# ------------------------------------------------------------------------------------------
# review in git (graphpass.gitint): textconv, diff as git's diff tool, install-git, hooks, PR comment


class LazyHelp(str):
    """An option's help text made only when help is printed (``make()``): the ``--cann-version``
    help lists the CANN releases, which reads two data files (~25 ms) every run would pay for."""

    def __new__(cls, make):
        self = super().__new__(cls, "(computed when shown)")
        self.make = make
        return self


class _HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help.make() if isinstance(action.help, LazyHelp) else action.help


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, formatter_class=_HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"graphpass: error: {message} (see '{self.prog} --help')\n")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. ``verb="optimize"``: only that verb's parser is made beside the
    top level's (``main``, for a command line that starts with it: the other verbs' ~150 options
    are not built, ~5 ms); it parses, helps and refuses exactly as in the whole parser."""
    from graphpass.cost_model import DEFAULT_TARGET, KNOWN_TARGETS, NONE_TARGET, get_target

    toolchain = get_target(NONE_TARGET)  # the toolchain's precision modes (the same on every target)
    p = _Parser(prog="graphpass", description="Graph-level compiler passes for ONNX models headed for Ascend NPUs.")
    p.add_argument("--version", action="version", version=f"graphpass {__import__('graphpass').__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    common = _Parser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0,
                        help="details: -v the per-pass table and every row, -vv everything; info (-v) and debug (-vv) logging")
    common.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    common.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py",
                        help="load a user's passes (registered with the pass API) from a module or a .py file; "
                             "repeatable (the graphpass.passes entry points load always)")

    o = sub.add_parser("optimize", parents=[common], help="run the pipeline and write the optimized model")
    o.add_argument("model", nargs="+", metavar="MODEL",
                   help="the ONNX model to optimize; several files, folders or glob patterns: every model, each in "
                        "its own worker, results in the -o folder (see the options for several models)")
    o.add_argument("-o", "--output", required=True,
                   help="where to write the optimized model (several models: the folder of the results)")
    o.add_argument("--pipeline", default=None, help="named pipeline (default: 'default')")
    o.add_argument("--passes", action="append", help="run exactly these passes (comma-separated)")
    o.add_argument("--disable", action="append", help="passes not to run (comma-separated)")
    o.add_argument("--enable", action="append", help="default-off passes to run (comma-separated)")
    o.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                   help="fix an input's shape (repeatable); -1, ? or a name keeps a dim symbolic (x:?,3,640,640)")
    o.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="fix a symbolic dim by name on every input that has it (repeatable; e.g. --dim batch=1)")
    o.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"hardware profile of the cost model ({', '.join(KNOWN_TARGETS)}, a profile file such as "
                        "'graphpass calibrate' writes, or 'none': no cost model)")
    o.add_argument("--precision-mode", default=None, help="precision mode the cost model assumes")
    o.add_argument("--iterations-per-loop", type=_per_loop_arg, default=1, metavar="N", help="for the cost model's step term")
    o.add_argument("--max-rounds", type=_rounds_arg, default=4, metavar="N",
                   help="cap of the fixed-point loop, >= 1 (default 4)")
    o.add_argument("--fold-size-limit", type=_bytes_arg, default=None, metavar="BYTES",
                   help="with --fold-growing: largest constant a fold that grows the file may store (default 1 MiB)")
    o.add_argument("--fold-growing", action="store_true",
                   help="also fold what makes the file bigger (ConstantOfShape/Tile/Expand results, weight fills) "
                        "up to --fold-size-limit per tensor; by default a fold never grows the file")
    o.add_argument("--verify-each", action="store_true", help="check and compare outputs after every pass")
    o.add_argument("--verify", action="store_true", help="compare outputs of the result with the input model")
    o.add_argument("--keep-failed", action="store_true",
                   help="on failure keep what was written (model, report, dumps) and say where; by default a "
                        "failed run leaves no file behind")
    o.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE",
                   help="memory budget of the whole run: the model file, its external data, folded tensors, "
                        "--verify inputs; e.g. 512M, 16G (default 8G or 3/4 of physical memory, whichever is "
                        "less; GRAPHPASS_MAX_MEMORY sets it too)")
    o.add_argument("--freeze-initializers", action="store_true",
                   help="treat initializers that are also graph inputs (overridable defaults) as constants "
                        "and drop them from the inputs; by default they stay inputs")
    o.add_argument("--rtol", type=_tolerance_arg, default=None,
                   help="--verify tolerance (default: exact when only exact passes ran, else the loosest promise, at least 1e-4)")
    o.add_argument("--atol", type=_tolerance_arg, default=None, help="--verify tolerance (default: as --rtol; at least 1e-3)")
    o.add_argument("--fp16-emulate", action=argparse.BooleanOptionalAction, default=True,
                   help="--verify runs models holding float16 with every fp16 value rounded (default on)")
    o.add_argument("--seed", type=_seed_arg, default=0, help="seed of generated inputs")
    o.add_argument("--dump-dir", default=None, help="write the graph after each pass that changed it")
    o.add_argument("--report", default=None, metavar="FILE.json|FILE.md", help="also write the report")
    o.add_argument("--mixed-precision", default=None, metavar="MODE",
                   choices=toolchain.precision_mode_names(mixed_precision=True),
                   help="convert compute to fp16 (bf16: the *_bf16 modes, 910B) by this Ascend precision mode (the mixed_precision pass)")
    o.add_argument("--keep-fp32", default=None, metavar="NAMES|auto",
                   help="nodes that stay fp32; 'auto': the ones graphpass precision recommends")
    o.add_argument("--emit", default="portable", choices=["portable", "device"],
                   help="portable (default): device ops inlined into standard ONNX; device: graphpass.ascend ops kept")
    o.add_argument("--layout", default="optimal", choices=["optimal", "greedy", "off"],
                   help="storage formats: optimal (min-cut, default), greedy (GE's first-input rule, for comparison), off")
    o.add_argument("--fusion-off", action="store_true", help="switch every fusion off (precision_tool's fusion_off)")
    o.add_argument("--fusion-switch", default=None, metavar="FILE",
                   help="ATC fusion_switch_file (PassName:off lines, or the {\"Switch\": ...} JSON)")
    o.add_argument("--explain", nargs="?", const="", default=None, metavar="PASS",
                   help="print every site where a pass matched but refused, and why (all passes, or the "
                        "comma-separated PASS names; write --explain=PASS before the model path)")
    o.add_argument("--profile", action="store_true",
                   help="print the run's phases (load, shape inference, each pass, cost estimates, export, save, "
                        "report, verify) with wall time and peak RSS to stderr at the end")
    from graphpass.cli_atc import add_optimize_atc_args

    add_optimize_atc_args(o)
    from graphpass.cli_zoo import add_zoo_args

    add_zoo_args(o)
    o.set_defaults(func=cmd_optimize)
    if verb == "optimize":
        return p

    c = sub.add_parser("cost", parents=[common], help="cost-model estimate with per-op / per-engine breakdown")
    c.add_argument("model", help="the ONNX model to estimate")
    c.add_argument("--target", default=DEFAULT_TARGET, help=f"hardware profile ({', '.join(KNOWN_TARGETS)})")
    c.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                   help="fix an input's shape (repeatable); -1, ? or a name keeps a dim symbolic (x:?,3,640,640)")
    c.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="fix a symbolic dim by name on every input that has it (repeatable; e.g. --dim batch=1)")
    c.add_argument("--precision-mode", default=None, choices=toolchain.precision_mode_names(),
                   help="ATC precision mode (default: the profile's, ATC's force_fp16 on every target)")
    c.add_argument("--iterations-per-loop", type=_per_loop_arg, default=1, metavar="N",
                   help="steps per host round trip (the step-level launch + copies + sync divided by N)")
    c.add_argument("--loop-trips", type=_trips_arg, default=1, metavar="N", help="trip count of Loops whose count is not constant")
    c.add_argument("--format", default="table", choices=["table", "json", "csv"])
    c.add_argument("--top", type=_top_arg, default=None, help="rows in the per-op and per-node tables (default 5; 15 with -v or -o)")
    c.add_argument("-o", "--output", default=None, help="write the report to a file instead of stdout")
    c.set_defaults(func=cmd_cost)

    cb = sub.add_parser("calibrate", parents=[common],
                        help="the estimate against msprof's op_summary CSV; writes a corrected target file")
    cb.add_argument("model", help="the ONNX model the op summary was profiled on")
    cb.add_argument("op_summary", help="msprof op_summary CSV (Op Name, OP Type, Task Type, Task Duration(us))")
    cb.add_argument("--target", default=DEFAULT_TARGET, help=f"hardware profile ({', '.join(KNOWN_TARGETS)}) or a profile file")
    cb.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...",
                    help="fix an input's shape (the shape the op summary was profiled at)")
    cb.add_argument("--dim", action="append", metavar="NAME=VALUE",
                    help="fix a symbolic dim by name on every input that has it (e.g. --dim batch=8)")
    cb.add_argument("--precision-mode", default=None, choices=toolchain.precision_mode_names())
    cb.add_argument("-o", "--output", required=True, help="the corrected target file (.toml) to write")
    cb.set_defaults(func=cmd_calibrate)

    ps = sub.add_parser("passes", parents=[common], help="list passes")
    ps.add_argument("--write-fusion-switch", default=None, metavar="FILE",
                    help="write an ATC-compatible fusion switch file (.json or text) from the settings below")
    ps.add_argument("--disable", action="append", help="fusions to write as off")
    ps.add_argument("--enable", action="append", help="fusions to write as on")
    ps.add_argument("--fusion-off", action="store_true", help="every fusion off")
    ps.add_argument("--fusion-switch", default=None, metavar="FILE", help="start from this switch file")
    ps.set_defaults(func=cmd_passes)

    bs = sub.add_parser("bisect", parents=[common], help="find the first pass application that breaks numerics")
    bs.add_argument("model", help="the ONNX model whose optimization breaks its outputs")
    bs.add_argument("--out-dir", default="graphpass-bisect", help="where last_good.onnx and first_bad.onnx go")
    bs.add_argument("--pipeline", default=None)
    bs.add_argument("--passes", action="append")
    bs.add_argument("--disable", action="append")
    bs.add_argument("--enable", action="append")
    bs.add_argument("--fusion-off", action="store_true")
    bs.add_argument("--fusion-switch", default=None, metavar="FILE")
    bs.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...")
    bs.add_argument("--target", default=DEFAULT_TARGET, help=f"{', '.join(KNOWN_TARGETS)}, a profile file or 'none'")
    bs.add_argument("--seed", type=_seed_arg, default=0)
    bs.add_argument("--rtol", type=_tolerance_arg, default=None,
                    help="default: exact when only exact passes ran, else the loosest promise of the passes that ran (at least 1e-4)")
    bs.add_argument("--atol", type=_tolerance_arg, default=None, help="default: as --rtol (at least 1e-3)")
    bs.add_argument("--fp16-emulate", action=argparse.BooleanOptionalAction, default=True,
                    help="run models holding float16 with every fp16 value rounded, as the device does (default on)")
    bs.set_defaults(func=cmd_bisect)

    pr = sub.add_parser("precision", parents=[common], help="fp16 overflow/underflow risk per tensor")
    pr.add_argument("model", help="the fp32 ONNX model to check for fp16 risk")
    pr.add_argument("--inputs", default=None, metavar="FILE.npz")
    pr.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...")
    pr.add_argument("--seed", type=_seed_arg, default=0)
    pr.add_argument("--underflow-share", type=_share_arg, default=0.01,
                    help="risky when more than this share of nonzero values flush to zero in fp16 (default 1%%)")
    pr.add_argument("--absorption-share", type=_share_arg, default=0.5,
                    help="an Add/Sub absorbs when more than this share of its elements lose the smaller operand in fp16")
    pr.add_argument("--mode", default="force_fp16", choices=toolchain.precision_mode_names(mixed_precision=True, lowers=True),
                    help="mixed_precision mode the emulated fp16 check runs (default force_fp16)")
    pr.add_argument("--no-check", action="store_true", help="skip the emulated fp16 runs that confirm each finding")
    pr.add_argument("--format", default="table", choices=["table", "json"])
    pr.add_argument("--top", type=_top_arg, default=20, help="rows in the table (default 20)")
    pr.set_defaults(func=cmd_precision)

    i = sub.add_parser("inspect", parents=[common], help="ops, shapes, dynamic dims, opsets, size, subgraphs")
    i.add_argument("model", help="the ONNX model to describe")
    i.set_defaults(func=cmd_inspect)

    df = sub.add_parser("diff", parents=[common], help="graph diff for review: text, markdown, json, html")
    df.add_argument("before", help="the model before (e.g. the input of optimize)")
    df.add_argument("after", help="the model after (e.g. its output)")
    df.add_argument("--format", default="text", choices=["text", "markdown", "json", "html"])
    df.add_argument("-o", "--output", default=None, help="write the diff here (atomically) instead of stdout")
    df.add_argument("--exit-code", action="store_true", help="exit 1 when the graphs differ, 0 when equivalent (like git diff)")
    df.add_argument("--target", default=DEFAULT_TARGET, help="cost model for the deltas ('none': no estimates)")
    df.add_argument("git_args", nargs="*", help=argparse.SUPPRESS)  # the 7 arguments of GIT_EXTERNAL_DIFF
    df.add_argument("--open", action="store_true", help="with --format html: write the page to a temp file and open it")
    df.add_argument("--canonical-names", action="store_true", help=argparse.SUPPRESS)  # for the textconv fallback
    df.set_defaults(func=cmd_diff)
    from graphpass.cli_git import add_git_verbs

    add_git_verbs(sub, common)
    from graphpass.cli_atc import add_atc_verbs

    add_atc_verbs(sub, common)
    from graphpass.cli_tools import add_tool_verbs

    add_tool_verbs(sub, common, DEFAULT_TARGET)
    from graphpass.cli_zoo import add_zoo_verbs

    add_zoo_verbs(sub, common)

    v = sub.add_parser("verify", parents=[common], help="compare two models' outputs in onnxruntime")
    v.add_argument("model_a", help="the reference model")
    v.add_argument("model_b", help="the model compared with it")
    v.add_argument("--input-shape", action="append", metavar="NAME:D1,D2,...")
    v.add_argument("--seed", type=_seed_arg, default=0)
    v.add_argument("--rtol", type=_tolerance_arg, default=None,
                   help="elementwise |a-b| <= atol + rtol*|b| (default 1e-4; 1e-2 when a model holds float16; 0 with --atol 0: bitwise)")
    v.add_argument("--atol", type=_tolerance_arg, default=None, help="default 1e-3 (1e-2 when a model holds float16)")
    v.add_argument("--fp16-emulate", action=argparse.BooleanOptionalAction, default=True,
                   help="run models holding float16 with every fp16 value rounded, as the device does (default on)")
    v.add_argument("--symbolic-dim", type=_dim_value_arg, default=2, metavar="N",
                   help="value fed for symbolic dims not fixed by --input-shape (default 2; 1 if the original fails with 2)")
    v.add_argument("--min-cosine", type=_cosine_arg, default=None, help="also fail a tensor whose cosine similarity is lower")
    v.add_argument("--inputs", default=None, metavar="FILE.npz", help="inputs by name (default: seeded random ones)")
    v.add_argument("--all-tensors", action="store_true",
                   help="compare every intermediate both models share; name the first divergence and the first NaN/Inf")
    v.add_argument("--format", default="table", choices=["table", "json"])
    v.set_defaults(func=cmd_verify)
    return p


def reference_markdown() -> str:
    """The CLI reference of the README, rendered from the parser itself (every verb, every
    option, its default and its help): ``python tools/cli_reference.py --write`` puts it between
    the README's ``cli-reference`` markers; a test fails when the two differ."""
    parser = build_parser()
    formatter = _HelpFormatter("graphpass", width=10_000)

    def cell(text) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    lines = ["Every verb and option, generated from the argument parser (`python tools/cli_reference.py "
             "--write`; `tests/cli/test_readme.py` fails when this section and the parser differ).", ""]
    common = {"verbose", "quiet", "plugin"}
    first = next(iter(sub.choices.values()))
    sections = [("every verb", "options every verb takes", [a for a in first._actions if a.dest in common])]
    sections += [(f"`graphpass {verb}`", helps.get(verb, ""), [a for a in p._actions if a.dest not in common])
                 for verb, p in sub.choices.items()]
    for title, summary, actions in sections:
        lines += [f"#### {title}", "", cell(summary) + ".", "", "| argument | default | what it does |", "|---|---|---|"]
        for a in actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if a.option_strings:
                name = ", ".join(f"`{o}`" for o in a.option_strings)
                if a.nargs != 0:
                    metavar = a.metavar or (a.dest.upper() if not a.choices else None)
                    name += f" {metavar}" if metavar else ""
            else:
                name = f"`{a.metavar or a.dest.upper()}`"
            default = a.default
            hidden = default is None or default is False or default == [] or default == argparse.SUPPRESS
            shown = "" if hidden or not a.option_strings or a.nargs == 0 else f"`{default}`"
            text = formatter._expand_help(a) if a.help else ""
            if a.choices and not isinstance(a, argparse._SubParsersAction):
                text += f" (one of: {', '.join(f'`{c}`' for c in a.choices)})"
            lines.append(f"| {cell(name)} | {cell(shown)} | {cell(text)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = _explain_takes_no_path(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser("optimize" if argv[:1] == ["optimize"] else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _setup_logging(args.verbose, args.quiet)
    from graphpass.check import runtime

    runtime.set_verbosity(args.verbose)
    previous = _catch_termination()
    try:
        _load_plugins(args.plugin)
        if args.verb in _SPINNER_VERBS:  # optimize shows its passes; these a spinner on long runs
            with _Progress(args, args.verb):
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except Terminated as e:  # temporaries were removed on the way out (finally / Outputs)
        print(f"graphpass: terminated by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except GraphpassError as e:
        print(f"graphpass: error: {error_text(e)}", file=sys.stderr)
        if args.verbose:
            import traceback

            traceback.print_exc()
        return e.exit_code
    except KeyboardInterrupt:
        print("graphpass: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (graphpass ... | head): not an error of ours
        sys.stdout = open(os.devnull, "w")
        return 0
    except Exception as e:  # a bug in graphpass, not in the user's input
        print(f"graphpass: internal error: {type(e).__name__}: {e} (rerun with -v for the traceback)", file=sys.stderr)
        if args.verbose:
            import traceback

            traceback.print_exc()
        return 3
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for line in _WARNINGS.summary():
            print(line, file=sys.stderr)
        _WARNINGS.reset(enabled=True)


def _load_plugins(specs: Sequence[str]) -> None:
    """--plugin: import each module or file; its passes register themselves (a default-enabled
    one joins the default pipeline at its declared position)."""
    from graphpass.passes.framework.registry import load_plugin

    for spec in specs:
        try:
            added = load_plugin(spec)
        except UsageError as e:
            raise UsageError(f"--plugin: {e}") from None
        log.info("--plugin %s: %s", spec, ", ".join(added) or "no new pass")


class Terminated(BaseException):
    """SIGTERM arrived: raised where the program is, so ``finally`` blocks remove temporaries."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _catch_termination():
    """Turn SIGTERM into :class:`Terminated` (SIGINT already raises KeyboardInterrupt); returns
    the previous handler, or None when not on the main thread (signals cannot be caught there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def run() -> None:
    """The process entry point (``graphpass``, ``python -m graphpass``): :func:`main`, then exit
    without the interpreter's teardown once every output is out (see :func:`exit_now`)."""
    exit_now(main())


def exit_now(code: int) -> None:
    """End the process with ``code`` the way the interpreter would, less its teardown.

    Python's exit frees every object one by one (the optimized graph, the modules): ~0.13 s after
    a 10k-node optimize, a third of onnxruntime's whole run. Everything that teardown does that a
    reader can see is done here first, in the interpreter's order: the threads it waits for (if
    any other runs, the ordinary exit is taken; so under ``-i``, a profiler or a tracer such as
    coverage, which write their results at exit, and after a plugin or an entry point's module was
    imported: user code may leave work to the teardown, an unclosed file's buffer, a temporary file
    removed when finalized), the ``atexit`` functions (logging's flush,
    temporary folders' finalizers, multiprocessing's joins, a plugin's own), then Python's and
    C's standard streams are flushed; a flush that fails (a closed pipe) takes the ordinary exit,
    which reports it as it always did. The files graphpass writes are closed before they are
    moved into place (graphpass.outputs), so nothing is left in a buffer."""
    import threading

    registry = sys.modules.get("graphpass.passes.framework.registry")
    if (sys.flags.inspect or sys.getprofile() is not None or sys.gettrace() is not None  # -i, cProfile, coverage
            or any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate())
            or (registry is not None and registry.USER_CODE)):  # a plugin's teardown: its files, its temporaries
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # a reader that went away, a stream closed: the ordinary path says so
        sys.exit(code)
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # what C code (a plugin, a runtime) printed through stdio
    except (OSError, AttributeError, TypeError):
        pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
