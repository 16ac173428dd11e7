"""What every graphpass report has: a schema id, ``to_dict`` / ``to_json`` / ``to_markdown`` / ``to_table``.

The reports (``graphpass.report.OptimizeReport``, ``graphpass.cost_model.CostReport``,
``graphpass.diff.GraphDiff``, ``graphpass.verify.VerifyReport``, ``graphpass.precision.PrecisionReport``,
``graphpass.bisect.BisectResult``) derive from :class:`Report`: each sets ``SCHEMA``
(``"graphpass.<kind>/<version>"``, the ``schema`` key of its ``to_dict()``; a version changes only
when a key is removed or changes meaning) and writes ``to_dict``, ``to_markdown`` and ``to_table``;
``to_json`` is the same everywhere (:func:`to_json`). The CLI's ``--format json|markdown|table``
calls these.

A ground-floor module: the standard library, rich and ``graphpass.errors`` only, so a report at
any layer can use it.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any, ClassVar, Iterable, Protocol, Sequence, runtime_checkable

__all__ = ["Report", "ReportLike", "to_json", "finite", "text_console", "rich_table", "markdown_table", "FORMATS"]

#: The renderings every report has (``Report.render``).
FORMATS = ("json", "markdown", "table")


def finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float as the string ``"inf"``, ``"-inf"`` or ``"nan"``:
    standard JSON has no Infinity (``json.dumps`` would write it, and strict parsers refuse it)."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _default(value: Any) -> Any:
    """JSON for what json cannot write: numpy scalars as numbers (duck-typed: no numpy import
    here), sets as sorted lists, anything else as its ``str``."""
    if hasattr(value, "dtype") and hasattr(value, "item") and getattr(value, "shape", None) == ():
        v = value.item()
        return finite(v) if isinstance(v, float) else (v if isinstance(v, (int, bool, str)) else str(v))
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def to_json(data: Any) -> str:
    """The one JSON form of graphpass reports: 2-space indent, UTF-8 text (``ensure_ascii=False``),
    standard JSON (non-finite floats as strings, :func:`finite`), no trailing newline."""
    return json.dumps(finite(data), indent=2, ensure_ascii=False, default=_default, allow_nan=False)


def text_console(width: int):
    """A rich console that renders into a string: ``console, buf = text_console(120)``; plain
    text (no colour, no markup), the same on a terminal, in a pipe and in a file."""
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=False, color_system=None, markup=False), buf


def rich_table(columns: Sequence[str | tuple[str, str]], rows: Iterable[Sequence[Any]], title: str | None = None):
    """A rich Table; a column is a name or ``(name, "left" | "right")``; cells are ``str``-ed."""
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        name, just = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=just)
    for row in rows:
        t.add_row(*(str(c) for c in row))
    return t


def markdown_table(columns: Sequence[str | tuple[str, str]], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a GitHub Markdown table; a column is a name or ``(name, "left" | "right")``;
    ``|`` in a cell is escaped."""
    names = [c if isinstance(c, str) else c[0] for c in columns]
    align = ["---:" if not isinstance(c, str) and c[1] == "right" else "---" for c in columns]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return lines


@runtime_checkable
class ReportLike(Protocol):
    """What a caller may rely on in any graphpass report."""

    SCHEMA: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...

    def to_json(self) -> str: ...

    def to_markdown(self) -> str: ...

    def to_table(self) -> str: ...


class Report:
    """Base of every graphpass report (a mixin for dataclasses): set ``SCHEMA``, write
    ``to_dict`` (whose ``schema`` key is ``SCHEMA``), ``to_markdown`` and ``to_table``."""

    SCHEMA: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return to_json(self.to_dict())

    def to_markdown(self) -> str:
        raise NotImplementedError

    def to_table(self) -> str:
        raise NotImplementedError

    def render(self, fmt: str) -> str:
        """``to_json`` / ``to_markdown`` / ``to_table`` by name (one of :data:`FORMATS`)."""
        from graphpass.errors import UsageError

        if fmt not in FORMATS:
            raise UsageError(f"format '{fmt}': one of {', '.join(FORMATS)}")
        return getattr(self, f"to_{fmt}")()
