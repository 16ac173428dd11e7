"""Old import paths, kept working for one release (0.2 moved these modules into their layers).

``graphpass.infra`` is now ``graphpass.passes.framework``; ``graphpass.verify``, ``precision``,
``fp16`` and ``runtime`` are in ``graphpass.check``; ``graphpass.pipelines`` and
``graphpass.fusion_switch`` are in ``graphpass.passes``. An import of an old name gets the very
module object of the new one (so ``mock.patch("graphpass.verify.x")`` patches the real module).
The aliases are resolved lazily by a finder put first on ``sys.meta_path`` when graphpass is
imported; nothing is imported before someone asks for it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "install"]

#: old module path -> new module path (a package's submodules follow their package)
MOVED = {
    "graphpass.infra": "graphpass.passes.framework",
    "graphpass.verify": "graphpass.check.verify",
    "graphpass.precision": "graphpass.check.precision",
    "graphpass.fp16": "graphpass.check.fp16",
    "graphpass.runtime": "graphpass.check.runtime",
    "graphpass.pipelines": "graphpass.passes.pipelines",
    "graphpass.fusion_switch": "graphpass.passes.fusion_switch",
}


def new_name(name: str) -> str | None:
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if new_name(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module(new_name(spec.name))

    def exec_module(self, module):  # the new module is already executed
        pass


_FINDER = _Alias()


def install() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
