"""Run graphpass over many models: each in its own worker process, with its own time and memory
limits, in parallel, resumable (see :mod:`graphpass.zoo`)."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from graphpass.errors import UsageError
from graphpass.zoo.store import COLUMNS, Store, canonical_options

__all__ = ["Task", "expand_models", "input_hash", "kill_workers", "options_argv", "plan", "run_task", "run"]

VERBS = ("optimize", "evaluate")

#: options a zoo run passes to each model's run: name -> how it is written on the command line
#: ("flag": present when true; "value": one value; "values": repeated)
OPTIONS: dict[str, str] = {
    "target": "value", "pipeline": "value", "passes": "values", "disable": "values", "enable": "values",
    "input_shape": "values", "dim": "values", "max_memory": "value", "precision_mode": "value",
    "verify": "flag", "rtol": "value", "atol": "value", "seed": "value", "emit": "value", "layout": "value",
    "fusion_off": "flag", "mixed_precision": "value", "max_rounds": "value",
}
#: options only ``optimize`` takes (``evaluate`` refuses them)
OPTIMIZE_ONLY = frozenset({"verify", "rtol", "atol", "seed", "emit", "layout", "fusion_off", "mixed_precision",
                           "max_rounds", "precision_mode"})
#: when a watchdog kills a worker for memory: its RSS above this many bytes (with --max-memory M:
#: max(2 M, M + 1 GiB), the model's budget plus what the IR and onnxruntime hold beside it)
_RSS_SLACK = 1 << 30


@dataclass
class Task:
    """One model of a batch."""

    model: str            # the name shown and stored (its path below the folder it was found in)
    path: Path            # the file read
    out_rel: str          # where its outputs go, below the output folder
    verb: str
    options: dict[str, Any]
    input_hash: str = ""
    options_json: str = ""
    options_hash: str = ""
    timeout: float | None = None
    rss_limit: int | None = None
    out_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def expand_models(specs: Sequence[str | os.PathLike]) -> list[tuple[str, Path]]:
    """(name, path) of every model ``specs`` name (:func:`graphpass.evaluate.expand_named`)."""
    from graphpass.evaluate import expand_named

    return expand_named(specs)


def input_hash(path: Path) -> str:
    """sha256 of the model file and of every external data file it names (by content): a rerun
    recognizes a model that did not change, wherever it lies."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    for extra in _external_files(path):
        h.update(b"\0" + extra.name.encode("utf-8", "surrogatepass") + b"\0")
        try:
            with open(extra, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()


def _external_files(path: Path) -> list[Path]:
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - a corrupt file: its worker says what is wrong
        return []
    from graphpass.ir.graph import graph_protos

    names: set[str] = set()
    for g in graph_protos(model.graph):
        for t in g.initializer:
            for e in t.external_data:
                if e.key == "location":
                    names.add(e.value)
    return [path.parent / n for n in sorted(names)]


def options_argv(options: dict[str, Any], verb: str) -> list[str]:
    """The command-line form of ``options`` (see :data:`OPTIONS`) for one model's run."""
    argv: list[str] = []
    for name, value in options.items():
        kind = OPTIONS.get(name)
        if kind is None:
            raise UsageError(f"option '{name}' is not available for a run over several models "
                             f"(available: {', '.join(sorted(OPTIONS))})")
        if verb == "evaluate" and name in OPTIMIZE_ONLY:
            raise UsageError(f"option '{name}' does not apply to evaluate")
        flag = "--" + name.replace("_", "-")
        if value in (None, False, [], ()):
            continue
        if kind == "flag":
            argv.append(flag)
        elif kind == "values":
            for v in ([value] if isinstance(value, str) else list(value)):
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def _rss(pid: int) -> int:
    """Resident bytes of a live process (Linux /proc); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("graphpass:") or "Error" in ln:
            return ln[:500]
    return lines[-1][:500] if lines else ""


def run_task(task: Task) -> dict[str, Any]:
    """Run one model in a worker process (``python -m graphpass VERB MODEL ...``) under the
    task's time and memory limits; return its result row (see :data:`graphpass.zoo.store.COLUMNS`).
    Never raises for the model's sake: a crash, a hang or a model over the memory limit is a
    status. Picklable and self-contained: the Ray backend runs it on any node."""
    out_dir = Path(task.out_dir) if task.out_dir is not None else Path(tempfile.mkdtemp(prefix="graphpass-zoo-"))
    # the worker runs in the output folder, with absolute paths: ``-m`` puts the working folder on
    # the module path, and run from a source checkout its 'graphpass' folder would shadow the
    # installed package
    out_dir = out_dir.resolve()
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = task.out_rel[:-5] if task.out_rel.endswith(".onnx") else task.out_rel
    log_path = logs / (stem.replace("/", "__") + f".{task.verb}.log")
    cmd = [sys.executable, "-m", "graphpass", task.verb, str(Path(task.path).resolve())]
    report = output = None
    if task.verb == "optimize":
        output = out_dir / "models" / task.out_rel
        output.parent.mkdir(parents=True, exist_ok=True)
        report = logs / (stem.replace("/", "__") + ".report.json")
        cmd += ["-o", str(output), "--report", str(report), "-q"]
    else:
        cmd += ["--format", "json"]
    cmd += options_argv(task.options, task.verb)
    result: dict[str, Any] = dict.fromkeys(c for c, _ in COLUMNS)
    result.update({
        "model": task.model, "path": str(Path(task.path).resolve()), "verb": task.verb, "input_hash": task.input_hash,
        "options": task.options_json, "options_hash": task.options_hash, "started": time.time(),
        "backend": task.extra.get("backend", "local"),
    })
    t0 = time.monotonic()
    with open(log_path, "wb") as err, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=out_dir,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        with _LIVE_LOCK:
            _LIVE.add(proc.pid)
        try:
            killed, peak = _watch(proc, task, t0)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc.pid)
        out.seek(0)
        stdout = out.read().decode("utf-8", "replace")
    stderr = log_path.read_text("utf-8", "replace")
    code = proc.returncode
    result.update(exit_code=code, wall_s=round(time.monotonic() - t0, 3), peak_rss_mb=round(peak / 2**20, 1),
                  finished=time.time())
    if killed == "timeout":
        result.update(status="timeout", error=f"killed after {task.timeout:g} s (the timeout)")
    elif killed == "memory":
        result.update(status="memory", error=f"killed at {task.rss_limit / 2**20:,.0f} MB resident (over the memory limit)")
    elif code < 0:
        result.update(status="crash", error=f"the worker died of signal {-code} ({_signal_name(-code)})")
    elif code == 0:
        result["status"] = "ok"
    elif code == 1 and _last_error(stderr).startswith("graphpass:"):
        result.update(status="verify-failed", error=_last_error(stderr))
    elif code == 2:
        err = _last_error(stderr)
        memory = "max-memory" in err or "memory budget" in err or "out of memory" in err
        result.update(status="memory" if memory else "bad-input", error=err)
    else:
        result.update(status="internal-error", error=_last_error(stderr) or f"exit {code}")
    if task.verb == "optimize" and report is not None and report.is_file():
        _from_report(result, report)
        if code == 0 and output is not None:
            result["output"] = str(output)
    elif task.verb == "evaluate" and stdout.strip():
        _from_evaluate(result, stdout)
    return result


#: worker pids alive now (their process groups are killed when the batch is interrupted)
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _watch(proc: subprocess.Popen, task: Task, t0: float) -> tuple[str | None, int]:
    """Wait for the worker, killing it (and its process group) past the task's time or resident
    memory limit. Returns (why it was killed or None, its peak RSS in bytes)."""
    killed = None
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            peak = max(peak, usage.ru_maxrss * 1024)  # Linux: KiB
            proc.returncode = os.waitstatus_to_exitcode(status)
            return killed, peak
        elapsed = time.monotonic() - t0
        rss = _rss(proc.pid)
        peak = max(peak, rss)
        if killed is None:
            if task.timeout is not None and elapsed > task.timeout:
                killed = "timeout"
            elif task.rss_limit is not None and rss > task.rss_limit:
                killed = "memory"
            if killed is not None:
                _kill_group(proc.pid)
        time.sleep(0.05 if elapsed < 2 else 0.2)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_workers() -> None:
    """Kill every worker still running (the batch was interrupted)."""
    with _LIVE_LOCK:
        pids = list(_LIVE)
    for pid in pids:
        _kill_group(pid)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return "unknown"


def _from_report(result: dict[str, Any], path: Path) -> None:
    try:
        rep = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return
    nodes = rep.get("nodes") or {}
    cost = rep.get("estimated_cost_us") or {}
    result.update(nodes_before=nodes.get("before"), nodes_after=nodes.get("after"), target=rep.get("target"),
                  cost_before_us=cost.get("before"), cost_after_us=cost.get("after"))
    layout = rep.get("layout") or {}
    after = layout.get("after") if isinstance(layout, dict) else None
    ops = rep.get("ops") or {}
    after_ops = ops.get("after", ops) if isinstance(ops, dict) else {}
    transdata = after.get("count") if isinstance(after, dict) else None
    if transdata is None and isinstance(after_ops, dict):
        transdata = sum(v for k, v in after_ops.items() if k.endswith("TransData") and isinstance(v, int))
    result["transdata"] = transdata
    placed = [p.get("stats") or {} for p in rep.get("passes") or () if p.get("name") == "place_and_sink"]
    if placed and "AICPU" in placed[-1]:
        result["aicpu_ops"] = placed[-1]["AICPU"]
    verified = [n for n in rep.get("notes") or () if n.startswith("verified") or "verif" in n.split(":")[0]]
    if verified:
        result["verify"] = verified[-1][:300]


def _from_evaluate(result: dict[str, Any], stdout: str) -> None:
    try:
        rows = json.loads(stdout)
    except ValueError:
        return
    if not rows:
        return
    r = rows[0]
    result.update(nodes_before=r.get("nodes_before"), nodes_after=r.get("nodes_after"), target=r.get("target"),
                  cost_before_us=r.get("cost_before_us"), cost_after_us=r.get("cost_after_us"))
    if r.get("status") != "ok" and not result.get("error"):
        result["error"] = r.get("error")


def plan(specs: Sequence[str | os.PathLike], verb: str, options: dict[str, Any], out_dir: Path, *,
         timeout: float | None = None, max_memory: int | None = None) -> list[Task]:
    """The tasks of a batch (inputs expanded, hashed; options checked)."""
    if verb not in VERBS:
        raise UsageError(f"unknown verb '{verb}' (known: {', '.join(VERBS)})")
    if timeout is not None and timeout <= 0:
        raise UsageError(f"the timeout must be positive, got {timeout}")
    from graphpass.cost_model.target import DEFAULT_TARGET

    options = dict(options)
    if options.get("target") == DEFAULT_TARGET:  # the default, said or not: one options hash
        options.pop("target")
    if max_memory is not None:
        options["max_memory"] = int(max_memory)
    options_argv(options, verb)  # refuses unknown options before any model runs
    canon = canonical_options(options)
    ohash = hashlib.sha256(canon.encode()).hexdigest()[:16]
    rss_limit = None
    if options.get("max_memory"):
        m = int(options["max_memory"])
        rss_limit = max(2 * m, m + _RSS_SLACK)
    tasks = []
    inside = out_dir.resolve()
    for name, path in expand_models(specs):
        if inside in path.resolve().parents:  # an output folder inside an input folder: not an input
            continue
        tasks.append(Task(model=name, path=path, out_rel=name, verb=verb, options=options, input_hash=input_hash(path),
                          options_json=canon, options_hash=ohash, timeout=timeout, rss_limit=rss_limit,
                          out_dir=out_dir))
    return tasks


def run(specs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *, verb: str = "optimize",
        options: dict[str, Any] | None = None, jobs: int | None = None, timeout: float | None = None,
        max_memory: int | None = None, force: bool = False, backend: str = "local",
        ray_address: str | None = None, on_progress: Callable[[dict[str, Any]], None] | None = None
        ) -> Iterator[dict[str, Any]]:
    """Run ``verb`` over every model ``specs`` name, yielding each model's result row as it
    finishes (skipped ones first, with ``skipped=True``); results go to the SQLite file in
    ``out_dir`` (see :mod:`graphpass.zoo`)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output folder '{out}' is a file")
    tasks = plan(specs, verb, dict(options or {}), out, timeout=timeout, max_memory=max_memory)
    jobs = max(1, int(jobs or os.cpu_count() or 1))
    if backend not in ("local", "ray"):
        raise UsageError(f"unknown backend '{backend}' (known: local, ray)")
    out.mkdir(parents=True, exist_ok=True)
    with Store(out) as store:
        todo = []
        for t in tasks:
            done = None if force else store.finished(t.verb, t.model, t.input_hash, t.options_hash)
            if done is not None:
                yield {**done, "skipped": True}
            else:
                todo.append(t)
        state = {"total": len(tasks), "done": len(tasks) - len(todo), "failed": 0, "running": {}}
        if backend == "ray":
            from graphpass.zoo.ray_backend import run_on_ray

            finished = run_on_ray(todo, jobs, ray_address, state)
        else:
            finished = _run_local(todo, jobs, state, on_progress)
        try:
            for r in finished:
                store.add(r)
                state["done"] += 1
                state["failed"] += r["status"] != "ok"
                if on_progress is not None:
                    on_progress(state)
                yield r
        finally:  # interrupted (Ctrl-C, the caller stopped reading): no worker outlives the batch
            kill_workers()
            close = getattr(finished, "close", None)
            if close is not None:
                close()


def _run_local(todo: list[Task], jobs: int, state: dict[str, Any], on_progress) -> Iterator[dict[str, Any]]:
    lock = threading.Lock()

    def one(t: Task) -> dict[str, Any]:
        with lock:
            state["running"][t.model] = time.monotonic()
        if on_progress is not None:
            on_progress(state)
        try:
            return run_task(t)
        finally:
            with lock:
                state["running"].pop(t.model, None)

    if not todo:
        return
    pool = cf.ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(one, t) for t in todo]
    try:
        for f in cf.as_completed(futures):
            yield f.result()
    finally:  # interrupted: the workers first (the threads wait for them), then the threads
        for f in futures:
            f.cancel()
        kill_workers()
        pool.shutdown(wait=True, cancel_futures=True)
