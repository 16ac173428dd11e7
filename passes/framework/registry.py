"""The pass registry: every pass registers itself by its stable snake_case name.

Passes of a user's own join it three ways, all with the same API (``Pass`` or ``rule_pass``,
``register``): registered in a module imported before the run (the Python API), a module or
``.py`` file given to ``graphpass --plugin`` (:func:`load_plugin`), or a module named by an entry
point of the ``graphpass.passes`` group of an installed distribution (:func:`load_entry_points`,
loaded with the built-in passes). A registered pass that is ``default_enabled`` joins the default
pipeline at the position its ``runs_after`` / ``runs_before`` declare (``passes.pipelines.build``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import re
import sys
from pathlib import Path
from typing import Iterable

from graphpass.errors import UsageError
from graphpass.passes.framework.pass_base import Pass

__all__ = ["register", "unregister", "get_pass", "all_passes", "resolve", "unknown_pass", "load_plugin",
           "load_entry_points", "ENTRY_POINT_GROUP"]

log = logging.getLogger(__name__)

#: the entry-point group a distribution names its pass modules (or Pass classes) in
ENTRY_POINT_GROUP = "graphpass.passes"

_REGISTRY: dict[str, type[Pass]] = {}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_LOADED = False
#: the user code a run imported (plugin files or modules, entry points): it may leave work to the
#: interpreter's teardown (graphpass.cli.exit_now then takes the ordinary exit)
USER_CODE: list[str] = []


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add ``cls`` to the registry under ``cls.name``."""
    for attr in ("name", "summary", "kind"):
        if not hasattr(cls, attr):
            raise TypeError(f"pass class {cls.__name__} has no '{attr}'")
    if not _NAME.match(cls.name):
        raise TypeError(f"pass name '{cls.name}' is not snake_case")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        old = _REGISTRY[cls.name]
        # the same class defined again by reloading its module (a plugin file given twice) replaces it
        if (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"pass name '{cls.name}' is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a pass from the registry (for plugins and tests that register their own)."""
    _REGISTRY.pop(name, None)


def _ensure_loaded() -> None:
    global _LOADED
    import graphpass.passes  # noqa: F401  (registers every built-in pass)

    if not _LOADED:
        _LOADED = True
        load_entry_points()


def all_passes() -> dict[str, type[Pass]]:
    _ensure_loaded()
    return dict(sorted(_REGISTRY.items()))


def unknown_pass(name: str) -> UsageError:
    """The error for a pass name nobody registered: the closest one, if any is close, and the known ones."""
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1, cutoff=0.6)
    known = f"known passes: {', '.join(sorted(_REGISTRY))}"
    return UsageError(f"unknown pass '{name}'; " + (f"did you mean {close[0]}? ({known})" if close else known))


def get_pass(name: str) -> type[Pass]:
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise unknown_pass(name) from None


def resolve(names: Iterable[str]) -> list[type[Pass]]:
    return [get_pass(n) for n in names]


# ------------------------------------------------------------------------------------------
# plugins


def _register_found(obj, where: str) -> list[str]:
    """Register what a plugin module or entry point holds: a Pass class, a list of them, a
    module (its registered passes, and any ``Pass`` subclass it sets in ``PASSES``), or a
    function called without arguments that registers passes or returns any of these."""
    before = set(_REGISTRY)
    if callable(obj) and not isinstance(obj, type):
        obj = obj()
        if obj is None:
            return sorted(set(_REGISTRY) - before)
    items = getattr(obj, "PASSES", ()) if not isinstance(obj, (type, list, tuple)) else (
        [obj] if isinstance(obj, type) else obj)
    for cls in items:
        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            raise UsageError(f"{where}: {cls!r} is not a graphpass Pass class")
        if _REGISTRY.get(cls.name) is not cls:
            try:
                register(cls)
            except TypeError as e:
                raise UsageError(f"{where}: {e}") from None
    return sorted(set(_REGISTRY) - before)


def load_plugin(spec: str) -> list[str]:
    """Import a user's module (``my_passes``) or file (``./my_passes.py``) whose passes register
    themselves (``@register``, ``rule_pass(..., register=True)``) or are listed in ``PASSES``;
    the names it added. Anything wrong with it is a :class:`UsageError` (one line, exit 2)."""
    _ensure_loaded()
    path = Path(spec)
    before = set(_REGISTRY)
    USER_CODE.append(spec)
    try:
        if spec.endswith(".py") or path.is_file():
            if not path.is_file():
                raise UsageError(f"plugin '{spec}': no such file")
            name = f"graphpass_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            try:
                module = importlib.import_module(spec)
            except ModuleNotFoundError as e:
                if e.name and spec.startswith(e.name):
                    raise UsageError(f"plugin '{spec}': no module or .py file of that name") from None
                raise
        added = _register_found(module, f"plugin '{spec}'")
    except UsageError:
        raise
    except SyntaxError as e:
        raise UsageError(f"plugin '{spec}': {type(e).__name__}: {e.msg} (line {e.lineno})") from None
    except Exception as e:
        raise UsageError(f"plugin '{spec}' failed to load: {type(e).__name__}: {e}") from e
    return sorted(set(_REGISTRY) - before) or added


def load_entry_points() -> list[str]:
    """Load every entry point of the ``graphpass.passes`` group (a module, a Pass class or a list
    of them); the names they added. One that fails is logged as a warning and left out: an
    installed distribution's bug must not stop every run."""
    from importlib.metadata import entry_points

    added: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        before = set(_REGISTRY)
        USER_CODE.append(f"{ep.name} ({ep.value})")
        try:
            _register_found(ep.load(), f"entry point '{ep.name}' ({ep.value})")
        except Exception as e:  # noqa: BLE001
            log.warning("entry point '%s' (%s) of group %s not loaded: %s: %s", ep.name, ep.value,
                        ENTRY_POINT_GROUP, type(e).__name__, e)
            continue
        added += sorted(set(_REGISTRY) - before)
    return added
