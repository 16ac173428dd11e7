"""PassManager: runs a pipeline to a bounded fixed point and records what each pass did.

The manager is itself a :class:`~graphpass.infra.pass_base.Pass`: ``manager(model, ctx)``
returns a :class:`ManagerResult` (a ``PassResult`` with the records). Its loop only runs the
passes, re-sorts after a pass that does not keep the order, numbers the applications that
changed the graph and turns an exception inside a pass into a ``PassError`` that names the pass
and the passes that ran before it. Everything else (the cost veto with rollback,
verify-each, dumps, timing, progress, the bisect limit, the ``modified`` honesty check) is an
instrument (:mod:`graphpass.infra.instruments`).

The caller's :class:`PassContext` is only read: the passes get a copy whose
``explanations`` are the run's own (returned in the result).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Sequence

import onnx_graphsurgeon as gs

from graphpass.errors import GraphpassError, PassError
from graphpass.passes.framework.context import Explanation, PassContext
from graphpass.passes.framework.instrument_base import is_not_the_pass
from graphpass.passes.framework.instruments import CONTRACT_CHECK_MAX_NODES, ESTIMATE_EACH_MAX_NODES, PassInstrument
from graphpass.passes.framework.pass_base import (EDITS, EXACT, MERGE_EQUAL_CONSTANTS, Pass, PassContractError, PassKind,
                                                  PassResult, graph_of)
from graphpass.passes.framework.registry import get_pass
from graphpass.ir import lean, model_io
from graphpass.ir.graph import (CONTROL_FLOW_OPS, SUBGRAPHLESS_DOMAINS, count_nodes, fingerprint, iter_graphs, op_types,
                                toposort)
from graphpass.ir.journal import all_graphs, flat_graph, graphs_made, known_graphs
from graphpass.ir.shapes import count_unresolved, refresh_shapes, shape_epoch

#: from this many nodes, what a run removes is released at its end (see apply_to); a smaller
#: graph's garbage is small (the collector's closing sweep is for 20k nodes and more too)
_RELEASE_NODES = 20_000

#: the module prefix of graphpass's own passes (trusted under journal.flat_graph)
_OWN_PASSES = "graphpass.passes."

#: the kinds of edit that keep every node's op type: a pass ``can_act`` refused still cannot act
_KEEP_OP_TYPES = frozenset({MERGE_EQUAL_CONSTANTS})

__all__ = ["PassRecord", "PassManager", "ManagerResult", "CONTRACT_CHECK_MAX_NODES", "ESTIMATE_EACH_MAX_NODES"]


@dataclasses.dataclass
class PassRecord:
    """One application of one pass."""

    index: int
    name: str
    round: int
    seconds: float
    nodes_before: int
    nodes_after: int
    modified: bool
    stats: dict[str, Any]
    cost_before_us: float | None = None
    cost_after_us: float | None = None
    rolled_back: bool = False
    note: str = ""
    #: number of this application among those that changed the graph (1-based; 0 = no change)
    application: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ManagerResult(PassResult):
    """What a pass-manager run did: one record per application, the passes skipped as
    disabled, and the explanations the passes recorded."""

    records: list[PassRecord] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    explanations: list[Explanation] = dataclasses.field(default_factory=list)
    #: passes left out because the run's target has no hardware facts: name -> why
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)


class PassManager(Pass):
    """Runs ``passes`` (names, classes or instances) over a model, in order, round after round.

    Rounds repeat until no pass changes the graph or ``max_rounds`` is reached; ``run_once``
    passes run in the first round only. Shapes are a fact the manager keeps true: after a round
    in which a pass changed the graph without re-inferring shapes itself, if some tensor's shape
    is unresolved (unknown, ``unk__N``, or a symbol no graph input carries), shapes are inferred
    again, once per round (one export), so the next round and the written model see them. Passes named in ``disabled`` are skipped and reported
    in ``result.skipped``. ``instruments`` hook into every application (see
    :mod:`graphpass.infra.instruments`); without any, the manager only runs the passes.

    A pass is not run on a version of the graph it cannot change: one it saw already and changed
    nothing on; one it made itself when it declares ``idempotent``; one whose only change since
    it changed nothing is an edit its result ``survives`` (:data:`~.pass_base.EDITS`: equal
    constants merged); one without its anchors (``can_act``). Each skip only leaves out an
    application that would have changed nothing; with ``GRAPHPASS_CHECK_SKIPS`` set (the suite
    sets it) the manager runs every application it skips on a declaration, unrecorded, and raises
    :class:`PassContractError` if one changes the graph.
    """

    name = "pass_manager"
    summary = "Run a pipeline of passes to a bounded fixed point."
    kind = PassKind.CLEANUP  # not a family of its own: a manager is never scored as a whole
    scored = False

    def __init__(self, passes: Sequence[str | type[Pass] | Pass], *, max_rounds: int = 4,
                 instruments: Iterable[PassInstrument] = (), disabled: Iterable[str] = ()):
        disabled = set(disabled)
        made = [_instance(p) for p in passes]
        self.skipped = [p.name for p in made if p.name in disabled]
        self.passes: list[Pass] = [p for p in made if p.name not in disabled]
        self.max_rounds = max_rounds
        self.instruments: list[PassInstrument] = list(instruments)

    @property
    def promise(self):  # type: ignore[override]
        """The loosest promise of the passes it runs (exact when all are)."""
        from graphpass.check import verify as V

        promises = [getattr(p, "promise", V.UNDECLARED) for p in self.passes]
        loose = [p for p in promises if not p.exact]
        return max(loose, key=lambda p: (not p.bounded, p.rtol, p.atol)) if loose else EXACT

    def __call__(self, model: Any, ctx: PassContext | None = None) -> ManagerResult:
        """Run the pipeline over ``model`` (a graphpass Model or a ``gs.Graph``, in place)."""
        return self.apply_to(model, graph_of(model), ctx if ctx is not None else PassContext())

    def apply_to(self, model: Any, graph: gs.Graph, ctx: PassContext) -> ManagerResult:
        self.requires(model)
        nodes = count_nodes(graph)
        # a big graph: the nodes and tensors the run removes and disconnects are handed back to
        # reference counting at its end (lean.release) instead of one full collection of the
        # caller's heap (100k CNN: ~2 s; the export's peak 40 MB lower, not higher)
        before = lean.members(all_graphs(graph)) if nodes >= _RELEASE_NODES and lean.installed() else None
        with model_io.gc_batched(nodes=0 if before is not None else nodes):
            result = self._loop(model, graph, ctx, nodes)
            if before is not None:
                lean.release(before, all_graphs(graph))
                before = None
        self.ensures(model)
        return result

    def run(self, graph: gs.Graph, ctx: PassContext | None = None) -> ManagerResult:
        return self.apply_to(graph, graph, ctx if ctx is not None else PassContext())

    # -- the loop --------------------------------------------------------------------------

    def _loop(self, model: Any, graph: gs.Graph, ctx: PassContext, nodes_now: int) -> ManagerResult:
        ctx = dataclasses.replace(ctx, explanations=[])  # the caller's context is only read
        instruments = self.instruments
        records: list[PassRecord] = []
        history: list[str] = []
        applied = 0
        # a pass that needs hardware facts cannot run under the 'none' target: left out, said why
        unavailable = {p.name: f"needs a hardware target (target '{ctx.target.name}' has none)"
                       for p in self.passes if p.needs_target and not ctx.target.has_hardware}
        for ins in instruments:
            ins.enter(self, graph, ctx)
        stale = False  # a pass changed the graph since shapes were last inferred
        futile = -1  # the unresolved count a manager refresh could not lower
        # the graph's version: one more per change (an application kept, a refresh of shapes); a
        # pass that changed nothing on a version is not run on it again (a pass is a function of
        # the graph and the context: the last round stops running once it reaches the passes that
        # already saw the final graph)
        version = 0
        clean: dict[int, int] = {}  # pass position -> the version it last ran on without a change
        # pass position -> the kinds of edit its last finding of nothing survives (a version made
        # by such an edit is one it cannot change either: clean on it too)
        survive: dict[int, frozenset[str]] = {}
        # pass position -> why it is clean on a version it did not run on (a declaration: checked
        # by running it anyway under GRAPHPASS_CHECK_SKIPS)
        declared: dict[int, str] = {}
        check_skips = os.environ.get("GRAPHPASS_CHECK_SKIPS", "") not in ("", "0")
        # (version, the graph's op types, its graphs): one walk per version, not one per application
        # for the undo log's start (journal.known_graphs) and another for the op types
        # (and the count of graphs made under a journal then: an application that reported no
        # change but made a body or a function leaves the version as it was, not the list)
        seen: tuple[int, frozenset[str], list[gs.Graph], int] = (-1, frozenset(), [], -1)
        for rnd in range(1, max(1, self.max_rounds) + 1):
            changed = False
            for k, p in enumerate(self.passes):
                if (p.run_once and rnd > 1) or p.name in unavailable:
                    continue
                if clean.get(k) == version:
                    if check_skips and k in declared:
                        _check_skip(p, model, graph, ctx, declared[k])
                    continue
                if seen[0] != version or seen[3] != graphs_made():
                    graphs, ops = _graphs_and_op_types(graph)
                    seen = (version, ops, graphs, graphs_made())
                if not p.can_act(seen[1], ctx):  # nothing it rewrites is in the graph
                    clean[k] = version
                    survive[k] = _KEEP_OP_TYPES  # (can_act reads the op types only)
                    declared.pop(k, None)
                    continue
                if not all(ins.should_run(p, graph, ctx) for ins in instruments):
                    continue
                rec = PassRecord(index=len(records) + 1, name=p.name, round=rnd, seconds=0.0,
                                 nodes_before=nodes_now, nodes_after=nodes_now, modified=False, stats={})
                try:
                    with known_graphs(graph, seen[2]):  # unchanged since: a pass that changed nothing left them
                        for ins in instruments:
                            ins.before(p, graph, ctx, rec)
                    epoch = shape_epoch(graph)
                    # no subgraph in it now: iter_graphs need not walk it while no body is made
                    graphs = seen[2]  # (the graph, its subgraphs, then the local functions with theirs)
                    fns = getattr(graph, "functions", None)
                    flat = len(graphs) == 1 or (fns and graphs[1] is fns[0])
                    # only graphpass's own passes: their bodies are made under the log (reviewed);
                    # a plugin's may come from a template built before the run, a deepcopy or a
                    # pickle of one, a graph attribute set in place, a node moved out of a local
                    # function: no gs.Graph is constructed then (tests/ir/test_flat_graph_attack.py)
                    flat = flat and type(p).__module__.startswith(_OWN_PASSES)
                    # (not flat: an outer manager's block on this graph, if any, is suspended too)
                    with flat_graph(graph, off=not flat):
                        result = p.apply_to(model, graph, ctx)
                        if isinstance(result, ManagerResult):  # a nested manager ran on its own copy
                            ctx.explanations.extend(result.explanations)
                        if result.modified and not p.preserves_order:
                            toposort(graph)
                        if result.modified:  # a pass that re-inferred shapes itself leaves them fresh
                            stale = shape_epoch(graph) == epoch
                        rec.modified, rec.stats = result.modified, dict(result.stats)
                        if result.modified:
                            rec.nodes_after = count_nodes(graph)
                    for ins in reversed(instruments):
                        ins.after(p, graph, ctx, result, rec)
                except GraphpassError as e:
                    _abort(instruments, p, graph, ctx, rec, e)
                    raise
                except Exception as e:
                    _abort(instruments, p, graph, ctx, rec, e)
                    if is_not_the_pass(e):  # an instrument's own (a forked estimate of the graph before it)
                        raise
                    raise PassError(p.name, history, e) from e
                except BaseException as e:  # KeyboardInterrupt & co.: no undo log is left recording
                    _abort(instruments, p, graph, ctx, rec, e)
                    raise
                history.append(p.name)
                nodes_now = rec.nodes_after
                if rec.modified:
                    applied += 1
                    rec.application = applied
                    changed = True
                    version += 1
                    clean.pop(k, None)
                    declared.pop(k, None)
                    edit = result.edit if result.edit in EDITS else None
                    if edit == MERGE_EQUAL_CONSTANTS and seen[0] == version - 1:
                        seen = (version, *seen[1:])  # no node or graph changed: same op types, same graphs
                    if edit is not None:
                        # a pass that could not change the version before cannot change this one
                        # (what it survives holds after any number of such edits: its claim is
                        # about what the edit keeps)
                        for j, v in list(clean.items()):
                            if v == version - 1 and edit in survive.get(j, ()):
                                clean[j] = version
                                declared[j] = f"it changed nothing before '{p.name}' made an edit it survives ({edit})"
                    if p.idempotent:  # it would not change what it just made
                        clean[k] = version
                        survive[k] = frozenset()
                        declared[k] = "it is idempotent and made this version of the graph"
                else:
                    clean[k] = version
                    # (a rolled-back application: the graph is as it was, but it claimed nothing)
                    survive[k] = p.survives_edits(result) if not result.modified else frozenset()
                    declared.pop(k, None)
                records.append(rec)
            if stale:
                unresolved = count_unresolved(graph)
                # one export per round at most; none once a refresh resolved nothing and no pass
                # has added unresolved tensors since (dims only the data decides: NonZero, ...)
                if unresolved and unresolved != futile:
                    refresh_shapes(graph)
                    version += 1
                    for ins in instruments:
                        ins.refreshed(graph, ctx)
                    after = count_unresolved(graph)
                    futile = after if after == unresolved else -1
            stale = False
            if not changed:
                break
        for ins in instruments:
            ins.exit(self, graph, ctx)
        return ManagerResult(applied > 0, {"applications": applied, "records": len(records)}, model=model,
                             records=records, skipped=list(self.skipped), explanations=list(ctx.explanations),
                             unavailable=unavailable)


def _graphs_and_op_types(graph: gs.Graph) -> tuple[list[gs.Graph], frozenset[str]]:
    """``all_graphs(graph)`` and ``op_types`` of those graphs, with one walk of the main graph
    (its op types and domains) when none of its nodes may hold a subgraph (two otherwise)."""
    nodes = graph.nodes
    ops = {n.op for n in nodes}
    if ops.isdisjoint(CONTROL_FLOW_OPS) and {n.domain for n in nodes} <= SUBGRAPHLESS_DOMAINS:
        fns = getattr(graph, "functions", None)
        if not fns:
            return [graph], frozenset(ops)
        graphs = [graph]  # then the local functions with their bodies, each once (as all_graphs)
        seen = {id(graph)}
        for fn in fns:
            for g in iter_graphs(fn):
                if id(g) not in seen:
                    seen.add(id(g))
                    graphs.append(g)
        for g in graphs[1:]:
            ops.update([n.op for n in g.nodes])
        return graphs, frozenset(ops)
    graphs = all_graphs(graph)
    return graphs, op_types(graph, graphs)


def _check_skip(p: Pass, model: Any, graph: gs.Graph, ctx: PassContext, why: str) -> None:
    """GRAPHPASS_CHECK_SKIPS: run ``p``, which the manager skipped because ``why``, and raise
    when it changes the graph (unrecorded: the records and explanations are those of the run
    without the check)."""
    before = fingerprint(graph)
    result = p.apply_to(model, graph, dataclasses.replace(ctx, explanations=[]))
    if result.modified or fingerprint(graph) != before:
        raise PassContractError(f"pass '{p.name}' changed a graph the pass manager skipped it on ({why}): "
                                f"{result.stats}")


def _abort(instruments, p, graph, ctx, rec, error) -> None:
    """Tell the instruments an application failed (innermost first); the caller re-raises."""
    for ins in reversed(instruments):
        ins.abort(p, graph, ctx, rec, error)


def _instance(p: str | type[Pass] | Pass) -> Pass:
    if isinstance(p, Pass):
        return p
    cls = get_pass(p) if isinstance(p, str) else p
    return cls()
