"""Every package of the source tree is in pyproject's package list: an editable install (the
test suite's) finds any folder, a plain `pip install .` (the README's first command) only the
listed ones; graphpass.atc was missing once and `graphpass optimize` failed with exit 3."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for name, folder in cfg["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            pkg = ".".join((name, *rel.parts)) if rel.parts else name
            if any(pkg == n or pkg.startswith(n + ".") for n in cfg["package-dir"] if n != name and n.startswith(name + ".")):
                continue  # mapped under its own name (graphpass.passes lives in passes/)
            found.add(pkg)
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages without a folder: {sorted(listed - found)}"
