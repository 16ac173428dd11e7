"""Mutation testing of the pass bodies: does each pass's own test file notice a broken rewrite?

    python benchmarks/mutation.py --jobs 2                      # every pass (about 2 h on 2 cores)
    python benchmarks/mutation.py --passes merge_transposes fold_pad --timeout 120
    python benchmarks/mutation.py --passes fuse_gelu --max-mutants 40 --list
    python benchmarks/mutation.py --passes fold_constants --lines 193 315     # re-check survivors
    python benchmarks/mutation.py --files passes/framework/rewrite.py=tests/graphpass/test_rewrite.py

Our own equivalent of mutmut. For each pass ``passes/**/<name>.py``, every function body is
parsed and mutated one site at a time:

  compare   flip a comparison (== / !=, < / >=, > / <=, in / not in, is / is not)
  constant  replace an integer constant 0 by 1 and 1 by 0, True by False and back
  negate    negate the condition of an ``if``/``while``/conditional expression
  guard     drop a ``return MatchResult.fail(...)`` guard (the check goes on as if it passed)
  boolop    swap ``and`` / ``or``

Each mutant is written into a shadow copy of the package (a temp folder put first on
``sys.path``, so the worktree and any process using it are never touched), and the pass's test
file ``tests/passes/test_<name>.py`` runs against it with ``pytest -x`` and a timeout: a failing or
timed-out run kills the mutant; a passing run means it survived. Prints, per pass, mutants,
killed, survived, and each survivor with its line and the mutation.

What keeps it cheap (about 3x the mutants a minute of one fresh pytest of the file per mutant):

  * one clean run per pass, under a line tracer, records which lines of the pass each test
    executes and how long it takes; it must pass, or the pass is skipped;
  * each mutant then runs only the tests that execute the mutated statement (in file order,
    ``-x``): a test that never reaches the statement behaves exactly as on the original (these
    tests are deterministic and run in-process; mutations live in function bodies only, and a
    default value or decorator of a top-level ``def``, run at import, gets the whole file).
    A site no test executes survives without a run and is reported as such;
  * mutants run in forks of one process that has already imported the third-party modules
    the clean run loaded (onnx, onnxruntime, numpy, pytest, hypothesis...), never graphpass:
    the child imports graphpass from the mutated shadow copy; the mutated module's cached
    bytecode is deleted before each fork;
  * ``--jobs 2`` runs two mutants at once, each in its own shadow copy.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FLIP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE,
         ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _is_fail_guard(node: ast.AST) -> bool:
    """``return MatchResult.fail(...)``."""
    return (isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "fail"
            and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "MatchResult")


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def sites(tree: ast.Module) -> list[tuple[int, str, int]]:
    """Every mutation site inside a function body: (walk index, kind, line)."""
    out = []
    in_function = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                in_function.add(id(n))
    docs = _docstring_ids(tree)
    for i, n in enumerate(ast.walk(tree)):
        if id(n) not in in_function or id(n) in docs:
            continue
        line = getattr(n, "lineno", 0)
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _FLIP:
            out.append((i, "compare", line))
        elif isinstance(n, ast.Constant) and type(n.value) in (int, bool) and n.value in (0, 1):
            out.append((i, "constant", line))
        elif isinstance(n, (ast.If, ast.While, ast.IfExp)):
            out.append((i, "negate", line))
        elif _is_fail_guard(n):
            out.append((i, "guard", line))
        elif isinstance(n, ast.BoolOp):
            out.append((i, "boolop", line))
    return out


def mutate(tree: ast.Module, index: int, kind: str) -> tuple[str, str]:
    """The mutated source and a one-line description of the mutation."""
    t = copy.deepcopy(tree)
    node = list(ast.walk(t))[index]
    before = ast.unparse(node).splitlines()[0][:70]
    if kind == "compare":
        node.ops[0] = _FLIP[type(node.ops[0])]()
    elif kind == "constant":
        node.value = (not node.value) if isinstance(node.value, bool) else 1 - node.value
    elif kind == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif kind == "guard":
        for parent in ast.walk(t):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(parent, field, None)
                if isinstance(block, list) and node in block:
                    block[block.index(node)] = ast.Pass()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    after = "(guard dropped)" if kind == "guard" else ast.unparse(node).splitlines()[0][:70]
    ast.fix_missing_locations(t)
    return ast.unparse(t), f"{before}  ->  {after}"


def pass_files(names: list[str] | None) -> dict[str, Path]:
    found = {p.stem: p for p in sorted((ROOT / "passes").rglob("*.py")) if not p.stem.startswith("_")}
    found = {k: v for k, v in found.items() if (ROOT / "tests" / "passes" / f"test_{k}.py").exists()}
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise SystemExit(f"no pass file with a test file for: {', '.join(missing)}")
        return {n: found[n] for n in names}
    return found


def other_files(specs: list[str]) -> dict[str, tuple[Path, str]]:
    """``--files SOURCE=TEST``: any module of graphpass, passes or cost_model, with its test file."""
    out = {}
    for spec in specs:
        source, sep, test = spec.partition("=")
        path = (ROOT / source).resolve()
        if not sep or not path.is_file() or not (ROOT / test).is_file():
            raise SystemExit(f"--files wants SOURCE=TEST, two existing files under {ROOT}: {spec!r}")
        out[path.stem] = (path, test)
    return out


def _installed(path: Path) -> Path:
    """Where ``path`` of the worktree lies in the shadow copy's installed layout (under src/)."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("passes", "cost_model"):
        return Path("graphpass") / rel
    if rel.parts[0] == "graphpass":
        return rel
    raise SystemExit(f"{rel} is not in graphpass/, passes/ or cost_model/")


def shadow_copy(tmp: Path) -> Path:
    """graphpass, graphpass.passes and graphpass.cost_model laid out as installed, plus tests."""
    src = tmp / "src"
    shutil.copytree(ROOT / "graphpass", src / "graphpass", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "passes", src / "graphpass" / "passes", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "cost_model", src / "graphpass" / "cost_model", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tmp / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT / "examples").exists():
        shutil.copytree(ROOT / "examples", tmp / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return src


class _LineTracer:
    """pytest plugin (coverage run): which lines of one file each test executes, and its time."""

    def __init__(self, filename: str):
        self.files = {filename, os.path.realpath(filename)}
        self.lines: dict[str, list[int]] = {}
        self.seconds: dict[str, float] = {}
        self._current: set[int] = set()

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename in self.files else None

    def _local(self, frame, event, arg):
        if event == "line":
            self._current.add(frame.f_lineno)
        return self._local

    def pytest_runtest_protocol(self, item, nextitem):  # a hookwrapper, see _as_plugin
        self._current = set()
        t0 = time.perf_counter()
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(None)
            self.seconds[item.nodeid] = time.perf_counter() - t0
            self.lines[item.nodeid] = sorted(self._current)


def _as_plugin(tracer: _LineTracer):
    import pytest

    class Plugin:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            yield from tracer.pytest_runtest_protocol(item, nextitem)

    return Plugin()


def preimport(modules: list[str]) -> int:
    """Import here the third-party modules a clean run loaded (never graphpass nor the tests).

    Each mutant runs in a fork of this process: the child imports graphpass afresh from the
    shadow copy (so the mutated module and everything that imported it are the mutant's), and
    only onnx, onnxruntime, numpy, pytest and the like are shared, already loaded.
    """
    n = 0
    for mod in modules:
        if mod.split(".")[0] in ("graphpass", "tests", "conftest", "__main__") or mod in sys.modules:
            continue
        try:
            importlib.import_module(mod)
            n += 1
        except Exception:  # a module that cannot be imported on its own: the child imports it
            pass
    return n


def _fork_pytest(tmp: Path, src: Path, args: list[str], log: Path, plugin=None, result: Path | None = None) -> int:
    """Fork a child that runs pytest on ``args`` against the shadow copy ``src``; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.pycache_prefix = str(tmp / "pycache")
        sys.path.insert(0, str(src))
        os.chdir(tmp)
        import pytest

        code = int(pytest.main(["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
                               plugins=[_as_plugin(plugin)] if plugin else []))
        import graphpass  # the child must have run the shadow copy, never the worktree

        if not graphpass.__file__.startswith(str(src)):
            code = 71
        if result is not None and plugin is not None:
            result.write_text(json.dumps({"lines": plugin.lines, "seconds": plugin.seconds,
                                          "modules": sorted(sys.modules)}))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> tuple[bool, float]:
    """(passed, seconds) of a child; past the timeout it is killed and counts as failed."""
    t0 = time.perf_counter()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0, time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False, time.perf_counter() - t0
        time.sleep(0.05)


def _statement_ranges(tree: ast.Module) -> dict[int, tuple[int, int] | None]:
    """For every node: the line range of the innermost statement holding it; None when that
    statement is a module- or class-level ``def``/``class`` (a default value or decorator, run at
    import time, before any test)."""
    out: dict[int, tuple[int, int] | None] = {}

    def visit(node, current, top):
        if isinstance(node, ast.stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top:
                current = None
            else:
                current = (node.lineno, node.end_lineno or node.lineno)
        out[id(node)] = current
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and child in node.body:
                visit(child, current, False)
            elif isinstance(node, (ast.Module, ast.ClassDef)):
                visit(child, current, True)
            else:
                visit(child, current, top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, None, True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", nargs="+", help="pass names (default: every pass with a test file)")
    ap.add_argument("--files", nargs="+", default=[], metavar="SOURCE=TEST",
                    help="also mutate these modules (e.g. passes/framework/rewrite.py), each against its test file")
    ap.add_argument("--timeout", type=float, default=0,
                    help="seconds per mutant (default: 4x the selected tests' clean time + 30)")
    ap.add_argument("--max-mutants", type=int, default=0, help="at most this many mutants per pass (evenly spread)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (each in its own shadow copy)")
    ap.add_argument("--sample-offset", type=float, default=0.0,
                    help="with --max-mutants: where in each stride to take the site (0 <= f < 1; another f, other sites)")
    ap.add_argument("--kinds", nargs="+", default=["compare", "constant", "negate", "guard", "boolop"])
    ap.add_argument("--list", action="store_true", help="only list the mutation sites")
    ap.add_argument("--lines", type=int, nargs="+", help="only the sites on these lines (one pass: re-check survivors)")
    ap.add_argument("--progress", type=int, default=0, help="print a progress line every N mutants")
    args = ap.parse_args(argv)
    files = {k: (v, f"tests/passes/test_{k}.py") for k, v in
             (pass_files(args.passes) if args.passes or not args.files else {}).items()}
    files.update(other_files(args.files))
    t_all = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphpass-mutation-") as tmpdir:
        slots = [Path(tmpdir) / f"w{k}" for k in range(max(1, args.jobs))]
        srcs = [shadow_copy(t) for t in slots]
        for name, (path, test_rel) in files.items():
            rel = path.relative_to(ROOT)
            targets = [s / _installed(path) for s in srcs]
            original = path.read_text()
            tree = ast.parse(original)
            found = [s for s in sites(tree) if s[1] in args.kinds and (not args.lines or s[2] in args.lines)]
            n_all = len(found)
            if args.max_mutants and len(found) > args.max_mutants:
                step = len(found) / args.max_mutants
                found = [found[int((i + args.sample_offset) * step)] for i in range(args.max_mutants)]
            if args.list:
                for i, kind, line in found:
                    print(f"{rel}:{line}: {kind}: {mutate(tree, i, kind)[1]}")
                continue
            # 1. clean run under the line tracer: must pass; gives each test's lines and time
            tracer = _LineTracer(str(targets[0]))
            cov = slots[0] / "coverage.json"
            t0 = time.perf_counter()
            ok, _ = _wait(_fork_pytest(slots[0], srcs[0], [test_rel], slots[0] / "clean.log", tracer, cov), 1800)
            clean_s = time.perf_counter() - t0
            if not ok or not cov.exists():
                print(f"{name}: its tests fail without any mutation; skipped (see the clean run's log)", flush=True)
                print((slots[0] / "clean.log").read_text()[-3000:], flush=True)
                rows.append((name, n_all, len(found), 0, 0, 0, [], "tests fail unmutated"))
                continue
            data = json.loads(cov.read_text())
            n_mod = preimport(data["modules"])
            clean_tail = (slots[0] / "clean.log").read_text().strip().splitlines()[-1]
            order = list(data["lines"])
            lines = {k: set(v) for k, v in data["lines"].items()}
            ranges = _statement_ranges(tree)
            nodes = list(ast.walk(tree))
            # 2. each mutant runs, with -x, only the tests that execute its statement
            jobs, survivors, killed, unreached = [], [], 0, 0
            for i, kind, line in found:
                r = ranges.get(id(nodes[i]))
                if r is None:
                    chosen = order
                else:
                    span = set(range(r[0], r[1] + 1))
                    chosen = [t for t in order if lines[t] & span]
                mutated, what = mutate(tree, i, kind)
                label = f"{rel}:{line}: {kind}: {what}"
                if not chosen:
                    unreached += 1
                    survivors.append(label + "  [no test executes this line]")
                    continue
                jobs.append((mutated, label, chosen, sum(data["seconds"][t] for t in chosen)))
            running: dict[int, tuple[int, str, float, float]] = {}
            free = list(range(len(slots)))
            t0 = time.perf_counter()
            while jobs or running:
                while jobs and free:
                    k = free.pop()
                    mutated, label, chosen, secs = jobs.pop(0)
                    targets[k].write_text(mutated)
                    for pyc in _pycs(slots[k], targets[k]):
                        pyc.unlink()
                    pid = _fork_pytest(slots[k], srcs[k], chosen, slots[k] / "mutant.log")
                    running[pid] = (k, label, time.perf_counter(), args.timeout or 4 * secs + 30)
                for pid, (k, label, started, limit) in list(running.items()):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if not done and time.perf_counter() - started > limit:
                        os.kill(pid, signal.SIGKILL)
                        done, status = os.waitpid(pid, 0)
                    if done:
                        del running[pid]
                        free.append(k)
                        targets[k].write_text(original)
                        for pyc in _pycs(slots[k], targets[k]):
                            pyc.unlink()
                        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                            survivors.append(label)
                            print(f"  .. survived: {label}", flush=True)
                        else:
                            killed += 1
                        if args.progress and (killed + len(survivors)) % args.progress == 0:
                            print(f"  {name}: {killed + len(survivors)} of {len(found)} done, "
                                  f"{time.perf_counter() - t0:.0f} s", flush=True)
                time.sleep(0.05)
            took = time.perf_counter() - t0
            n = len(found)
            rate = (n - unreached) / took * 60 if took else 0.0
            sample = f"{n} of {n_all} sites" if n < n_all else "all sites"
            rows.append((name, n_all, n, killed, n - killed, unreached, survivors, f"{took:.0f} s"))
            print(f"{name} ({sample}): {n} mutants, {killed} killed, {n - killed} survived "
                  f"({unreached} on lines no test executes); {took:.0f} s, {rate:.1f} mutants/min run; "
                  f"clean run {clean_s:.1f} s ({clean_tail}); {n_mod} modules pre-imported", flush=True)
            for s in sorted(survivors, key=lambda x: int(x.split(":")[1])):
                print(f"  survived: {s}", flush=True)
    if args.list:
        return 0
    print()
    print("| pass | sites | mutants | killed | survived | of which unexecuted | time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, n_all, n, k, s, u, _, note in rows:
        print(f"| {name} | {n_all} | {n} | {k} | {s} | {u} | {note} |")
    total, kills = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"\n{total} mutants, {kills} killed, {total - kills} survived in {time.perf_counter() - t_all:.0f} s")
    return 0


def _pycs(slot: Path, target: Path) -> list[Path]:
    """The cached bytecode of ``target`` under the slot's pycache prefix (stale once mutated)."""
    folder = Path(str(slot / "pycache") + str(target.parent))
    return list(folder.glob(f"{target.stem}.*.pyc")) if folder.exists() else []


if __name__ == "__main__":
    sys.exit(main())
