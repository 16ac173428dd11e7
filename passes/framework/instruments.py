"""Pass instruments: the side jobs of a pass-manager run, as hooks around every application.

Like TVM's ``PassInstrument``, an instrument has five hooks, all optional:

- ``enter(manager, graph, ctx)``: the run starts (before the first round);
- ``should_run(pass_, graph, ctx) -> bool``: False skips this application (no record);
- ``before(pass_, graph, ctx, record)``: just before the pass runs;
- ``after(pass_, graph, ctx, result, record)``: just after; ``result`` is what the pass
  returned, ``record`` the :class:`~graphpass.infra.manager.PassRecord` being written (an
  instrument may annotate it, or veto the application: ``record.modified = False``);
- ``abort(pass_, graph, ctx, record, error)``: the pass or an instrument raised (called in
  reverse order, then the manager re-raises);
- ``exit(manager, graph, ctx)``: the run ended without an error.

Instruments nest like context managers: ``before`` hooks run in list order, ``after`` hooks
in reverse. So the innermost (last) instrument sees the pass first: :class:`PassTiming` goes
last (it times the pass alone), :class:`CostVeto` before it is seen by everything outside it
(:class:`VerifyEach` and :class:`DumpIR` only see applications it kept).
:func:`standard_instruments` builds the list ``graphpass.optimize`` uses, in that order.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.cost_model.base import CostModel
from graphpass.cost_model.target import Target
from graphpass.errors import BadModelError, VerificationError
from graphpass.passes.framework.pass_base import Pass, PassContractError, PassResult
from graphpass.ir import annotations as A, model_io, profiling
from graphpass.ir.journal import Journal
from graphpass.ir.graph import count_nodes, fingerprint, iter_graphs

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.passes.framework.context import PassContext
    from graphpass.passes.framework.manager import PassManager, PassRecord

__all__ = [
    "PassInstrument",
    "CostVeto",
    "VerifyEach",
    "DumpIR",
    "PassTiming",
    "PhaseProfile",
    "Progress",
    "ApplicationLimit",
    "ContractCheck",
    "standard_instruments",
    "CONTRACT_CHECK_MAX_NODES",
    "ESTIMATE_EACH_MAX_NODES",
    "FORK_MAX_NODES",
    "fork_blocker",
]

#: Above this many nodes (or 4x as many node inputs and outputs) the per-pass fingerprint of
#: :class:`ContractCheck` is skipped unless asked for explicitly: it is a development aid.
CONTRACT_CHECK_MAX_NODES = 5_000

#: Up to this many nodes every pass application is estimated (else only the scored ones).
ESTIMATE_EACH_MAX_NODES = 5_000

#: Above ``ESTIMATE_EACH_MAX_NODES`` and up to this many nodes the cost veto estimates the input
#: graph in a forked child (see :class:`CostVeto`); above it the copies of the pages both
#: processes write could add up to a second copy of a large process's memory.
FORK_MAX_NODES = 300_000

log = logging.getLogger(__name__)


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
        fd = os.memfd_create("graphpass-estimate", os.MFD_CLOEXEC)
        for stream in (sys.stdout, sys.stderr):  # (nothing buffered is written twice: the child never flushes)
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # none, closed, or a broken pipe: the run will say
                pass
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child: coverage does not follow it)
            _child_main(target, graph, options, fd)
        self.pid, self.fd = pid, fd
        self.records: list = []  # the records holding _AWAITED for this estimate's cost
        self.initial = False  # the estimate of the run's input graph
        self._file = None
        self._finalizer = weakref.finalize(self, _reap, pid, fd)  # a run that ends without exit or abort

    def result(self) -> tuple[Any, Any]:
        """``(report, engines loader)``: waits for the child; raises what the estimate raised,
        or a RuntimeError when the child died or wrote something unreadable."""
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
        engines = pickle.load(self._file)
        self._file.close()
        return engines

    def close(self) -> None:
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


class PassInstrument:
    """Base class: every hook does nothing (``should_run`` says yes)."""

    def enter(self, manager: "PassManager", graph: gs.Graph, ctx: "PassContext") -> None:
        pass

    def should_run(self, pass_: Pass, graph: gs.Graph, ctx: "PassContext") -> bool:
        return True

    def before(self, pass_: Pass, graph: gs.Graph, ctx: "PassContext", record: "PassRecord") -> None:
        pass

    def after(self, pass_: Pass, graph: gs.Graph, ctx: "PassContext", result: PassResult,
              record: "PassRecord") -> None:
        pass

    def abort(self, pass_: Pass, graph: gs.Graph, ctx: "PassContext", record: "PassRecord",
              error: BaseException) -> None:
        """The pass (or a ``before`` hook) raised ``error``; the manager re-raises it after."""

    def refreshed(self, graph: gs.Graph, ctx: "PassContext") -> None:
        """The manager changed the graph outside any pass: it re-inferred shapes (between
        rounds). What an instrument knew of the graph may be stale."""

    def exit(self, manager: "PassManager", graph: gs.Graph, ctx: "PassContext") -> None:
        pass


def _same_constant(a: gs.Constant, b: gs.Constant) -> bool:
    """Whether the cost estimate sees ``a`` and ``b`` alike (see ``CostVeto._unchanged_estimate``):
    the same name presence, annotations, shape and dtype, and the same values where the estimate
    may read them. It reads a Constant's values in its folding (``AscendCostModel._fold_value``:
    int32/int64 tables of at most 64 elements, on disk or in memory alike) and as an op's
    axes, starts, ends, steps or trip count (at most rank elements); so values are compared for
    constants of at most 64 elements, and a larger one (a weight) by shape and dtype only,
    without loading it."""
    from graphpass.ir.graph import peek_values

    if bool(a.name) != bool(b.name) or a.inputs or b.inputs:
        return False
    if (A.stored_meta(a) or {}) != (A.stored_meta(b) or {}):
        return False
    try:
        sa, sb = tuple(a.shape), tuple(b.shape)
        if sa != sb or np.dtype(a.dtype) != np.dtype(b.dtype):
            return False
    except TypeError:  # a dtype numpy does not know (a lazy bfloat16's is an enum): say no
        return False
    if math.prod(sa) > 64:
        return True
    va, vb = np.asarray(peek_values(a)), np.asarray(peek_values(b))
    return va.dtype == vb.dtype and va.shape == vb.shape and va.tobytes() == vb.tobytes()  # bitwise: -0.0, NaN


class CostVeto(PassInstrument):
    """Estimates every application and rolls back a scored one that makes the estimate worse.

    A pass is scored when ``pass_.scored_in(ctx)`` and it is not ``required``. Every application
    runs under an undo log (:class:`graphpass.ir.journal.Journal`: the state of each node, tensor
    and graph is saved when the pass first edits it, no export); when the estimate of a scored
    application rises, the log is replayed backwards into the caller's graph objects and the
    record says ``rolled_back``. A pass that raises is rolled back the same way (:meth:`abort`),
    so the caller's model is left as it was before that pass. Above ``ESTIMATE_EACH_MAX_NODES``
    nodes only scored applications are estimated (an estimate of 100k nodes takes ~2 s).

    With ``check_rollback`` (default: the environment variable ``GRAPHPASS_CHECK_ROLLBACK`` set
    to a non-empty value other than ``0``; the test suite sets it) the model is exported
    (weightless, the weights by identity) before every scored application, and after a rollback
    the export must be byte-identical and hold the very same weights (an ``AssertionError``
    otherwise): a development check of the undo log.

    Incremental (``incremental=True``, the default, with the run's own target): the estimate is
    kept current (:class:`graphpass.cost_model.incremental.IncrementalEstimate`) from what each
    application touched (the journal's ``touched_nodes`` and ``changed_tensors``): the touched
    nodes and the cone whose state changed are priced again, the fusion groups near them formed
    again, the rest kept; its total equals a fresh estimate's (exact sums). A rollback restores
    the replaced entries too. A plain full estimate replaces the update when the application
    touched more than ``FULL_FRACTION`` of the nodes (the per-node state is then built again by
    the next small edit), the graph's inputs or outputs changed, the manager re-inferred shapes
    (:meth:`refreshed`), or the graph has control flow or a host-scheduled region;
    ``incremental_stats`` (after the run) counts both kinds and the reasons. Edits of an
    application that reported no change (shapes its own inference refined) are followed before
    the next scored application while the state is kept (the cost it is judged against stays the
    kept one), else left to the next full estimate, as before. ``check_incremental`` (default:
    ``GRAPHPASS_CHECK_INCREMENTAL`` set, not ``0``; the suite sets it) keeps the state and
    updates after every edit however large, and compares each update with a fresh estimate
    (total and engines; an ``AssertionError`` naming the pass otherwise). ``initial_report`` is a
    full estimate of the input graph; ``final_report`` the kept one when it describes the final
    graph (a full estimate's, or the state's: totals, breakdown, TransData counts and time,
    crossings, no per-node records), else a fresh one.

    Forked (``fork``: None decides, True skips the thread and load checks, False never): the plain
    full estimates whose figures are not needed at once are made by a forked child on the graph as it
    is while this process goes on (a second CPU does them; the work is not less, ~0.1 s of CPU a
    10k-node estimate, and the pages either process writes while the child lives are copied): the
    input graph's, read when a scored application changes the graph or hands over its engines
    (``ctx.placement`` unpacked), an application of a graph of at most ``ESTIMATE_EACH_MAX_NODES``
    nodes is updated from it, an annotation edit is judged by its engines, or the run ends; and
    the catch-up before a scored application (the unscored ones before it left the estimate
    behind), read in the same cases. Until then the kept cost is a placeholder that records
    store (filled in when the child's report is read), and the state is the one a plain full
    estimate leaves (``IncrementalEstimate.deferred``): the run, its records, reports and
    statistics are those of an estimate made here. Only the run's own target with the
    incremental estimate and without ``check_incremental``, on Linux (``os.fork``,
    ``os.memfd_create``) with a second CPU idle (the 1-minute load average below the CPUs
    less one half: on a busy machine the child only takes turns with the run, which then does
    more work in all and ends later), a graph of ``ESTIMATE_EACH_MAX_NODES`` to
    ``FORK_MAX_NODES`` nodes, no other Python thread and no native thread but those alive when
    numpy loaded (OpenBLAS's, which stop themselves at a fork); the environment variable
    ``GRAPHPASS_NO_FORK`` set to a non-empty value other than ``0`` turns it off (see
    :func:`fork_blocker`). The child writes nothing but its result (into an anonymous memory
    file) and ends with ``os._exit``; an exception it raised is raised here, and a child that
    died (a signal, the OOM killer) is a ``RuntimeError``: the graph it estimated is gone, so
    its figures cannot be made again, and a report without them would be wrong. A run that
    ends with an error kills and reaps its children.

    The estimates come from ``target`` (a :class:`graphpass.Target` or its name, or a cost
    model of one's own), by default the run's own (``ctx.target``). After the run: ``initial_cost`` / ``final_cost`` (us, None
    when the target has no estimates, e.g. ``none``) and ``initial_report`` (the target's
    cost report on the input graph).
    """

    def __init__(self, target: "Target | str | CostModel | None" = None, cost_options: dict[str, Any] | None = None,
                 check_rollback: bool | None = None, check_incremental: bool | None = None,
                 incremental: bool = True, fork: bool | None = None):
        self._given = target
        self.target: Target | None = None
        self.cost_options = dict(cost_options or {})
        self.initial_cost: float | None = None
        self.final_cost: float | None = None
        self.initial_report = None
        if check_rollback is None:
            check_rollback = os.environ.get("GRAPHPASS_CHECK_ROLLBACK", "") not in ("", "0")
        self.check_rollback = check_rollback
        if check_incremental is None:
            check_incremental = os.environ.get("GRAPHPASS_CHECK_INCREMENTAL", "") not in ("", "0")
        self.check_incremental = check_incremental
        self.incremental = incremental
        self.fork = fork
        self.forked = False  # whether the last run made an estimate in a forked child
        self._child: _ChildEstimate | None = None  # the child whose estimate _AWAITED stands for
        self._children: list[_ChildEstimate] = []  # those not read yet
        self._inc = None  # the IncrementalEstimate of the graph, when the target gives one
        self.incremental_stats: dict[str, Any] | None = None
        self._journal: Journal | None = None

    @property
    def active(self) -> bool:
        return self.target is not None and self.target.estimates

    def _estimate(self, graph: gs.Graph):
        """The estimate of ``graph``; with it, the engines of its nodes when the estimate can give
        them in the same walk (kept in ``_engines`` while the report is current: place_and_sink
        takes them from ``ctx.placement`` instead of estimating again)."""
        self._engines = None
        if not self.active:
            return None
        if self._given is None:  # the run's own target: one walk gives the report and the engines
            # totals only: the veto keeps up to three reports alive (before, after, the input's),
            # and per-node records were ~1 KB per node each (2.6 GB on a 1M-node graph)
            report, self._engines = self.target.estimate_with_placement(graph, node_records=False, **self.cost_options)
            return report
        return self.target.estimate(graph, **self.cost_options)

    def enter(self, manager, graph, ctx):
        given = self._given
        if given is None:
            self.target = ctx.target
        elif isinstance(given, (Target, str, Path)):
            self.target = Target.resolve(given)
        else:  # a cost model of one's own: the run's target with these estimates
            self.target = ctx.target.with_cost_model(given)
        self._engines = None
        self._inc = None
        self._pending: tuple[list, list, list] | None = None  # what applications no estimate saw touched
        self._merged = None  # the pending edits the current application's update took in
        self._refresh = False
        self.incremental_stats = None
        self.forked = False
        self._child = None
        self._children = []
        self._stale = False
        if self._fork_now(graph):
            # the input graph's estimate (the largest of the run) is made by a forked child while
            # this process runs the unscored applications ahead of the first scored one; the
            # state is the one a plain full estimate leaves, its figures read when needed
            from graphpass.cost_model.base import check_estimate_options
            from graphpass.cost_model.incremental import IncrementalEstimate

            check_estimate_options(dict(self.cost_options))  # (a bad option fails here, as inline)
            self._inc = IncrementalEstimate.deferred(self.target._hardware, graph, **self.cost_options)
            self._fork(graph).initial = True
            self.initial_report = self._report = None
            self.initial_cost = _AWAITED
        else:
            if self.incremental and self._given is None and self.active:
                # checked: every edit is updated, however much it touched (the update is what is checked)
                self._inc = self.target.incremental_estimate(graph, _full_fraction=0 if self.check_incremental else None,
                                                             **self.cost_options)
            if self._inc is not None:
                report, self._engines = self._inc.report, self._inc.engines
            else:
                report = self._estimate(graph)
            self.initial_report = self._report = report
            self.initial_cost = self._cost = report.total_us if report is not None else None
        self.final_cost = None
        self.final_report = None
        self._journal = None
        self._before_bytes = None
        self._stale = False

    def _fork_now(self, graph: gs.Graph) -> bool:
        """Whether this run's input graph is estimated in a forked child: the run's own target
        with the incremental estimate and no development check of it (that one keeps the state of
        the input graph's estimate), ``fork`` not False and :func:`fork_blocker` none (``fork``
        True: without its thread and load checks)."""
        if (self.fork is False or not self.incremental or self._given is not None or not self.active
                or self.check_incremental or not self.target.has_hardware
                or self.target.cost_model is not self.target._hardware):
            return False
        why = fork_blocker(len(graph.nodes), checks=self.fork is None)
        if why is not None:
            log.debug("cost veto: the input graph is estimated inline: %s", why)
        return why is None

    def _fork(self, graph: gs.Graph) -> _ChildEstimate:
        """A forked child estimates ``graph`` as it is; its cost is awaited (see :meth:`_resolve`)."""
        child = _ChildEstimate(self.target, graph, self.cost_options)
        self._children.append(child)
        self._child = child
        self._cost = _AWAITED
        self._report = self._engines = None
        self.forked = True
        return child

    def _resolve(self, child: "_ChildEstimate | None" = None) -> None:
        """Read a forked child's estimate (waiting for it; default: the one the kept cost
        awaits): the records that held its cost, the initial report and cost for the input
        graph's, and for the one the kept cost awaits, the state an estimate made here would
        have left."""
        if child is None:
            child = self._child
            if child is None:
                return
        current = child is self._child
        if current:
            self._child = None
        self._children.remove(child)
        try:
            with profiling.phase("cost estimate"):
                report = child.result()
                engines = child.engines() if current else None
        finally:
            child.close()
        if child.initial:
            self.initial_report, self.initial_cost = report, report.total_us
        self._inc.adopt(report, engines, current=current)
        if current:
            self._cost = report.total_us
            if not self._stale:  # (a stale one is cleared: as inline)
                self._report, self._engines = report, engines
        for rec in child.records:
            if rec.cost_before_us is _AWAITED:
                rec.cost_before_us = report.total_us
            if rec.cost_after_us is _AWAITED:
                rec.cost_after_us = report.total_us

    def _fork_catch_up(self, graph: gs.Graph) -> bool:
        """The catch-up estimate before a scored application (see :meth:`before`) made in a
        forked child, when it is a plain full one and the run forks: its figures are read when
        the application changes the graph (it is judged against them), hands them over
        (``ctx.placement`` read), or at the run's end; an application that changes nothing
        only stores the cost in its record."""
        inc = self._inc
        if inc is None or not (self._refresh or inc.unseen) or not self._fork_now(graph):
            return False
        inc.defer(graph, "shapes refreshed by the manager" if self._refresh else "edits no update saw")
        self._pending = None
        self._refresh = False
        self._fork(graph)
        self._stale = False
        return True

    def before(self, pass_, graph, ctx, record):
        self._scored = pass_.scored_in(ctx) and not pass_.required
        if self._stale and self._scored and self._cost is not None and self._fork_catch_up(graph):
            pass
        elif self._stale and self._scored and self._cost is not None:
            # an unscored application above ESTIMATE_EACH_MAX_NODES left the estimate behind:
            # judge this one against the graph as it is now, not as it was (issue 21)
            report = self._catch_up(graph)
            self._report = report
            self._cost = report.total_us if report is not None else None
            self._child = None
            self._stale = False
        self._merged = None
        if (self._pending is not None and self._scored and not self._stale and self._inc is not None
                and self._inc.valid):
            # edits no estimate has seen (a pass that refined shapes but reported no change): the
            # incremental state follows them before this application; the cost judged against
            # stays the kept one, as without the incremental estimate
            kept = self._report
            self._catch_up(graph)
            self._report = kept if kept is None else self._inc.report
        cost = self._cost
        ctx.placement = None
        if (self._scored and not self._stale and self._engines is not None and self._report is not None
                and self.cost_options.get("precision_mode") == ctx.cost_options.get("precision_mode")):
            ctx.placement = (self._engines, self._report)  # the graph as it is now: the pass may reuse them
        elif (cost is _AWAITED and self._scored and not self._stale
              and self.cost_options.get("precision_mode") == ctx.cost_options.get("precision_mode")):
            ctx.placement = _AwaitedPlacement(self)
        record.cost_before_us = cost
        if cost is _AWAITED:
            self._child.records.append(record)
        self._estimate_after = cost is not None and (self._scored or record.nodes_before <= ESTIMATE_EACH_MAX_NODES)
        self._before_bytes = None
        if self._scored and cost is not None and self.check_rollback:
            self._before_bytes = _model_bytes(graph)
        self._journal = Journal(graph)  # every application: a pass that raises is undone too
        self._journal.start()

    def after(self, pass_, graph, ctx, result, record):
        journal, self._journal = self._journal, None
        try:
            self._after(pass_, graph, ctx, result, record, journal)
        except BaseException:
            # the estimate (or a development check) raised: the manager re-raises it as the
            # pass's failure, and :meth:`abort` no longer holds the journal: undo the pass here,
            # as for a pass that raises (a journal left recording kept its hooks installed and
            # every later edit of the process logged)
            if journal is not None and journal.recording:
                journal.rollback()
                if self._inc is not None:
                    self._inc.rollback()
                record.note = "rolled back: its estimate raised"
            raise

    def _after(self, pass_, graph, ctx, result, record, journal):
        ctx.placement = None
        cost = self._cost
        if not record.modified:
            if journal is not None:
                journal.stop()
                if self._inc is not None and journal.edits and (journal.changed_tensors() or journal.touched_nodes()):
                    # a pass that changed nothing the manager counts may still have refined shapes
                    # (its own shape inference): the incremental state follows; the cost judged
                    # against stays the kept one, as it was
                    self._add_pending(journal, silent=True)
            record.cost_after_us = cost
            return
        # still recording: a lazy weight the estimate loads is put back as it was on a rollback
        kept = (self._report, self._engines)
        report = None
        awaited = cost is _AWAITED and not self._stale and journal is not None
        if awaited and journal.annotation_edits() is not None:
            self._resolve()  # the edit is judged unchanged by the engines of the child's estimate
            kept, cost, awaited = (self._report, self._engines), self._cost, False
            record.cost_before_us = cost
        unchanged = self._unchanged_estimate(journal)
        if awaited and not unchanged and self._estimate_after:
            self._resolve()  # judged against (scored) or updated from (a small graph) the child's estimate
            kept, cost = (self._report, self._engines), self._cost
            record.cost_before_us = cost
        if unchanged:
            if cost is _AWAITED:  # the child's estimate stands: read later
                journal.stop()
                record.cost_after_us = cost
                self._before_bytes = None
                return
            # the edit cannot change the estimate (engines the kept estimate chose, written as
            # annotations; a Constant input swapped for an equal one): the kept estimate stands,
            # for an unscored application too (no catch-up estimate later for it)
            report = self._report
            if self.check_incremental:
                fresh, engines = self.target.estimate_with_placement(graph, node_records=False, **self.cost_options)
                if fresh.total_us != report.total_us or (engines is not None and engines != self._engines):
                    raise AssertionError(f"after pass '{pass_.name}' (an edit the estimate cannot see): the kept "
                                         f"estimate is {report.total_us!r} us, a fresh one {fresh.total_us!r} us")
        elif self._estimate_after:
            report = self._update(pass_, graph, journal) if self._inc is not None else self._estimate(graph)
        elif self._inc is not None and journal is not None:  # estimated with the next scored application
            self._add_pending(journal)
        if journal is not None:
            journal.stop()
        new_cost = report.total_us if report is not None else None
        record.cost_after_us = new_cost
        if (self._scored and journal is not None and new_cost is not None and cost is not None
                and new_cost > cost * (1 + 1e-9) + 1e-9):
            journal.rollback()
            if self._inc is not None:
                self._inc.rollback()  # the cache describes the restored graph again
                if self._merged == "refresh":
                    self._refresh = True
                else:
                    self._pending = self._merged  # (and the edits it had not seen)
                self._merged = None
            self._report, self._engines = kept  # the graph is as it was: so are its report and engines
            if self._before_bytes is not None and _model_bytes(graph) != self._before_bytes:
                raise AssertionError(f"the rollback of pass '{pass_.name}' did not restore the exported model")
            record.rolled_back = True
            record.modified = False
            record.nodes_after = count_nodes(graph)
            record.note = f"rolled back: estimate rose from {cost:.1f} to {new_cost:.1f} us"
            log.info("%s %s", pass_.name, record.note)
        elif new_cost is not None:
            if self._inc is not None:
                self._inc.commit()
                self._merged = None
            self._cost = new_cost
            self._child = None  # (a child's estimate awaited until now: only its records' figures)
            self._report = report
            self._stale = False  # an estimate of the graph as it is now
        elif cost is not None:
            record.cost_before_us = None
            self._stale = True
            self._report = self._engines = None
        self._before_bytes = None

    def _unchanged_estimate(self, journal: Journal | None) -> bool:
        """Whether the kept estimate (of the graph before the application) is the estimate of the
        graph after it: the application changed nothing but

        - the engine annotations of nodes, each to the engine the kept estimate gave the node (the
          estimate reads an engine annotation only where it differs from its own choice);
        - which Constant some node inputs read, each replaced by one of the same dtype, shape,
          annotations and values (``_same_constant``: the values compared where the estimate may
          read them, constants of at most 64 elements; a larger one by shape and dtype).
        A weight a pass loaded (gs's ``values`` getter) is no change to the estimate: it reads a
        constant's values alike on disk and in memory."""
        awaited = self._cost is _AWAITED  # (the input graph's report and engines, in the child: see _after)
        if (journal is None or (not awaited and (self._engines is None or self._report is None)) or self._stale
                or self._pending is not None or (self._inc is not None and (self._refresh or self._inc.unseen))):
            return False
        edits = journal.annotation_edits()
        if edits is not None:
            engines = self._engines
            for node, before, now in edits:
                before, now = before or {}, now or {}
                if before.keys() - {A.ENGINE} != now.keys() - {A.ENGINE} or any(
                        before[k] != v for k, v in now.items() if k != A.ENGINE):
                    return False
                engine, kept = now.get(A.ENGINE), engines.get(id(node))
                if engine is None or kept is None or engine != kept[0]:
                    return False
            return True
        swaps = journal.constant_swaps()
        if swaps is None:
            return False
        seen: set[tuple[int, int]] = set()
        for _, _, old, new in swaps:
            if (id(old), id(new)) in seen:
                continue
            seen.add((id(old), id(new)))
            if not _same_constant(old, new):
                return False
        return True

    def refreshed(self, graph, ctx):
        # new shapes change the estimate (a dim resolved, a symbolic one renamed): the next scored
        # application, and the final report, are judged on a fresh one
        if self._cost is not None:
            self._stale = True
            self._report = self._engines = None
            self._refresh = True  # the incremental estimate starts afresh too

    def abort(self, pass_, graph, ctx, record, error):
        ctx.placement = None
        self._child = None
        while self._children:  # the run ends with the error: no child is waited for
            self._children.pop().close()
        journal, self._journal = self._journal, None
        if journal is not None and journal.recording:
            journal.rollback()
            if self._inc is not None:
                self._inc.rollback()  # an update this application made, if any
            record.note = f"rolled back: the pass raised {type(error).__name__}"

    def _update(self, pass_: Pass, graph: gs.Graph, journal: Journal | None):
        """The estimate after ``pass_``: an incremental update of the kept one (a full estimate
        when no journal says what the pass touched); with ``check_incremental``, checked
        against a fresh estimate."""
        inc = self._inc
        pending, self._pending = self._pending, None
        with profiling.phase("cost estimate"):
            if journal is None or self._refresh:
                report = inc.full(graph, reason="shapes refreshed by the manager" if self._refresh else "no journal")
                if self._refresh:  # a rollback restores the state before the refresh: refreshed again then
                    self._merged, self._refresh = "refresh", False
            elif inc.large(graph, journal.edits):  # (before listing what it touched: that takes time too)
                report = inc.full_update(graph, "the edit touched a large part of the graph")
            else:
                nodes, tensors, changed = journal.touched_nodes(), journal.touched_tensors(), journal.changed_tensors()
                if pending is not None:  # edits no estimate saw yet: in the same update (a rollback gives them back)
                    self._merged = pending
                    nodes, tensors, changed = pending[0] + nodes, pending[1] + tensors, pending[2] + changed
                report = inc.update(graph, nodes, tensors, changed)
        self._engines = inc.engines
        if self.check_incremental:
            fresh, engines = self.target.estimate_with_placement(graph, node_records=False, **self.cost_options)
            if fresh.total_us != report.total_us or (engines is not None and engines != inc.engines):
                raise AssertionError(f"after pass '{pass_.name}': the incremental estimate gives {report.total_us!r} us, "
                                     f"a fresh one {fresh.total_us!r} us"
                                     + ("" if fresh.total_us != report.total_us else " (the engines differ)"))
        return report

    def _add_pending(self, journal: Journal, silent: bool = False) -> None:
        """What an application touched, for the next update (made before the next scored one).
        ``silent``: the application reported no change; without the incremental state (the last
        estimate a plain full one) its edits are not held, only marked unseen: the next
        estimate, and the final report, are full ones that see them (a kept report would not:
        the run's final cost missed shapes refined by its last applications)."""
        inc = self._inc
        if not inc.valid or inc.unseen or inc.large(None, journal.edits):
            inc.unseen = True  # the next estimate is a full one: no need to hold on to what it touched
            return
        nodes, tensors, changed = self._pending or ([], [], [])
        nodes.extend(journal.touched_nodes())
        tensors.extend(journal.touched_tensors())
        changed.extend(journal.changed_tensors())
        self._pending = (nodes, tensors, changed)

    def _catch_up(self, graph: gs.Graph):
        """The estimate of the graph as it is now, after unestimated applications (or new shapes)."""
        inc = self._inc
        if inc is None:
            return self._estimate(graph)
        pending, self._pending = self._pending, None
        with profiling.phase("cost estimate"):
            if self._refresh or inc.unseen:
                report = inc.full(graph, reason="shapes refreshed by the manager" if self._refresh else "edits no update saw")
            elif pending is not None:
                report = inc.update(graph, *pending)
            else:  # kept current all along
                report = inc.report
        inc.commit()
        self._refresh = False
        self._engines = inc.engines
        return report

    def exit(self, manager, graph, ctx):
        self._resolve()  # the kept cost's first, with its engines (the final report may be its)
        while self._children:  # (the input graph's figures, records' costs)
            self._resolve(self._children[0])
        if self._inc is not None:
            self.incremental_stats = self._inc.stats()
            log.debug("cost veto estimates: %s", self.incremental_stats)
            inc, self._inc = self._inc, None  # its cache is dropped with the run
            self._merged = None  # (what it holds of the graph: removed nodes too)
            # the final report: the kept one (a full estimate's, or the incremental state's with
            # the totals the optimize report reads) when it describes the graph as it is, else
            # one fresh estimate
            current = not self._stale and self._pending is None and not inc.unseen
            self._pending = None
            report = inc.final_report() if current else self._estimate(graph)
            self.final_cost = report.total_us if report is not None else None
            self.final_report = report
            if (current and self._cost is not None
                    and os.environ.get("GRAPHPASS_CHECK_KEPT_COST", "") not in ("", "0")):
                # a development check (set by the suite): what the run kept is a fresh estimate's
                fresh = self._estimate(graph)
                def crossings(r):
                    return sorted((c["tensor"], c["from"], c["to"], c["bytes"], c["us"]) for c in r.crossings)
                if (self.final_cost != self._cost or fresh.total_us != report.total_us
                        or fresh.breakdown_us != report.breakdown_us or crossings(fresh) != crossings(report)
                        or any(fresh.transdata.get(k) != report.transdata.get(k) for k in ("explicit", "implicit", "us"))):
                    raise AssertionError(f"the cost veto kept {self._cost!r} us ({report.transdata}), a fresh "
                                         f"estimate gives {fresh.total_us!r} us ({fresh.transdata})")
        elif self._stale and self._cost is not None:
            report = self._estimate(graph)
            self.final_cost = report.total_us if report is not None else None
            self.final_report = report
        else:
            self.final_cost = self._cost
            self.final_report = self._report  # the report of the graph as the run leaves it
            if (self.final_cost is not None and self._given is None  # the target's own model (a given one may vary)
                    and os.environ.get("GRAPHPASS_CHECK_KEPT_COST", "") not in ("", "0")):
                # a development check (set by the suite): the estimate kept through the run (reports
                # reused across passes that changed nothing, restored by rollbacks) is the one a
                # fresh estimate of the final graph gives, to the last bit
                fresh = self._estimate(graph)
                kept, new = self.final_report.to_dict(), fresh.to_dict()
                if fresh.total_us != self.final_cost or kept != new:
                    differ = sorted(k for k in set(kept) | set(new) if kept.get(k) != new.get(k))
                    raise AssertionError(f"the cost veto kept {self.final_cost!r} us, a fresh estimate gives "
                                         f"{fresh.total_us!r} us (differing: {differ}: "
                                         f"{[(kept.get(k), new.get(k)) for k in differ][:2]})")


def _model_bytes(graph: gs.Graph) -> tuple[bytes, dict[str, int]]:
    """The model ``graph`` belongs to, for the rollback check: its weightless device-form export
    and the identity of every weight (held by reference, as the passes replace a Constant
    rather than write into its array)."""
    proto, weights = model_io.snapshot(graph)
    return proto.SerializeToString(), {name: id(w) for name, w in weights.items()}


class VerifyEach(PassInstrument):
    """After every kept application, the ONNX checker and an onnxruntime comparison against the
    input graph on seeded random inputs; names the first pass that broke the model
    (:class:`~graphpass.errors.VerificationError`). Judged like ``optimize --verify``: at the
    loosest promise of the passes applied so far."""

    def __init__(self, seed: int = 0, input_shapes: dict[str, list[int]] | None = None):
        self.seed = seed
        self.input_shapes = dict(input_shapes or {})

    def enter(self, manager, graph, ctx):
        from graphpass.check import verify as V

        model = model_io.to_proto(graph, emit="device")
        feeds, ref, _, runner, _ = V.reference(model, seed=self.seed, input_shapes=self.input_shapes)
        V.check_deterministic("the input model", model, runner, feeds, ref)  # else every pass "breaks" it
        self._feeds, self._ref, self._fp16 = feeds, ref, runner.fp16
        self._promises: list = []

    def after(self, pass_, graph, ctx, result, record):
        if not record.modified:
            return
        from graphpass.check import verify as V

        self._promises.append(getattr(pass_, "promise", V.UNDECLARED))
        name = pass_.name
        model = model_io.to_proto(graph, emit="device")
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:
            raise VerificationError(
                f"after pass '{name}': the ONNX checker rejects the model: {str(e).splitlines()[0]}"
            ) from e
        try:
            checked = V.check_outputs(self._ref, model, self._feeds, promises=self._promises, fp16=self._fp16)
        except BadModelError as e:  # the input model ran: this pass's output is to blame
            raise VerificationError(f"after pass '{name}': {e}") from e
        if not checked.ok:
            raise VerificationError(f"after pass '{name}': {V.describe(checked.failures[0])} from the input "
                                    f"model at {checked.tolerance}")


class DumpIR(PassInstrument):
    """Writes the graph after every kept application to ``dump_dir`` as
    ``NNN_<pass>.onnx`` (device form), numbered in order. A write error is exit 2."""

    def __init__(self, dump_dir: str | Path):
        self.dump_dir = Path(dump_dir)
        self.count = 0

    def enter(self, manager, graph, ctx):
        self.count = 0

    def after(self, pass_, graph, ctx, result, record):
        if not record.modified:
            return
        self.count += 1
        path = self.dump_dir / f"{self.count:03d}_{pass_.name}.onnx"
        try:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            model_io.save(graph, path, emit="device")
        except OSError as e:
            from graphpass.errors import write_error

            raise write_error(path, e) from None


class PassTiming(PassInstrument):
    """Wall time of every application into ``record.seconds``, and per pass in ``totals``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def enter(self, manager, graph, ctx):
        self.totals = {}

    def before(self, pass_, graph, ctx, record):
        self._t0 = time.perf_counter()

    def after(self, pass_, graph, ctx, result, record):
        record.seconds = time.perf_counter() - self._t0
        self.totals[pass_.name] = self.totals.get(pass_.name, 0.0) + record.seconds


class PhaseProfile(PassInstrument):
    """Each application as the phase ``pass <name>`` of the active profile
    (:mod:`graphpass.ir.profiling`, ``optimize --profile``); innermost, like :class:`PassTiming`,
    so the phase is the pass alone (the exports and shape inference it runs itself nest in it)."""

    def before(self, pass_, graph, ctx, record):
        profiling.enter(f"pass {pass_.name}")

    def after(self, pass_, graph, ctx, result, record):
        profiling.leave(f"pass {pass_.name}")


class Progress(PassInstrument):
    """Calls ``on_pass(pass_name, round, index, total)`` before every application (``index``:
    the pass's position in the pipeline, ``total``: the pipeline's length)."""

    def __init__(self, on_pass: Callable[[str, int, int, int], None]):
        self.on_pass = on_pass
        self._runs: list[list[Pass]] = []  # one pass list per running manager (nested ones may share this)

    def enter(self, manager, graph, ctx):
        self._runs.append(list(manager.passes))

    def before(self, pass_, graph, ctx, record):
        passes = self._runs[-1]
        index = next(k for k, p in enumerate(passes) if p is pass_)
        self.on_pass(pass_.name, record.round, index, len(passes))

    def exit(self, manager, graph, ctx):
        self._runs.pop()


class ApplicationLimit(PassInstrument):
    """Stops the run after ``max_applications`` applications that changed the graph (LLVM's
    ``-opt-bisect-limit``; ``graphpass bisect`` searches over it). Rolled-back applications do
    not count."""

    def __init__(self, max_applications: int | None):
        self.max_applications = max_applications
        self.applied = 0

    def enter(self, manager, graph, ctx):
        self.applied = 0
        self._last = None

    def should_run(self, pass_, graph, ctx):
        if self._last is not None:  # the previous application's record is final now
            self.applied += bool(self._last.modified)
            self._last = None
        return self.max_applications is None or self.applied < self.max_applications

    def before(self, pass_, graph, ctx, record):
        self._last = record


class ContractCheck(PassInstrument):
    """Checks that an application that returned ``modified=False`` left the graph's structure
    unchanged (a fingerprint before and after; :class:`PassContractError` otherwise).

    ``enabled``: None decides at the start of the run: on for graphs up to
    ``CONTRACT_CHECK_MAX_NODES`` nodes (and 4x as many node inputs and outputs)."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = enabled

    def enter(self, manager, graph, ctx):
        on = self.enabled
        if on is None:  # counted in node inputs and outputs too: one Split of 100,000 outputs is no small graph
            nodes = count_nodes(graph)
            edges = sum(len(n.inputs) + len(n.outputs) for g in iter_graphs(graph) for n in g.nodes)
            on = nodes <= CONTRACT_CHECK_MAX_NODES and edges <= 4 * CONTRACT_CHECK_MAX_NODES
        self.on = on

    def before(self, pass_, graph, ctx, record):
        self._before = fingerprint(graph) if self.on else None

    def after(self, pass_, graph, ctx, result, record):
        if self._before is not None and not result.modified and fingerprint(graph) != self._before:
            raise PassContractError(f"pass '{pass_.name}' changed the graph but returned modified=False")


def standard_instruments(
    *,
    target: "Target | str | None" = None,
    cost_options: dict[str, Any] | None = None,
    verify_each: bool = False,
    seed: int = 0,
    input_shapes: dict[str, list[int]] | None = None,
    dump_dir: str | Path | None = None,
    on_pass: Callable[[str, int, int, int], None] | None = None,
    max_applications: int | None = None,
    check_contract: bool | None = None,
) -> list[PassInstrument]:
    """The instruments ``graphpass.optimize`` runs with, in nesting order (outermost first)."""
    out: list[PassInstrument] = []
    if on_pass is not None:
        out.append(Progress(on_pass))
    if max_applications is not None:
        out.append(ApplicationLimit(max_applications))
    if dump_dir is not None:
        out.append(DumpIR(dump_dir))
    if verify_each:
        out.append(VerifyEach(seed=seed, input_shapes=input_shapes))
    out.append(CostVeto(target, cost_options))
    if check_contract is not False:
        out.append(ContractCheck(check_contract))
    out.append(PassTiming())
    return out
