"""Cost estimates made in a forked child process while the run goes on (used by
:class:`~graphpass.passes.framework.cost_veto.CostVeto`).

On Linux with a second, idle CPU, the cost veto hands the estimates whose figures are not
needed at once (the input graph's; the catch-up after unscored applications) to a child forked
from the run: it walks its copy-on-write copy of the graph, writes the report and the engines
into an anonymous memory file and ends with ``os._exit``. :func:`fork_blocker` says when not
to fork (and why); the environment variable ``GRAPHPASS_NO_FORK`` turns it off.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

import onnx_graphsurgeon as gs

from graphpass.passes.framework.instrument_base import ESTIMATE_EACH_MAX_NODES

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.cost_model.target import Target
    from graphpass.passes.framework.cost_veto import CostVeto

__all__ = ["FORK_MAX_NODES", "fork_blocker"]

log = logging.getLogger(__name__)

#: Above ``ESTIMATE_EACH_MAX_NODES`` and up to this many nodes the cost veto estimates the input
#: graph in a forked child (see :class:`CostVeto`); above it the copies of the pages both
#: processes write could add up to a second copy of a large process's memory.
FORK_MAX_NODES = 300_000


def _tasks() -> frozenset[str] | None:
    """The process's threads (Linux: their ids), or None when they cannot be listed."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return None


# The threads alive when this module is first imported, once numpy has been (it starts
# OpenBLAS's worker threads, which stop themselves before a fork and start again after it:
# pthread_atfork handlers): they are known to be harmless to a forked child. Only when no other
# Python thread runs and onnxruntime is not loaded (its thread pools), else none but the main one.
_KNOWN_TASKS = (_tasks() or frozenset()) if (threading.active_count() == 1 and "onnxruntime" not in sys.modules) \
    else frozenset({str(threading.get_native_id())})


def _busy_cpus() -> float:
    """The machine's load: the 1-minute load average (0 when unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def fork_blocker(nodes: int, *, checks: bool = True) -> str | None:
    """Why the cost veto does not estimate a graph of ``nodes`` nodes in a forked child (None:
    it does). ``checks``: check that no thread but the main one (and the harmless ones of
    numpy's OpenBLAS) is alive (a forked child holds only the forking thread, and a lock another
    thread held at the fork stays held in the child), and that a CPU is idle: on a machine
    whose CPUs are all busy the child only takes turns with the run, which then does more work
    (the child's copied pages) for nothing."""
    if os.environ.get("GRAPHPASS_NO_FORK", "") not in ("", "0"):
        return "GRAPHPASS_NO_FORK is set"
    if not hasattr(os, "fork") or not hasattr(os, "memfd_create") or not hasattr(os, "sched_getaffinity"):
        return "no os.fork and os.memfd_create (Linux)"
    if len(os.sched_getaffinity(0)) < 2:
        return "one CPU: the child would only take turns with the run"
    if signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, None):
        # ignored (inherited across exec) or a handler that reaps: the child's exit status may be
        # gone when the veto waits for it
        return "SIGCHLD is ignored or handled"
    if nodes <= ESTIMATE_EACH_MAX_NODES:
        return f"at most {ESTIMATE_EACH_MAX_NODES} nodes: every application is estimated"
    if nodes > FORK_MAX_NODES:
        return f"more than {FORK_MAX_NODES} nodes: the child's copy-on-write pages could double the memory"
    if checks:
        if threading.active_count() != 1:
            return "another Python thread is alive"
        tasks = _tasks()
        if tasks is None or not tasks <= _KNOWN_TASKS | {str(threading.get_native_id())}:
            return "another native thread is alive"
        cpus = len(os.sched_getaffinity(0))
        load = _busy_cpus()
        if load > cpus - 0.5:
            return f"no idle CPU (load average {load:.1f} on {cpus} CPUs)"
    return None


class _ChildEstimate:
    """The estimate of a graph made in a forked child (:meth:`CostVeto.enter`): the child walks
    the graph as it was at the fork (its own copy-on-write copy of the memory), writes the report
    (totals, no per-node records) and the engines by node id (the ids of the parent's nodes:
    the same addresses) into an anonymous memory file and exits with ``os._exit``, without
    writing to stdout, stderr or any file."""

    def __init__(self, target: Target, graph: gs.Graph, options: dict[str, Any]):
        self.records: list = []  # the records holding _AWAITED for this estimate's cost
        self.initial = False  # the estimate of the run's input graph
        self._file = None
        self._here: tuple[Any, Any] | None = None  # (report, engines) when no child could be made
        self.pid: int | None = None
        self.fd: int | None = None
        try:
            fd = os.memfd_create("graphpass-estimate", os.MFD_CLOEXEC)
        except OSError as e:  # (a sandbox, no memory): the estimate made here, at once
            self._estimate_here(target, graph, options, e)
            return
        for stream in (sys.stdout, sys.stderr):  # (nothing buffered is written twice: the child never flushes)
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # none, closed, or a broken pipe: the run will say
                pass
        try:
            pid = os.fork()
        except OSError as e:  # EAGAIN at a process limit, ENOMEM under strict overcommit, EPERM in a sandbox
            os.close(fd)
            self._estimate_here(target, graph, options, e)
            return
        if pid == 0:  # pragma: no cover  (the child: coverage does not follow it)
            _child_main(target, graph, options, fd)
        self.pid, self.fd = pid, fd
        self._finalizer = weakref.finalize(self, _reap, pid, fd)  # a run that ends without exit or abort

    def _estimate_here(self, target: Target, graph: gs.Graph, options: dict[str, Any], error: OSError) -> None:
        """No child could be made: the estimate the child would have made, made in this process now
        (the graph is as the child would have seen it)."""
        log.info("cost veto: no forked child (%s): the estimate is made in the process", error)
        inc = target.incremental_estimate(graph, **options)
        self._here = (inc.report, inc.engines)

    def result(self) -> tuple[Any, Any]:
        """``(report, engines loader)``: waits for the child; raises what the estimate raised,
        or a RuntimeError when the child died or wrote something unreadable."""
        if self._here is not None:
            return self._here[0]
        if self._file is None:
            pid = self.pid
            _, status = os.waitpid(pid, 0)
            self._finalizer.detach()
            f = self._file = os.fdopen(self.fd, "rb")
            f.seek(0)
            try:
                if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
                    raise RuntimeError(f"exit status {status}")
                kind, value = pickle.load(f)
            except Exception as e:
                why = f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else str(e) or type(e).__name__
                f.close()
                raise RuntimeError(f"the cost estimate of the input graph, made in a forked child process, failed "
                                   f"({why}); the environment variable GRAPHPASS_NO_FORK=1 makes it in the "
                                   f"process itself") from None
            if kind == "error":
                f.close()
                raise value
            self._report = value
        return self._report

    def engines(self) -> Any:
        """The engines by node id (read once, after :meth:`result`)."""
        if self._here is not None:
            return self._here[1]
        engines = pickle.load(self._file)
        self._file.close()
        return engines

    def close(self) -> None:
        if self._here is not None:
            return
        if self._file is None:
            self._finalizer()  # kills and reaps the child
        elif not self._file.closed:
            self._file.close()


def _reap(pid: int, fd: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def _child_main(target: Target, graph: gs.Graph, options: dict[str, Any], fd: int) -> None:  # pragma: no cover
    """The forked child's whole life: estimate, write the result into ``fd``, ``os._exit``."""
    code = 70
    try:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # (ignored by the run: ignored here too)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it at once (the parent has its own)
        gc.disable()  # short-lived: a collection would only copy pages the parent still shares
        null = os.open(os.devnull, os.O_RDWR)
        for k in (0, 1, 2):  # never a byte on the parent's stdout or stderr (logging, warnings)
            os.dup2(null, k)
        sys.stdin = sys.stdout = sys.stderr = open(os.devnull, "r+")  # (streams on other descriptors)
        sys.dont_write_bytecode = True  # (a module first imported here: no .pyc written)
        logging.disable(logging.CRITICAL)  # (handlers hold the streams they were given)
        try:
            inc = target.incremental_estimate(graph, **options)  # as CostVeto.enter inline
            head, tail = ("ok", inc.report), inc.engines
        except BaseException as e:
            try:
                pickle.dumps(e)
                head = ("error", e)
            except Exception:
                head = ("error", RuntimeError(f"the cost estimate raised {type(e).__name__}: {e}"))
            tail = None
        with os.fdopen(fd, "wb", closefd=False) as f:
            pickle.dump(head, f, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(tail, f, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    finally:
        os._exit(code)


class _Awaited:
    """The cost of the graph while a forked child estimates it (:class:`CostVeto`): only stored
    into records (filled in when the child's report is read), never computed with."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<estimated in a child process>"


_AWAITED = _Awaited()


class _AwaitedPlacement:
    """``ctx.placement`` while the engines and report it hands over are a forked child's: not
    None (a pass may only ask whether it is judged), and read (unpacked) it waits for them."""

    __slots__ = ("veto",)

    def __init__(self, veto: "CostVeto"):
        self.veto = veto

    def _pair(self) -> tuple:
        self.veto._resolve()
        return self.veto._engines, self.veto._report

    def __iter__(self):
        return iter(self._pair())

    def __getitem__(self, i):
        return self._pair()[i]

    def __len__(self) -> int:
        return 2
