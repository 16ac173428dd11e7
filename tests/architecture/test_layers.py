"""Imports only run down: every import in graphpass/, passes/ and cost_model/ (those inside
functions and under TYPE_CHECKING included) is checked against the layer order written in
ARCHITECTURE.md (the table between the ``layers:begin``/``layers:end`` markers)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: source folder -> the package it is installed as
PACKAGES = {"graphpass": "graphpass", "passes": "graphpass.passes", "cost_model": "graphpass.cost_model"}


#: upward imports being removed by work in flight (must end empty)
KNOWN = {
}


def layer_table() -> list[tuple[int, str, list[str]]]:
    """(rank, layer name, module prefixes) from ARCHITECTURE.md, bottom layer first."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- layers:begin -->")[1].split("<!-- layers:end -->")[0]
    rows = []
    for line in block.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|\s*([\w -]+?)\s*\|\s*([^|]+)\|", line)
        if m:
            mods = [s.strip().strip("`") for s in m.group(3).split(",") if s.strip()]
            rows.append((int(m.group(1)), m.group(2), mods))
    return rows


def layer_of(module: str, table) -> tuple[int, str] | None:
    best = None
    for rank, name, prefixes in table:
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[0]:
                    best = (len(p), rank, name)
    return None if best is None else (best[1], best[2])


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    pkg = PACKAGES[rel.parts[0]]
    parts = [pkg, *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py", str(path))


def imports_of(source: str, me: str, is_package: bool, filename: str = "<source>") -> list[tuple[int, str]]:
    """The graphpass modules ``source`` (the text of module ``me``) imports: ``import x``,
    ``from x import y``, relative imports (resolved against ``me``'s package) and
    ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name."""
    tree = ast.parse(source, filename)
    package = me if is_package else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: `from ..check import verify` inside graphpass.passes.framework
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module:
                # `from graphpass import verify` names a module; `from graphpass.x import f` a name
                out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return [(line, m) for line, m in out if m == "graphpass" or m.startswith("graphpass.")]


def sources() -> list[Path]:
    return sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py"))


def resolve(name: str, table) -> str:
    """`graphpass.ir.graph.count_nodes` -> the longest prefix that is a module we know a layer of."""
    while name and layer_of(name, table) is None and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_the_table_is_written_and_covers_every_module():
    table = layer_table()
    assert [r for r, _, _ in table] == sorted(r for r, _, _ in table) and len(table) >= 6
    missing = [module_name(p) for p in sources() if layer_of(module_name(p), table) is None]
    assert not missing, f"modules with no layer in ARCHITECTURE.md: {missing}"


def test_imports_only_run_down():
    table = layer_table()
    bad = []
    for path in sources():
        me = module_name(path)
        mine = layer_of(me, table)
        for line, target in imports(path):
            target = resolve(target, table)
            theirs = layer_of(target, table)
            if theirs is None or theirs[0] <= mine[0]:
                continue
            if any(me == a and (target == b or target.startswith(b + ".")) for a, b in KNOWN):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: {me} ({mine[1]}) imports {target} ({theirs[1]})")
    assert not bad, "imports that run up a layer:\n" + "\n".join(bad)


@pytest.mark.parametrize("old,new", [("graphpass.infra.pass_base", "graphpass.passes.framework.pass_base"),
                                     ("graphpass.verify", "graphpass.check.verify"),
                                     ("graphpass.pipelines", "graphpass.passes.pipelines")])
def test_old_import_paths_still_work(old, new):
    import importlib

    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize("source", [
    "from graphpass.api import optimize",
    "from graphpass import api",
    "import graphpass.api",
    "def f():\n    from graphpass.api import optimize",
    "from ... import api",  # relative, from graphpass.passes.framework.manager
    "from ...check import verify\nfrom ... import cli",
    "import importlib\nimportlib.import_module('graphpass.cli')",
    "from importlib import import_module\nimport_module('graphpass.diff')",
    "__import__('graphpass.api')",
])
def test_the_import_walk_is_not_fooled(source):
    # every form of import a module of the passes layer could use to reach the roof or the diff layer
    table = layer_table()
    found = [resolve(m, table) for _, m in imports_of(source, "graphpass.passes.framework.manager", False)]
    assert any(layer_of(m, table)[0] > layer_of("graphpass.passes", table)[0] for m in found), found


def test_relative_imports_resolve_against_the_package():
    got = [m for _, m in imports_of("from . import pass_base\nfrom ..pipelines import build",
                                    "graphpass.passes.framework", True)]
    assert got == ["graphpass.passes.framework.pass_base", "graphpass.passes.pipelines.build"]
