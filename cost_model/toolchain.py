"""The Ascend toolchain's vocabulary, shared by every target: precision modes and UB fusion names.

Both live in data files (``data/precision_modes.toml``, ``data/ub_fusion.toml``), each entry
with its source; a missing or mistyped field fails loading with the file, the key and what was
expected (a :class:`graphpass.UsageError`). Read them through :class:`graphpass.Target`
(``target.precision_modes``, ``target.ub_fusion``); the loaders here are the one place that
parses them.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path
from typing import Any

from graphpass.errors import UsageError

__all__ = ["PrecisionMode", "load_precision_modes", "load_ub_fusion", "PRECISION_MODES_FILE", "UB_FUSION_FILE"]

_DATA = Path(__file__).resolve().parent / "data"
PRECISION_MODES_FILE = _DATA / "precision_modes.toml"
UB_FUSION_FILE = _DATA / "ub_fusion.toml"
_TAGS = {"P", "D", "T", "E"}


@dataclasses.dataclass(frozen=True)
class PrecisionMode:
    """One ATC precision mode and what graphpass does with it."""

    name: str
    summary: str
    src: str
    tag: str
    #: the mixed_precision pass implements it
    mixed_precision: bool
    #: some float compute runs in fp16 under it
    lowers: bool
    #: the low-precision type the mode converts to (bfloat16 for the *_bf16 modes)
    low: str = "float16"
    #: the targets that have the mode's low type (empty: every target)
    targets: tuple[str, ...] = ()


def _bad(path: Path, key: str, expected: str, got: Any = None) -> UsageError:
    tail = "" if got is None else f", got {got!r}"
    return UsageError(f"{path.name}: key '{key}': expected {expected}{tail}")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path.name}: not valid TOML: {e}") from e
    if not data:
        raise UsageError(f"{path.name}: no entries")
    return data


def _source(path: Path, key: str, entry: Any) -> tuple[str, str]:
    if not isinstance(entry, dict):
        raise _bad(path, key, "a table with src and tag")
    if not isinstance(entry.get("src"), str) or not entry["src"]:
        raise _bad(path, f"{key}.src", "a non-empty string", entry.get("src"))
    if entry.get("tag") not in _TAGS:
        raise _bad(path, f"{key}.tag", "one of P, D, T, E", entry.get("tag"))
    return entry["src"], entry["tag"]


@functools.lru_cache(maxsize=4)
def load_precision_modes(path: str | Path | None = None) -> tuple[PrecisionMode, ...]:
    """The precision modes of ``data/precision_modes.toml`` (or ``path``), in file order."""
    p = Path(path) if path else PRECISION_MODES_FILE
    modes = []
    for name, entry in _read(p).items():
        src, tag = _source(p, name, entry)
        if not isinstance(entry.get("summary"), str) or not entry["summary"]:
            raise _bad(p, f"{name}.summary", "a non-empty string", entry.get("summary"))
        for k in ("mixed_precision", "lowers"):
            if not isinstance(entry.get(k), bool):
                raise _bad(p, f"{name}.{k}", "true or false", entry.get(k))
        unknown = set(entry) - {"summary", "src", "tag", "mixed_precision", "lowers", "low", "targets"}
        if unknown:
            raise _bad(p, f"{name}.{sorted(unknown)[0]}", "no such field (typo?)")
        low = entry.get("low", "float16")
        if low not in ("float16", "bfloat16"):
            raise _bad(p, f"{name}.low", "float16 or bfloat16", low)
        targets = entry.get("targets", [])
        if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
            raise _bad(p, f"{name}.targets", "a list of target names", targets)
        modes.append(PrecisionMode(name, entry["summary"], src, tag, entry["mixed_precision"], entry["lowers"], low,
                                   tuple(targets)))
    return tuple(modes)


@functools.lru_cache(maxsize=4)
def load_ub_fusion(path: str | Path | None = None) -> frozenset[str]:
    """The Ascend pass names of ``data/ub_fusion.toml`` (or ``path``): ATC's UB fusions."""
    p = Path(path) if path else UB_FUSION_FILE
    names = []
    for name, entry in _read(p).items():
        _source(p, name, entry)
        unknown = set(entry) - {"src", "tag", "note"}
        if unknown:
            raise _bad(p, f"{name}.{sorted(unknown)[0]}", "no such field (typo?)")
        names.append(name)
    return frozenset(names)
