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
import re
from typing import Any, ClassVar, Iterable, Protocol, Sequence, runtime_checkable

__all__ = ["Report", "ReportLike", "to_json", "finite", "text_console", "rich_table", "markdown_table", "FORMATS",
           "message_kind", "group_messages", "brief_text", "short_stats", "clip"]

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


# ------------------------------------------------------------------------------------------
# short output: what a person sees by default (details with -v and in the report files)

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_BRACKETS = re.compile(r"\[[^\[\]]*\]|\([^()]*\)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def message_kind(message: str) -> str:
    """What a message says, without what it says it about: quoted names, bracketed and
    parenthesized text and numbers dropped (``"tensor 'x' has a symbolic shape ['b', 3] (fix ...)"``
    -> ``"tensor '' has a symbolic shape"``). Messages of one kind differ only in their subject."""
    text = _QUOTED.sub("''", message)
    for _ in range(3):  # nested brackets, innermost first
        text = _BRACKETS.sub("", text)
    return " ".join(_NUMBER.sub("#", text).split())


def group_messages(messages: Iterable[str]) -> list[tuple[str, int, str]]:
    """``(kind, count, first message)`` per kind (:func:`message_kind`), in order of first appearance."""
    groups: dict[str, list] = {}
    for m in messages:
        g = groups.setdefault(message_kind(m), [0, m])
        g[0] += 1
    return [(k, n, first) for k, (n, first) in groups.items()]


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def short_stats(stats: dict[str, Any], limit: int = 4, width: int = 60) -> str:
    """A pass's stats as one short cell: numbers as ``key=value``, a list as its length, long
    text left out (the JSON and Markdown reports hold it whole)."""
    out = []
    for k, v in stats.items():
        if v in (0, None, "", False) or isinstance(v, dict):
            continue
        if isinstance(v, (list, tuple, set, frozenset)):
            v = len(v)
        elif isinstance(v, float):
            v = f"{v:g}"
        elif isinstance(v, str) and len(v) > 24:
            continue
        out.append(f"{k}={v}")
        if len(out) == limit:
            break
    return clip(", ".join(out), width)


_BOX = tuple("┏┃┡│└━┗╇┣┠╰╭")


def brief_text(text: str, max_lines: int, width: int = 160, more: str = "-v shows everything") -> str:
    """``text`` in at most ``max_lines`` lines: a run of three or more lines of one kind
    (:func:`message_kind`, table rows excepted) becomes its first line and a count; lines are
    cut to ``width``; what is still over the budget is counted in a last line naming ``more``."""
    lines = text.rstrip("\n").splitlines()
    out: list[str] = []
    k = 0
    while k < len(lines):
        line, j = lines[k], k + 1
        if line.strip() and not line.lstrip().startswith(_BOX):
            kind = message_kind(line)
            while j < len(lines) and lines[j].strip() and message_kind(lines[j]) == kind:
                j += 1
        if j - k >= 3:
            indent = line[: len(line) - len(line.lstrip())]
            out += [clip(line, width), f"{indent}... and {j - k - 1} more like it ({more})"]
        else:
            out += [clip(x, width) for x in lines[k:j]]
        k = j
    if len(out) > max_lines:
        out = out[: max_lines - 1] + [f"... {len(out) - max_lines + 1} more lines ({more})"]
    return "\n".join(out) + "\n" if out else ""


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
