"""Runs hostile cases, each in its own forked child under an address-space limit and a timeout.

The timeout is 10 s of CPU time (RLIMIT_CPU), so a loaded CI machine does not fail a case,
and 20 s of wall time for a run blocked on a read.

    python hostile_runner.py WORKDIR RESULTS.jsonl CASE_ID...

The runner imports graphpass once; each case is built in ``WORKDIR/<n>/``, then a child is
forked with ``RLIMIT_AS`` set, its stdout discarded and its stderr kept, and runs
``graphpass.cli.main(argv)`` in the case's folder. After an exit 0 of ``optimize`` the child
also checks the output (full ONNX checker; onnxruntime outputs equal the input's where the
input runs). The parent kills a child past the timeout, reads its peak RSS from ``wait4``
and lists the case folder before and after. One JSON line per case goes to RESULTS.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

ADDRESS_SPACE = 2 << 30  # bytes
TIMEOUT = 10  # CPU seconds for graphpass itself (RLIMIT_CPU: the machine's load does not count)
CHECK_TIMEOUT = 20  # further CPU seconds for checking an exit-0 output
WALL_TIMEOUT = 60.0  # wall seconds for graphpass itself (a run blocked on a read uses no CPU); the
# promise is the 10 s of CPU: on 2 loaded cores the 100k-output case took 6.7 s CPU in 20.1 s wall
CHECK_WALL_TIMEOUT = 60.0  # further wall seconds for the harness's own check of an exit-0 output


def listing(folder: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            out.append(os.path.relpath(os.path.join(root, n), folder))
    return sorted(out)


def input_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for n in files:
            p = os.path.join(root, n)
            if os.path.isfile(p) and not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def check_output(argv: list[str], compare: bool) -> str:
    """'ok', 'skip: why' (the input does not run in onnxruntime) or 'fail: why'."""
    import numpy as np
    import onnx

    from graphpass.check import verify as V
    from graphpass.cli import parse_input_shapes

    out = _option(argv, "-o")
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:  # noqa: BLE001
        return f"fail: the output does not pass the full ONNX checker: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if not compare:
        return "ok"
    shapes = parse_input_shapes([v for k, v in zip(argv, argv[1:]) if k == "--input-shape"])
    try:
        sa = V.session(argv[1])
        feeds = V.random_inputs(sa, seed=0, input_shapes=shapes)
        ref = V.run(sa, feeds)
    except BaseException as e:  # noqa: BLE001 - the input itself does not run: nothing to compare
        return f"skip: the input does not run in onnxruntime ({type(e).__name__})"
    try:
        got = V.run(V.session(out), feeds)
    except Exception as e:  # noqa: BLE001
        return f"fail: the input runs in onnxruntime, the output does not: {str(e).splitlines()[0]}"
    bad = [c for c in V.compare(ref, got) if not c.ok]
    if set(ref) != set(got):
        return f"fail: outputs {sorted(got)} != {sorted(ref)}"
    if bad:
        return f"fail: output '{bad[0].name}' differs (max abs {bad[0].max_abs:.3g}{', ' + bad[0].note if bad[0].note else ''})"
    del np
    return "ok"


def child(argv: list[str], compare: bool, folder: Path, err_path: Path, result_path: Path) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT + 1, TIMEOUT + CHECK_TIMEOUT + 2))
    os.chdir(folder)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(err, 2)
    os.dup2(null, 1)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    result = {}
    t0 = time.perf_counter()
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        from graphpass.cli import main

        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001 - escaped main: that is the bug to report
        traceback.print_exc()
        code = 99
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    result["code"] = code
    result["seconds"] = time.perf_counter() - t0
    result["cpu"] = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT + CHECK_TIMEOUT + 1, TIMEOUT + CHECK_TIMEOUT + 2))
    sys.stdout.flush()
    sys.stderr.flush()
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    if code == 0 and argv and argv[0] == "optimize":
        try:
            result["check"] = check_output(argv, compare)
        except BaseException as e:  # noqa: BLE001
            result["check"] = f"fail: checking raised {type(e).__name__}: {e}"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, result_path)
    os._exit(0)


def run_case(case, folder: Path, scratch: Path) -> dict:
    folder.mkdir(parents=True)
    try:
        argv = case.build(folder)
    except Exception as e:  # noqa: BLE001 - a broken case is reported, not fatal to the run
        return {"id": case.id, "build_error": f"{type(e).__name__}: {e}"}
    size = input_bytes(folder)
    before = listing(folder)
    err_path, result_path = scratch / "stderr", scratch / "result.json"
    result_path.unlink(missing_ok=True)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            child(argv, case.compare, folder, err_path, result_path)
        finally:
            os._exit(98)
    timed_out = None
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        elapsed = time.perf_counter() - start
        main_done = result_path.exists()
        if (not main_done and elapsed > WALL_TIMEOUT) or elapsed > WALL_TIMEOUT + CHECK_WALL_TIMEOUT:
            timed_out = "check" if main_done else "graphpass"
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if timed_out is None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        timed_out = "check" if result else "graphpass"
    return {
        "id": case.id,
        "argv": argv,
        "code": result.get("code"),
        "seconds": result.get("seconds", time.perf_counter() - start),
        "cpu": result.get("cpu", usage.ru_utime + usage.ru_stime),
        "check": result.get("check"),
        "timeout": timed_out,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "stderr": err_path.read_text(errors="replace")[-4000:] if err_path.exists() else "",
        "before": before,
        "after": listing(folder),
        "input_bytes": size,
        "maxrss": usage.ru_maxrss * 1024,
    }


def warm_up(folder: Path) -> None:
    """Import what ``graphpass optimize`` imports lazily, once, before the forks: one run on a
    tiny model (no onnxruntime session: its thread pools must not be created before a fork)."""
    import contextlib
    import io

    import onnx
    import onnxruntime  # noqa: F401
    from onnx import helper

    from graphpass.cli import main
    from graphpass.testing import make_model

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}), folder / "m.onnx")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["optimize", str(folder / "m.onnx"), "-o", str(folder / "o.onnx"), "--report", str(folder / "r.md")])
        main(["optimize", str(folder / "m.onnx"), "-o", str(folder / "o.onnx"), "--target", "none"])
        main(["inspect", str(folder / "m.onnx")])
    import logging

    logging.getLogger().handlers.clear()  # each child's main() sets up logging on its own stderr


def main(args: list[str]) -> int:
    workdir, results, ids = Path(args[0]), Path(args[1]), set(args[2:])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(Path(__file__).parent))
    import hostile_cases

    warm_up(workdir / "_warm")

    scratch = workdir / "_scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    with open(results, "w") as f:
        for n, case in enumerate(c for c in hostile_cases.CASES if c.id in ids):
            f.write(json.dumps(run_case(case, workdir / f"{n:04d}", scratch)) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
