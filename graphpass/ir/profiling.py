"""Phase profile of a run (``graphpass optimize --profile``): wall time and peak RSS per phase.

A phase is a named stretch of work: ``load``, ``shape inference``, ``export``, ``cost
estimate``, ``pass <name>`` (one per pass application, recorded by the pass manager's
:class:`~graphpass.passes.framework.instruments.PhaseProfile` instrument), ``save``, ...
Phases nest; a row aggregates every occurrence of one name: the number of calls, the
inclusive time (an occurrence nested in one of the same name counts once), the self time
(without the phases nested in it: the self times of all rows and ``other`` add up to the
run's wall time), and memory from ``getrusage``'s ``ru_maxrss``, the process's high-water
mark: its value when the phase last ended, and how much the phase raised it in all.

Nothing is recorded unless a profile is active (:func:`start`): :func:`phase` then costs one
global read, so the call sites stay in library code.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["Profile", "PhaseRow", "phase", "timed", "enter", "leave", "start", "stop", "active", "peak_rss_bytes"]


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


@dataclass
class PhaseRow:
    name: str
    calls: int = 0
    seconds: float = 0.0  # inclusive
    self_seconds: float = 0.0
    peak_rss: int = 0  # high-water mark when the phase last ended (bytes)
    raised: int = 0  # how much the phase raised the high-water mark, summed over its calls (bytes)


@dataclass
class _Open:
    row: PhaseRow
    t0: float
    peak0: int
    child_seconds: float = 0.0
    outermost: bool = True  # no open phase of the same name encloses it


@dataclass
class Profile:
    """The phases of one run, in the order they were first entered."""

    rows: dict[str, PhaseRow] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    seconds: float | None = None  # the whole run's wall time, set by :func:`stop`
    peak_rss: int = 0
    _stack: list[_Open] = field(default_factory=list)

    def enter(self, name: str) -> None:
        row = self.rows.get(name)
        if row is None:
            row = self.rows[name] = PhaseRow(name)
        outermost = all(o.row is not row for o in self._stack)
        self._stack.append(_Open(row, time.perf_counter(), peak_rss_bytes(), outermost=outermost))

    def leave(self, name: str) -> None:
        # an exception may skip an inner leave: close what was left open inside this phase
        while self._stack:
            o = self._stack.pop()
            t = time.perf_counter() - o.t0
            peak = peak_rss_bytes()
            o.row.calls += 1
            if o.outermost:
                o.row.seconds += t
            o.row.self_seconds += t - o.child_seconds
            o.row.peak_rss = peak
            o.row.raised += peak - o.peak0
            if self._stack:
                self._stack[-1].child_seconds += t
            if o.row.name == name:
                return

    def finish(self) -> "Profile":
        while self._stack:
            self.leave(self._stack[0].row.name)
        self.seconds = time.perf_counter() - self.started
        self.peak_rss = peak_rss_bytes()
        return self

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "peak_rss_bytes": self.peak_rss,
                "phases": [vars(r).copy() for r in self.rows.values()]}

    def to_table(self) -> str:
        """The rows as a fixed-width table; ``other`` is the wall time outside every phase."""
        total = self.seconds if self.seconds is not None else time.perf_counter() - self.started
        mb = 1 / 2**20
        width = max([len(r.name) for r in self.rows.values()] + [len("other (outside the phases)")])
        head = f"{'phase':<{width}}  {'calls':>6}  {'total s':>8}  {'self s':>8}  {'peak RSS MB':>11}  {'raised MB':>9}"
        lines = ["graphpass profile (wall time; self: without the phases nested in it; peak RSS: the "
                 "process's high-water mark when the phase last ended, raised: how much the phase raised it)",
                 head, "-" * len(head)]
        for r in self.rows.values():
            lines.append(f"{r.name:<{width}}  {r.calls:>6}  {r.seconds:>8.3f}  {r.self_seconds:>8.3f}  "
                         f"{r.peak_rss * mb:>11.0f}  {r.raised * mb:>+9.0f}")
        top = sum(r.self_seconds for r in self.rows.values())
        lines.append(f"{'other (outside the phases)':<{width}}  {'':>6}  {'':>8}  {max(0.0, total - top):>8.3f}")
        lines.append("-" * len(head))
        lines.append(f"{'total':<{width}}  {'':>6}  {total:>8.3f}  {'':>8}  {self.peak_rss * mb:>11.0f}")
        return "\n".join(lines) + "\n"


_active: Profile | None = None


def active() -> Profile | None:
    """The profile being recorded, if any."""
    return _active


def start() -> Profile:
    """Start recording a new profile (replacing any active one) and return it."""
    global _active
    _active = Profile()
    return _active


def stop() -> Profile | None:
    """Stop recording; the finished profile (None if none was active)."""
    global _active
    p, _active = _active, None
    return p.finish() if p is not None else None


def enter(name: str) -> None:
    if _active is not None:
        _active.enter(name)


def leave(name: str) -> None:
    if _active is not None:
        _active.leave(name)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Record the enclosed work as phase ``name`` when a profile is active."""
    p = _active
    if p is None:
        yield
        return
    p.enter(name)
    try:
        yield
    finally:
        p.leave(name)


def timed(name: str):
    """Decorator: every call of the function is phase ``name`` when a profile is active."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _active is None:
                return fn(*args, **kwargs)
            with phase(name):
                return fn(*args, **kwargs)
        return wrapper
    return deco
