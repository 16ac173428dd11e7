"""The pass registry: every pass registers itself by its stable snake_case name."""

from __future__ import annotations

import re
from typing import Iterable

from graphpass.errors import UsageError
from graphpass.passes.framework.pass_base import Pass

__all__ = ["register", "unregister", "get_pass", "all_passes", "resolve"]

_REGISTRY: dict[str, type[Pass]] = {}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add ``cls`` to the registry under ``cls.name``."""
    for attr in ("name", "summary", "kind"):
        if not hasattr(cls, attr):
            raise TypeError(f"pass class {cls.__name__} has no '{attr}'")
    if not _NAME.match(cls.name):
        raise TypeError(f"pass name '{cls.name}' is not snake_case")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"pass name '{cls.name}' is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a pass from the registry (for plugins and tests that register their own)."""
    _REGISTRY.pop(name, None)


def _ensure_loaded() -> None:
    import graphpass.passes  # noqa: F401  (registers every built-in pass)


def all_passes() -> dict[str, type[Pass]]:
    _ensure_loaded()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> type[Pass]:
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown pass '{name}'; known passes: {', '.join(sorted(_REGISTRY))}") from None


def resolve(names: Iterable[str]) -> list[type[Pass]]:
    return [get_pass(n) for n in names]
