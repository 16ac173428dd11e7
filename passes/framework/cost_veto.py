"""The cost veto: the instrument that estimates every application with the run's cost model
and rolls back a scored one that makes the estimate worse (see :class:`CostVeto`)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.base import CostModel
from graphpass.cost_model.target import Target
from graphpass.passes.framework.forked_estimate import (
    _AWAITED, _AwaitedPlacement, _ChildEstimate, fork_blocker,
)
from graphpass.passes.framework.instrument_base import ESTIMATE_EACH_MAX_NODES, PassInstrument, not_the_pass
from graphpass.passes.framework.pass_base import Pass
from graphpass.ir import annotations as A, model_io, profiling
from graphpass.ir.journal import Journal
from graphpass.ir.graph import count_nodes

__all__ = ["CostVeto"]

log = logging.getLogger(__name__)

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
                try:
                    report = child.result()
                except Exception as e:
                    # the estimate's own error, as inline (raised by enter, before any pass): the
                    # manager does not make it the failure of the pass it happens to surface in
                    raise not_the_pass(e)
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
