"""Mutation testing of the pass bodies: does each pass's own test file notice a broken rewrite?

    python benchmarks/mutation.py                               # every pass (slow: hours on 2 cores)
    python benchmarks/mutation.py --passes merge_transposes fold_pad --timeout 120
    python benchmarks/mutation.py --passes fuse_gelu --max-mutants 40 --list

Our own equivalent of mutmut. For each pass ``passes/**/<name>.py``, every function body is
parsed and mutated one site at a time:

  compare   flip a comparison (== / !=, < / >=, > / <=, in / not in, is / is not)
  constant  replace an integer constant 0 by 1 and 1 by 0, True by False and back
  negate    negate the condition of an ``if``/``while``/conditional expression
  guard     drop a ``return MatchResult.fail(...)`` guard (the check goes on as if it passed)
  boolop    swap ``and`` / ``or``

Each mutant is written into a shadow copy of the package (a temp folder put first on
PYTHONPATH, so the worktree and any process using it are never touched), and the pass's test file
``tests/passes/test_<name>.py`` runs against it with a timeout (``pytest -x``): a failing or
timed-out run kills the mutant; a passing run means it survived. Prints, per pass, mutants,
killed, survived, and each survivor with its line and the mutation.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
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


def run_tests(tmp: Path, test: Path, timeout: float) -> tuple[bool, float]:
    """(passed, seconds) of the test file against the shadow copy; a timeout counts as failed."""
    env = {**os.environ, "PYTHONPATH": str(tmp / "src"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                               str(test)], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode == 0, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", nargs="+", help="pass names (default: every pass with a test file)")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per mutant (default: 3x the clean run + 30)")
    ap.add_argument("--max-mutants", type=int, default=0, help="at most this many mutants per pass (evenly spread)")
    ap.add_argument("--kinds", nargs="+", default=["compare", "constant", "negate", "guard", "boolop"])
    ap.add_argument("--list", action="store_true", help="only list the mutation sites")
    args = ap.parse_args(argv)
    files = pass_files(args.passes)
    t_all = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphpass-mutation-") as tmpdir:
        tmp = Path(tmpdir)
        src = shadow_copy(tmp)
        for name, path in files.items():
            rel = path.relative_to(ROOT / "passes")
            target = src / "graphpass" / "passes" / rel
            original = path.read_text()
            tree = ast.parse(original)
            found = [s for s in sites(tree) if s[1] in args.kinds]
            if args.max_mutants and len(found) > args.max_mutants:
                step = len(found) / args.max_mutants
                found = [found[int(i * step)] for i in range(args.max_mutants)]
            if args.list:
                for i, kind, line in found:
                    print(f"{rel}:{line}: {kind}: {mutate(tree, i, kind)[1]}")
                continue
            test = tmp / "tests" / "passes" / f"test_{name}.py"
            clean_ok, clean_s = run_tests(tmp, test, timeout=900)
            if not clean_ok:
                print(f"{name}: its tests fail without any mutation; skipped", flush=True)
                rows.append((name, len(found), 0, 0, [], "tests fail unmutated"))
                continue
            timeout = args.timeout or 3 * clean_s + 30
            killed, survivors = 0, []
            t0 = time.perf_counter()
            for i, kind, line in found:
                mutated, what = mutate(tree, i, kind)
                target.write_text(mutated)
                try:
                    passed, _ = run_tests(tmp, test, timeout)
                finally:
                    target.write_text(original)
                if passed:
                    survivors.append(f"passes/{rel}:{line}: {kind}: {what}")
                else:
                    killed += 1
            rows.append((name, len(found), killed, len(found) - killed, survivors, f"{time.perf_counter() - t0:.0f} s"))
            print(f"{name}: {len(found)} mutants, {killed} killed, {len(found) - killed} survived "
                  f"({time.perf_counter() - t0:.0f} s; clean run {clean_s:.1f} s)", flush=True)
            for s in survivors:
                print(f"  survived: {s}", flush=True)
    if args.list:
        return 0
    print()
    print("| pass | mutants | killed | survived | time |")
    print("|---|---:|---:|---:|---:|")
    for name, n, k, s, _, note in rows:
        print(f"| {name} | {n} | {k} | {s} | {note} |")
    total, kills = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"\n{total} mutants, {kills} killed, {total - kills} survived in {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
