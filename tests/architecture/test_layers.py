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
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from graphpass import verify` names a module; `from graphpass.x import f` a name
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
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
