"""The incremental Ascend estimate: the cost of a graph after a pass, in time proportional to
what the pass changed (issue 22).

:class:`IncrementalEstimate` keeps the state of one fresh walk of
:class:`~graphpass.cost_model.ascend.AscendCostModel` (per node: its walk entry, a compact tuple;
per tensor: storage format, producer engine, compile-time constant, fp16 storage, shape, folded
value; the implicit TransData and engine crossings each tensor's readers demand; each node's
figure after fusion) and updates it from the nodes a pass touched
(:meth:`graphpass.ir.journal.Journal.touched_nodes`, and the producers and readers of the
tensors it touched, annotations included):

1. the touched nodes are walked again (``AscendCostModel._step``, the very code of the fresh
   walk) in graph order; a node's readers are walked again only while its outputs' state
   (format, engine, constant, fp16, shape, folded value) differs from the cached one;
2. an implicit TransData or crossing is priced again when its set of demanders changed
   (the first demander in graph order prices it, as in the fresh walk);
3. UB fusion: the groups that hold a node walked again or next to one (two tensor hops: a
   chain step looks at a reader and at a Swish diamond's second reader) are formed again,
   in graph order, from their nodes; a re-formed chain that would reach into an unaffected
   group, or a node whose group changed next to an unaffected group, re-fuses the whole graph
   (counted: ``refuse_full``);
4. the total is ``math.fsum`` of every node's figure, of every TransData and crossing and of
   the step term, as the fresh estimate sums them: the two are equal, not close.

A full estimate (counted in ``full_estimates``, with its reason in ``fallbacks``) replaces the
update when something global changed: the graph's inputs or outputs, whether all inputs are
static, subgraphs or local functions (a graph with control flow is always estimated in full),
a data-dependent (host-scheduled) region, or a node order that is not topological.
:meth:`rollback` puts back the entries an update replaced (an undo log of the state it wrote).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.ascend import _PLAIN, AscendCostModel, _item_of, _Item
from graphpass.cost_model.report import CostReport
from graphpass.ir import annotations as A
from graphpass.ir.graph import iter_graphs, subgraphs_of
from graphpass.ir.shapes import given_shapes

__all__ = ["IncrementalEstimate", "FULL_FRACTION"]

_MISSING = object()
_OUT = -1  # the demander id of "graph output" (after every node)

#: An edit that touched more than this share of the nodes is estimated in full: walking again
#: most of the graph with the undo log costs more than one fresh walk.
FULL_FRACTION = 0.2


class _Fallback(Exception):
    """The update cannot be incremental: estimate in full."""


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


class IncrementalEstimate:
    """The estimate of one graph kept current across edits (see the module docstring).

    ``IncrementalEstimate(model, graph, **options)`` estimates ``graph`` in full; then
    ``update(graph, touched_nodes, touched_tensors)`` after each edit gives the new report
    (totals, breakdown, crossings; no per-node records) and :attr:`engines` (node id -> (engine,
    why not AI Core)); :meth:`rollback` undoes the last update, :meth:`commit` keeps it.
    """

    def __init__(self, model: AscendCostModel, graph: gs.Graph, *, node_records: bool = False,
                 full_fraction: float | None = FULL_FRACTION, **options: Any):
        self.m = model
        self.full_fraction = full_fraction  # None: every edit updated (the development check's choice)
        self.options = options
        self.full_estimates = 0
        self.updates = 0
        self.refuse_full: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self._undo: list | None = None
        self._saved: set | None = None
        self.enabled = True  # False once a walk met subgraphs or a host-scheduled region
        # the state is built lazily, by the first update that can be incremental (an edit of a
        # large part of the graph is estimated plainly: the state would not be used)
        self._full(graph, node_records=node_records, keep=full_fraction is None)

    @classmethod
    def deferred(cls, model: AscendCostModel, graph: gs.Graph, **options: Any) -> "IncrementalEstimate":
        """The state a plain full estimate of ``graph`` leaves (``full_fraction`` the default),
        its report and engines not made yet: :meth:`adopt` gives them (made elsewhere: the cost
        veto estimates the graph in a forked child, see
        ``graphpass.passes.framework.instruments.CostVeto``). Until then :attr:`report` and
        :attr:`engines` are None; a full estimate (:meth:`full`) replaces the state as usual."""
        self = cls.__new__(cls)
        self.m = model
        self.full_fraction = FULL_FRACTION
        self.options = options
        self.full_estimates = 0
        self.updates = 0
        self.refuse_full = Counter()
        self.fallbacks = Counter()
        self.enabled = True
        self._defer(graph)
        return self

    def defer(self, graph: gs.Graph, reason: str) -> None:
        """As :meth:`full` (counted under ``reason``) and :meth:`commit`, the estimate itself
        made elsewhere and given by :meth:`adopt` (see :meth:`deferred`)."""
        self.fallbacks[reason] += 1
        self._defer(graph)

    def _defer(self, graph: gs.Graph) -> None:
        self._undo = self._saved = self._before_full = None
        self.fresh = True  # as _full(keep=False) leaves the state
        self.unseen = False
        self.engines = self.report = self.total = None
        self.valid = False
        self.cx = self.w = self.entries = self.us_of = self.head_of = self.groups = None
        self.conv = self.cross = self.conv_us = self.cross_rec = None
        self._io, self._order = self._io_key(graph), list(map(id, graph.nodes))
        self._deferred = True

    def adopt(self, report: CostReport, engines: dict | None, current: bool) -> None:
        """A deferred estimate's figures (see :meth:`deferred`), counted as the full estimate it
        is; ``current``: the estimate the state was deferred for, which becomes the state's
        report and engines unless an estimate has replaced the state since."""
        self.full_estimates += 1
        if current and self.__dict__.get("_deferred"):
            self._deferred = False
            self.engines, self.report, self.total = engines, report, report.total_us

    # -- the full estimate ------------------------------------------------------------------

    def full(self, graph: gs.Graph, reason: str) -> CostReport:
        """Estimate ``graph`` afresh (counted under ``reason``); the state for updates is built
        by the next update that can use it."""
        return self._full(graph, reason=reason, keep=self.full_fraction is None)

    def stats(self) -> dict[str, Any]:
        """How the estimates were made: full ones (with the reasons of those after the first),
        incremental updates, whole-graph re-fusions in an update."""
        return {"full": self.full_estimates, "incremental": self.updates, "refuse_full": dict(self.refuse_full),
                "fallbacks": dict(self.fallbacks)}

    def _full(self, graph: gs.Graph, node_records: bool = False, reason: str | None = None,
              keep: bool = True) -> CostReport:
        """A fresh estimate; ``keep``: with the state updates start from (else the plain
        estimate only: the next update that can be incremental builds the state first)."""
        if reason is not None:
            self.fallbacks[reason] += 1
        self.full_estimates += 1
        self._undo = None
        self._deferred = False  # (the state is this estimate's: see adopt)
        self.fresh = True  # self.report (a full report) is a fresh estimate's
        self.unseen = False
        if not keep:
            self.engines, report = self.m.placement(graph, node_records=node_records, **self.options)
            self.report, self.total = report, report.total_us
            self.valid = False
            self.cx = self.w = self.entries = self.us_of = self.head_of = self.groups = None
            self.conv = self.cross = self.conv_us = self.cross_rec = None
            self._io, self._order = self._io_key(graph), list(map(id, graph.nodes))
            return report
        self.valid = True  # the state describes the graph
        capture: dict[int, tuple] = {}
        out: list = []
        report = self.m.placement_report(graph, capture, out, None, node_records, self.options)
        cx = out[0]
        self.cx = cx
        self.engines = cx.engines  # kept current by the updates
        self.w = cx.top_walk
        self.entries = capture
        # (local functions do not enter the estimate: a function-call node is priced by its op)
        self.enabled = not cx.dynamic_regions and len(list(iter_graphs(graph))) == 1
        self._io = self._io_key(graph)
        self._io_ids = ({id(t) for t in graph.inputs}, {id(t) for t in graph.outputs})  # (fixed while _io is)
        self._order = list(map(id, graph.nodes))
        self.us_of = {id(it.node): it.us for it in cx.top_items if it.engine != "compile-time"}
        # the fusion groups: node id -> the head's node id; head id -> the members' node ids
        self.head_of: dict[int, int] = {}
        self.groups: dict[int, tuple[int, ...]] = {}
        for head, members in cx.fusion_groups:
            self.groups[head] = members
            for nid in members:
                self.head_of[nid] = head
        cx.top_items = []
        cx.fusion_groups = []
        cx.bytes = {}  # (kept small: see _update)
        cx.tcode = {}  # (tensor ids: coded again by each update's walk)
        self.w.sid = {}  # (as the codes)
        cx.nodes = []
        cx.implicit, cx.crossings = [], []
        # demands: (tensor id, want) -> {demander id: (tensor, have)}; (tensor id, engine) -> {id: (tensor, src, fp16)}
        self.conv: dict[tuple[int, str], dict[int, tuple]] = {}
        self.cross: dict[tuple[int, str], dict[int, tuple]] = {}
        self.conv_us: dict[tuple[int, str], float] = {}
        self.cross_rec: dict[tuple[int, str], dict[str, Any]] = {}
        pos = {nid: i for i, nid in enumerate(self._order)}
        for nid, (node, e, _, _) in capture.items():
            for t, have, want in e[7]:
                self.conv.setdefault((id(t), want), {})[nid] = (t, have)
            for t, src, c16 in e[8]:
                self.cross.setdefault((id(t), e[1]), {})[nid] = (t, src, c16)
        self._output_demands(graph, set(), set())
        for key in self.conv:
            self._price_conv(key, pos)
        for key in self.cross:
            self._price_cross(key, pos)
        self._step_us = self._step_term(graph)
        self.total = report.total_us
        self.report = report
        self._check_total(report)
        return report

    def _check_total(self, report: CostReport) -> None:
        """The kept terms sum to the fresh total (they are the same terms)."""
        if self.enabled and self._total() != report.total_us:
            self.enabled = False  # never expected: every later update is a full estimate
            self.fallbacks["terms differ from the fresh estimate"] += 1

    def _io_key(self, graph: gs.Graph) -> tuple:
        return (tuple(map(id, graph.inputs)), tuple(map(id, graph.outputs)), self.m.static_inputs(graph),
                tuple(sorted(given_shapes(graph)["dims"].items())))  # the dims --dim/--input-shape fixed

    def _step_term(self, graph: gs.Graph) -> float:
        step_us, _ = self.m._step_cost(graph, self.cx)
        return step_us / max(1, int(self.options.get("iterations_per_loop", 1) or 1))

    def _total(self) -> float:
        return math.fsum([*self.us_of.values(), *self.conv_us.values(),
                          *(r["us"] for r in self.cross_rec.values()), self._step_us])

    # -- pricing of the demands -----------------------------------------------------------

    @staticmethod
    def _first(demanders: dict[int, tuple], pos: dict[int, int]) -> tuple:
        best = min(demanders, key=lambda nid: pos.get(nid, math.inf) if nid != _OUT else math.inf)
        return demanders[best]

    def _price_conv(self, key: tuple[int, str], pos: dict[int, int]) -> None:
        dem = self.conv.get(key)
        if not dem:
            self._put(self.conv, key, _MISSING)
            self._put(self.conv_us, key, _MISSING)
            return
        t, have = self._first(dem, pos)
        l2 = self.m._transdata_l2(t, have, key[1], *self._io_ids, True)  # (as the fresh walk; the top graph)
        self._put(self.conv_us, key, self.m._transdata_us(t, have, key[1], self.cx, l2))

    def _price_cross(self, key: tuple[int, str], pos: dict[int, int]) -> None:
        dem = self.cross.get(key)
        if not dem:
            self._put(self.cross, key, _MISSING)
            self._put(self.cross_rec, key, _MISSING)
            return
        t, src, c16 = self._first(dem, pos)
        self._put(self.cross_rec, key, self.m._crossing(t, src, key[1], self.cx, c16))

    def _output_demands(self, graph: gs.Graph, conv_keys: set, cross_keys: set) -> None:
        """The graph outputs' demands (a TransData back to ND, a crossing back from the host)."""
        w = self.w
        for t in graph.outputs:
            for key, table, keys in (((id(t), "ND"), self.conv, conv_keys), ((id(t), "AICORE"), self.cross, cross_keys)):
                dem = table.get(key)
                if dem is not None and _OUT in dem:
                    self._put_demand(table, key, _OUT, _MISSING)
                    keys.add(key)
            have = w.fmt.get(id(t), "ND")
            if have not in _PLAIN:
                self._put_demand(self.conv, (id(t), "ND"), _OUT, (t, have))
                conv_keys.add((id(t), "ND"))
            if w.engine_of.get(id(t)) == "HOST":
                self._put_demand(self.cross, (id(t), "AICORE"), _OUT, (t, "HOST", True))
                cross_keys.add((id(t), "AICORE"))

    # -- the undo log ---------------------------------------------------------------------

    def _put(self, table: dict, key: Any, value: Any) -> None:
        """``table[key] = value`` (``_MISSING``: delete), the old value saved for a rollback."""
        undo = self._undo
        if undo is not None:
            mark = (id(table), key)
            if mark not in self._saved:
                self._saved.add(mark)
                undo.append((table, key, table.get(key, _MISSING)))
        if value is _MISSING:
            table.pop(key, None)
        else:
            table[key] = value

    def _put_demand(self, table: dict, key: Any, nid: int, value: Any) -> None:
        dem = table.get(key)
        if self._undo is not None and (id(table), key) not in self._saved:
            dem = dict(dem) if dem is not None else {}  # copy on write: the old dict is the saved one
            self._put(table, key, dem)
        elif dem is None:
            dem = {}
            self._put(table, key, dem)
        if value is _MISSING:
            dem.pop(nid, None)
        else:
            dem[nid] = value

    def _save_tensor(self, tid: int) -> None:
        """Save every per-tensor entry of ``tid`` (format, engine, constant, fp16, shape, folded
        value) before the update writes one (bytes are a cache of shape and dtype, emptied by
        every update instead)."""
        w, cx = self.w, self.cx
        for table in (w.fmt, w.engine_of, cx.shapes, cx.values):
            self._put(table, tid, table.get(tid, _MISSING))
        for s in (w.const, w.half):
            mark = (id(s), tid)
            if mark not in self._saved:
                self._saved.add(mark)
                self._undo.append((s, tid, tid in s))

    def _purge_tensor(self, tid: int, lazy_only: bool = False) -> None:
        self._save_tensor(tid)
        w, cx = self.w, self.cx
        cx.shapes.pop(tid, None)
        cx.tcode.pop(tid, None)
        w.sid.pop(tid, None)
        if not lazy_only:
            cx.values.pop(tid, None)
            w.fmt.pop(tid, None)
            w.engine_of.pop(tid, None)
            w.const.discard(tid)
            w.half.discard(tid)

    def _tensor_state(self, tid: int) -> tuple:
        w, cx = self.w, self.cx
        return (w.fmt.get(tid), w.engine_of.get(tid), tid in w.const, tid in w.half, cx.shapes.get(tid),
                cx.values.get(tid))

    @staticmethod
    def _same_state(a: tuple, b: tuple) -> bool:
        return a[:5] == b[:5] and _same_value(a[5], b[5])

    def commit(self) -> None:
        """Keep the last update (drop its undo log)."""
        self._undo = self._saved = self._before_full = None

    def rollback(self) -> None:
        """Undo the last update: the state describes the graph as it was before it (the caller
        has rolled the graph back)."""
        before = self.__dict__.get("_before_full")
        if before is not None:  # the update was a full estimate: the state before it, the counts kept
            counts = (self.full_estimates, self.updates, self.refuse_full, self.fallbacks)
            self.__dict__.clear()
            self.__dict__.update(before)
            self.full_estimates, self.updates, self.refuse_full, self.fallbacks = counts
            self._undo = self._saved = self._before_full = None
            return
        undo = self._undo
        if undo is None:  # nothing to undo (a no-op update, or committed)
            return
        for table, key, old in reversed(undo):
            if isinstance(table, set):
                if old:
                    table.add(key)
                else:
                    table.discard(key)
            elif old is _MISSING:
                table.pop(key, None)
            else:
                table[key] = old
        self.report, self.total, self._step_us, self._io, self._order, self.enabled, self.fresh = self._kept
        self._undo = self._saved = None
        self.cx.tcode = {}  # codes by tensor id of the undone walk (the next update codes its tensors again)
        self.w.sid = {}

    # -- the update -----------------------------------------------------------------------

    def update(self, graph: gs.Graph, touched_nodes: "list[gs.Node]", touched_tensors: "list[gs.Tensor]",
               changed_tensors: "list[gs.Tensor] | None" = None) -> CostReport:
        """The report of ``graph`` after an edit that touched these nodes and tensors (all of
        them: see :meth:`graphpass.ir.journal.Journal.touched_nodes`; ``changed_tensors``, those
        of them whose shape, dtype, values or annotations changed, default all); undo with
        :meth:`rollback`. An edit that touched more than ``FULL_FRACTION`` of the nodes is
        estimated in full (as fast, and nothing to undo)."""
        self._before_full = None
        if not self.enabled:
            return self._full_update(graph, "graph with subgraphs or a host-scheduled region", keep=False)
        if self.unseen:  # edits were made that no update saw
            return self._full_update(graph, "edits no update saw", keep=not self.large(graph, len(touched_nodes)))
        changed = touched_tensors if changed_tensors is None else changed_tensors
        objs: dict[int, gs.Node] = {}
        for n in touched_nodes:
            objs[id(n)] = n
        for t in changed:
            for n in (*t.inputs, *t.outputs):
                objs[id(n)] = n
        if self.full_fraction is not None and len(objs) > self.full_fraction * len(graph.nodes):
            return self._full_update(graph, "the edit touched a large part of the graph", keep=False)
        if self._io_key(graph) != self._io:
            return self._full_update(graph, "graph inputs or outputs changed", keep=self.valid)
        if not objs and self.valid and list(map(id, graph.nodes)) == self._order:
            # nothing the estimate reads changed (rewired tensors mean touched nodes); only when the
            # state is kept: after a plain estimate, edits of applications that reported no change
            # were let go (CostVeto._add_pending), and the kept report may not describe the graph
            self._kept = None
            self.updates += 1
            return self.report
        if not self.valid:  # the last estimate was a plain one: build the state now
            return self._full_update(graph, "state built after a plain full estimate")
        self._kept = (self.report, self.total, self._step_us, self._io, self._order, self.enabled, self.fresh)
        self._undo, self._saved = [], set()
        try:
            report = self._update(graph, objs, touched_tensors, changed)
        except _Fallback as e:
            self.rollback()
            return self._full_update(graph, str(e))
        self.updates += 1
        self.fresh = False
        return report

    def large(self, graph: gs.Graph | None, edits: int) -> bool:
        """Whether an edit that saved ``edits`` nodes and tensors is estimated in full without
        listing what it touched (twice ``full_fraction`` of the nodes: a tensor and its producer
        are two edits). ``graph`` None: against the node count of the last estimate."""
        if self.full_fraction is None:
            return False
        n = len(graph.nodes) if graph is not None else len(self._order)
        return edits > 2 * self.full_fraction * n

    def full_update(self, graph: gs.Graph, reason: str) -> CostReport:
        """An update by a plain full estimate (counted under ``reason``); undone by :meth:`rollback`."""
        self._before_full = None
        return self._full_update(graph, reason, keep=False)

    def _full_update(self, graph: gs.Graph, reason: str, keep: bool = True) -> CostReport:
        """An update by a full estimate; the state before it is kept (by reference: the full
        estimate builds new tables) for a rollback."""
        before = dict(self.__dict__)
        report = self._full(graph, reason=reason, keep=keep)
        self._before_full = before
        return report

    def _update(self, graph, objs, touched_tensors, changed) -> CostReport:
        m, cx, w = self.m, self.cx, self.w
        cx.bytes = {}  # a cache of shape and dtype: only what this update reads is computed again
        cx.tcode = {}  # the tensors' signature codes, by id: as the bytes (the codes themselves are kept)
        w.sid = {}  # (the numbers of the tensors' states in template keys, by id: as the codes)
        nodes = graph.nodes
        order = list(map(id, nodes))
        pos = {nid: i for i, nid in enumerate(order)}
        if len(pos) != len(order):
            raise _Fallback("a node listed twice")
        graph_inputs = {id(t) for t in graph.inputs}
        seeds: dict[int, gs.Node] = {}  # where the fusion groups may change: readers and producers rewired
        for t in touched_tensors:
            for n in (*t.inputs, *t.outputs):
                if id(n) in pos:
                    seeds[id(n)] = n
        for n in objs.values():
            if id(n) in pos and subgraphs_of(n):
                raise _Fallback("a node with subgraphs changed")
        live = sorted((nid for nid in objs if nid in pos), key=pos.__getitem__)
        reordered = False
        if order != self._order:  # nodes added, removed or moved: the walk order must stay topological
            old_ids = set(self._order)
            reordered = [nid for nid in order if nid in old_ids] != [nid for nid in self._order if nid in pos]
            for i, n in enumerate(nodes):
                for t in n.inputs:
                    for p in t.inputs:
                        if pos.get(id(p), -1) >= i:
                            raise _Fallback("node order not topological")
        self._put(self.__dict__, "_order", order)

        # 1. forget what the touched nodes' old entries said (the readers are compared against it)
        old_state: dict[int, tuple] = {}
        out_tensors: dict[int, gs.Tensor] = {}  # tensors whose producer's entry is dropped
        conv_keys: set = set()
        cross_keys: set = set()
        for nid in objs:
            old = self.entries.get(nid)
            if old is None:
                continue
            _, e, ins, outs = old
            for t in (*ins, *outs):
                for n in (*t.inputs, *t.outputs):
                    if id(n) in pos:
                        seeds[id(n)] = n
            for t in outs:
                if id(t) not in old_state:
                    old_state[id(t)] = self._tensor_state(id(t))
                    out_tensors[id(t)] = t
                self._purge_tensor(id(t))
            for t in ins:
                if not t.inputs and id(t) not in graph_inputs:  # a weight: its lazy caches (its id may be recycled)
                    self._purge_tensor(id(t), lazy_only=True)
            self._drop_demands(nid, e, conv_keys, cross_keys)
            self._put(self.entries, nid, _MISSING)
            self._put(cx.engines, nid, _MISSING)
            self._put(self.us_of, nid, _MISSING)
        for t in changed:
            if id(t) in graph_inputs:  # its state as the walk starts it (its readers are walked again)
                self._purge_tensor(id(t))
                w.fmt[id(t)] = A.get_format(t) or "ND"  # (its state's number purged with it)
                w.engine_of[id(t)] = "AICORE"
            elif not t.inputs:
                self._purge_tensor(id(t), lazy_only=True)
        for nid in live:
            n = objs[nid]
            for t in n.outputs:
                if id(t) not in old_state:
                    old_state[id(t)] = self._tensor_state(id(t))
                    out_tensors[id(t)] = t
                self._purge_tensor(id(t))
            for t in n.inputs:
                if not t.inputs and id(t) not in graph_inputs:
                    self._purge_tensor(id(t), lazy_only=True)
                else:
                    self._save_tensor(id(t))  # the walk caches its shape and bytes

        # 2. walk the dirty cone in graph order
        heap = [pos[nid] for nid in live]
        heapq.heapify(heap)
        queued = set(live)
        walked: list[int] = []
        done_max = -1
        for tid, t in out_tensors.items():  # tensors no node produces any more: their readers see the default
            prod = t.inputs[0] if t.inputs else None
            if prod is None or id(prod) not in pos:
                if not self._same_state(old_state[tid], self._tensor_state(tid)):
                    for c in t.outputs:
                        if id(c) in pos and id(c) not in queued:
                            queued.add(id(c))
                            heapq.heappush(heap, pos[id(c)])
                            objs[id(c)] = c
        while heap:
            i = heapq.heappop(heap)
            if i <= done_max:
                continue
            done_max = i
            node = nodes[i]
            nid = id(node)
            objs[nid] = node
            old = self.entries.get(nid)
            if old is not None:  # a reader walked again because an input's state changed
                _, e_old, ins, outs = old
                for t in outs:
                    if id(t) not in old_state:
                        old_state[id(t)] = self._tensor_state(id(t))
                        out_tensors[id(t)] = t
                    self._purge_tensor(id(t))
                for t in node.inputs:
                    self._save_tensor(id(t))
                self._drop_demands(nid, e_old, conv_keys, cross_keys)
            self._put(cx.engines, nid, cx.engines.get(nid, _MISSING))  # the step writes it
            e = m._step(node, w, cx)
            if cx.dynamic_regions:
                raise _Fallback("a host-scheduled region")
            if e[1] == "compile-time":
                cx.engines.pop(nid, None)
            self._put(self.entries, nid, (node, e, tuple(node.inputs), tuple(node.outputs)))
            for t, have, want in e[7]:
                self._put_demand(self.conv, (id(t), want), nid, (t, have))
                conv_keys.add((id(t), want))
            for t, src, c16 in e[8]:
                self._put_demand(self.cross, (id(t), e[1]), nid, (t, src, c16))
                cross_keys.add((id(t), e[1]))
            walked.append(nid)
            for t in node.outputs:
                tid = id(t)
                if t.name and not isinstance(t, gs.Constant):
                    m._shape(t, cx)
                if not self._same_state(old_state.get(tid, (None,) * 6), self._tensor_state(tid)):
                    for c in t.outputs:
                        j = pos.get(id(c))
                        if j is None:
                            continue
                        if j <= i:
                            raise _Fallback("node order not topological")
                        if id(c) not in queued:
                            queued.add(id(c))
                            heapq.heappush(heap, j)
        self._output_demands(graph, conv_keys, cross_keys)
        for t in graph.outputs:
            self._save_tensor(id(t))
        for t in graph.inputs:
            self._save_tensor(id(t))
        for key in conv_keys:
            self._price_conv(key, pos)
        for key in cross_keys:
            self._price_cross(key, pos)
        if len(self.entries) != len(order):
            raise _Fallback("the cache lost track of a node")

        # 3. fusion and the nodes' figures
        removed = [nid for nid in objs if nid not in pos]
        self._refuse(graph, nodes, pos, walked, removed, objs, reordered, seeds)
        self._put(self.__dict__, "_step_us", self._step_term(graph))
        total = self._total()
        self.total = total
        self.report = self._report(total)
        return self.report

    def _drop_demands(self, nid: int, e: tuple, conv_keys: set, cross_keys: set) -> None:
        for t, _, want in e[7]:
            self._put_demand(self.conv, (id(t), want), nid, _MISSING)
            conv_keys.add((id(t), want))
        for t, _, _ in e[8]:
            self._put_demand(self.cross, (id(t), e[1]), nid, _MISSING)
            cross_keys.add((id(t), e[1]))

    # -- fusion ---------------------------------------------------------------------------

    def _neighbours(self, node: gs.Node, pos: dict[int, int], hops: int) -> list[gs.Node]:
        out = [node]
        frontier = [node]
        for _ in range(hops):
            nxt = []
            for n in frontier:
                for t in n.inputs:
                    nxt.extend(p for p in t.inputs if id(p) in pos)
                for t in n.outputs:
                    nxt.extend(c for c in t.outputs if id(c) in pos)
            out.extend(nxt)
            frontier = nxt
        return out

    def _refuse(self, graph, nodes, pos, walked, removed, objs, reordered, seeds) -> None:
        """Form again the fusion groups near the walked nodes and price them (see the module
        docstring); the whole graph when the change reaches beyond them."""
        m, cx = self.m, self.cx
        if not cx.fusion:
            for nid in walked:
                self._set_figure(nid, _item_of(objs[nid], self.entries[nid][1]))
            return
        if reordered:  # the greedy order of the chains changed
            return self._refuse_all(graph, nodes, pos, "nodes reordered")
        # the groups to form again: those of the removed and walked nodes and of their neighbours
        heads: set[int] = set()
        for nid in removed:
            h = self.head_of.get(nid)
            if h is not None:
                heads.add(h)
        for start in (*(objs[nid] for nid in walked), *seeds.values()):
            for n in self._neighbours(start, pos, 2):
                h = self.head_of.get(id(n))
                if h is not None:
                    heads.add(h)
        members: set[int] = set(walked)
        for h in heads:
            members.update(self.groups.get(h, ()))
        members = {nid for nid in members if nid in pos}
        if len(members) * 4 > len(pos):
            return self._refuse_all(graph, nodes, pos, "a quarter of the graph changed")
        items = [_item_of(nodes[i], self.entries[id(nodes[i])][1]) for i in sorted(pos[nid] for nid in members)]
        by_id = {id(it.node): it for it in items}
        old_head = {nid: self.head_of.get(nid) for nid in by_id}
        for h in heads:  # forget the old groups
            for nid in self.groups.get(h, ()):
                self._put(self.head_of, nid, _MISSING)
            self._put(self.groups, h, _MISSING)
        outside = _Outside(by_id, pos, self.entries)
        groups = m._fuse(items, graph, cx, self.w.const, outside=outside, fmt=self.w.fmt, top_graph=True)
        if outside.reached:
            return self._refuse_all(graph, nodes, pos, "a chain reached a group not formed again")
        for group in groups:
            ids = tuple(id(it.node) for it in group)
            self._put(self.groups, ids[0], ids)
            for nid in ids:
                self._put(self.head_of, nid, ids[0])
        # a group not formed again sees a node formed again as taken (fused by an earlier head) or
        # free when its chain reaches it: where that changed, it may form otherwise
        for it in items:
            nid = id(it.node)
            old, new = old_head[nid], self.head_of.get(nid)
            if old == new:
                continue
            if old is not None and old != nid and old not in pos:
                return self._refuse_all(graph, nodes, pos, "a fused node's head removed")
            for n in self._neighbours(it.node, pos, 2):
                h = self.head_of.get(id(n))
                if h is None or id(n) in by_id or h in by_id:
                    continue
                ph = pos[h]
                was = old is not None and old != nid and pos[old] < ph
                now = new is not None and new != nid and pos[new] < ph
                if was != now:
                    return self._refuse_all(graph, nodes, pos, "a neighbouring group may form otherwise")
        for it in items:
            self._set_figure(id(it.node), it)

    def _refuse_all(self, graph, nodes, pos, reason: str) -> None:
        self.refuse_full[reason] += 1
        items = [_item_of(n, self.entries[id(n)][1]) for n in nodes]
        for table in (self.head_of, self.groups):
            for key in list(table):
                self._put(table, key, _MISSING)
        for group in self.m._fuse(items, graph, self.cx, self.w.const, fmt=self.w.fmt, top_graph=True):
            ids = tuple(id(it.node) for it in group)
            self._put(self.groups, ids[0], ids)
            for nid in ids:
                self._put(self.head_of, nid, ids[0])
        for it in items:
            self._set_figure(id(it.node), it)

    def _set_figure(self, nid: int, it: _Item) -> None:
        """The node's figure after fusion and ``[op_scale]`` (as ``AscendCostModel._contributions``)."""
        if it.engine == "compile-time":
            self._put(self.us_of, nid, _MISSING)
            return
        us = it.us
        scale = self.m.profile.op_scale
        if scale and us and it.node.op in scale:
            us *= scale[it.node.op]
        if self.us_of.get(nid, _MISSING) != us:
            self._put(self.us_of, nid, us)

    # -- the report -----------------------------------------------------------------------

    def final_report(self) -> CostReport:
        """The report of the graph as it is, with what the optimize report reads of a full one
        (total, breakdown, TransData counts and time, crossings) but no per-node records: the
        one walk over the kept entries this takes (the explicit TransData nodes) is done here,
        once, not in each update. A fresh (full) report when the state is not kept."""
        if self.fresh or not self.valid:
            return self.report
        explicit = [self.us_of[nid] for nid, (_, e, _, _) in self.entries.items()
                    if e[0] is not None and e[0].cost == "transdata" and nid in self.us_of]
        report = self._report(self.total)
        report.transdata = {"explicit": len(explicit), "implicit": len(self.conv_us),
                            "us": math.fsum([*explicit, *self.conv_us.values()])}
        report.transdata["share"] = report.transdata["us"] / self.total if self.total else 0.0
        return report


    def _report(self, total: float) -> CostReport:
        implicit = math.fsum(self.conv_us.values()) if self.conv_us else 0  # (0 when none, as the fresh estimate)
        crossings = list(self.cross_rec.values())
        cross = math.fsum(r["us"] for r in crossings) if crossings else 0
        return CostReport(
            target=self.m.target, total_us=total, precision_mode=self.cx.mode, iterations_per_loop=max(1, int(self.options.get("iterations_per_loop", 1) or 1)),
            breakdown_us={"nodes": math.fsum(self.us_of.values()), "implicit_transdata": implicit, "crossings": cross,
                          "step": self._step_us},
            transdata={"implicit": len(self.conv_us), "us": implicit},
            crossings=crossings,
            assumptions=["an incremental estimate: totals only (per-node records in a full estimate)"],
        )


class _Outside:
    """What the local re-fusion may not touch: the nodes of the groups it does not form again.
    ``readers(t)`` gives a tensor's readers as items (those of the nodes formed again, made
    once for the others); a chain that would take in one of the others sets ``reached`` (the
    caller then fuses the whole graph)."""

    __slots__ = ("inside", "reached", "pos", "entries", "made", "lists")

    def __init__(self, inside: dict[int, _Item], pos: dict[int, int], entries: dict[int, tuple]):
        self.inside, self.pos, self.entries = inside, pos, entries
        self.reached = False
        self.made: dict[int, _Item] = {}
        self.lists: dict[int, list[_Item]] = {}

    def item(self, node: gs.Node) -> _Item:
        nid = id(node)
        it = self.inside.get(nid) or self.made.get(nid)
        if it is None:
            it = self.made[nid] = _item_of(node, self.entries[nid][1])
        return it

    def readers(self, t: gs.Tensor, default: Any = None) -> Any:
        hit = self.lists.get(id(t))
        if hit is None:
            pos = self.pos
            nodes = {id(c): c for c in t.outputs if id(c) in pos}
            hit = []
            for c in sorted(nodes.values(), key=lambda c: pos[id(c)]):
                it = self.item(c)
                hit.extend(it for x in c.inputs if x is t)
            self.lists[id(t)] = hit
        return hit if hit else default
