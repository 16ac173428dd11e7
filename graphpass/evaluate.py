"""``graphpass evaluate``: which rewrites would fire on each model, and what they would gain.

Like auto_optimizer's ``evaluate``: the pipeline runs on a copy of each model in memory and
nothing is written. Per model: the passes that changed the graph (applications, nodes removed,
their stats), the ones the cost model rolled back, and the estimated cost before and after on
the target.

:func:`evaluate_model` is one model's evaluation, a plain function of (path, options) -> dict
(JSON-ready) that never raises for a bad model: a model that cannot be read is a result with
``status`` "bad-model" and its one-line error; a bug of graphpass is "internal-error". Model-zoo
runs call it in worker processes. :func:`evaluate` takes paths, folders (``*.onnx`` inside,
recursively, in name order) and glob patterns, and yields one result per model as it finishes.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from graphpass.errors import BadModelError, GraphpassError, UsageError

__all__ = ["evaluate", "evaluate_model", "expand_named", "expand_paths"]


def expand_paths(specs: Iterable[str | os.PathLike]) -> list[Path]:
    """Model files named by ``specs``: a file as it is, a folder's ``*.onnx`` (recursively), a glob
    pattern's matches; each file once, in the order given (a folder's and a glob's in name
    order). A spec that names nothing is a UsageError."""
    return [p for _, p in expand_named(specs)]


def expand_named(specs: Iterable[str | os.PathLike]) -> list[tuple[str, Path]]:
    """:func:`expand_paths` with a name for each model: its path below the folder it was found
    in (a file's and a glob match's: its file name); a name met twice gets ``~2``, ``~3`` before
    its ``.onnx``."""
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    names: set[str] = set()

    def add(name: str, p: Path) -> None:
        key = os.path.realpath(p)
        if key in seen:
            return
        seen.add(key)
        stem, dot, ext = name.rpartition(".") if name.endswith(".onnx") else (name, "", "")
        k = 2
        while name in names:  # two folders with a model of the same relative name
            name = f"{stem}~{k}{dot}{ext}"
            k += 1
        names.add(name)
        out.append((name, p))

    for spec in specs:
        spec = str(spec)
        p = Path(spec)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.onnx") if q.is_file())
            if not found:
                raise UsageError(f"no .onnx file in folder '{spec}'")
            for q in found:
                add(q.relative_to(p).as_posix(), q)
        elif p.exists():
            add(p.name, p)
        elif glob.has_magic(spec):
            found = sorted(Path(q) for q in glob.glob(spec, recursive=True) if Path(q).is_file())
            if not found:
                raise UsageError(f"no file matches '{spec}'")
            for q in found:
                add(q.name, q)
        else:
            raise UsageError(f"no such file or folder: '{spec}'")
    return out


def check_options(options: Mapping[str, Any]) -> None:
    """What :func:`graphpass.optimize` checks before it reads a model, checked once for all of
    them: pass and pipeline names, pass options, the target (UsageError / TypeError)."""
    from graphpass.api import pass_instances
    from graphpass.cost_model.target import Target
    from graphpass.passes import pipelines

    names = pipelines.build(options.get("pipeline"), list(options.get("passes") or []) or None,
                            set(options.get("disable") or ()), set(options.get("enable") or ()))
    pass_instances(names, options.get("options"))
    if "target" in options:
        Target.load(options["target"])


def _rewrites(records) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    fired: dict[str, dict[str, Any]] = {}
    rolled: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.rolled_back:
            entry = rolled.setdefault(r.name, {"pass": r.name, "applications": 0, "why": r.note})
            entry["applications"] += 1
            continue
        if not r.modified:
            continue
        entry = fired.setdefault(r.name, {"pass": r.name, "applications": 0, "nodes_removed": 0, "stats": {},
                                          "cost_delta_us": None})
        entry["applications"] += 1
        entry["nodes_removed"] += r.nodes_before - r.nodes_after
        for k, v in r.stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                entry["stats"][k] = entry["stats"].get(k, 0) + v
        if r.cost_before_us is not None and r.cost_after_us is not None:
            entry["cost_delta_us"] = (entry["cost_delta_us"] or 0.0) + (r.cost_after_us - r.cost_before_us)
    return list(fired.values()), list(rolled.values())


def evaluate_model(path: str | os.PathLike, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One model's evaluation; ``options`` are :func:`graphpass.optimize`'s keyword arguments
    (target, pipeline, passes, disable, enable, input_shapes, dims, max_memory, ...). Never
    raises (see the module docstring): a bad model is "bad-model", options this model cannot
    take (e.g. an input shape for an input it lacks) "refused"."""
    from graphpass.api import optimize

    opts = dict(options or {})
    t0 = time.perf_counter()
    result: dict[str, Any] = {"model": str(path), "status": "ok", "error": None}
    try:
        run = optimize(Path(path), **opts)
    except GraphpassError as e:  # bad model, or options this model cannot take (an input name it lacks)
        result.update(status="bad-model" if isinstance(e, BadModelError) else "refused", error=str(e),
                      exit_code=e.exit_code)
    except MemoryError:
        result.update(status="bad-model", error="out of memory", exit_code=2)
    except Exception as e:  # a bug of graphpass: recorded, the next model goes on
        result.update(status="internal-error", error=f"{type(e).__name__}: {e}", exit_code=3)
    else:
        rep = run.report
        fired, rolled = _rewrites(rep.passes)
        before, after = rep.cost_before_us, rep.cost_after_us
        result.update(
            exit_code=0, target=rep.target, nodes_before=rep.nodes_before, nodes_after=rep.nodes_after,
            cost_before_us=before, cost_after_us=after,
            gain_pct=(100.0 * (before - after) / before) if before and after is not None else None,
            rewrites=fired, rolled_back=rolled, notes=list(rep.notes))
    result["seconds"] = time.perf_counter() - t0
    return result


def evaluate(paths: Sequence[str | os.PathLike] | str | os.PathLike, **options: Any) -> Iterator[dict[str, Any]]:
    """:func:`evaluate_model` over the models ``paths`` name (files, folders, globs), one result
    per model as it finishes. The paths are resolved first: one that names nothing is a
    UsageError before any model runs."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    check_options(options)
    files = expand_paths(paths)
    for f in files:
        yield evaluate_model(f, options)
