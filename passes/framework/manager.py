"""PassManager: runs a pipeline to a bounded fixed point and records what each pass did.

Per pass application it records wall time, node counts, the pass's stats and, when a cost
model is active, the estimate before and after. An application of a scored pass (every kind
but cleanup and analysis, see ``Pass.scored``) that makes the estimate worse is rolled back
unless the pass is ``required``. ``verify_each`` runs the ONNX checker and an
onnxruntime comparison against the input graph after every application that changed the graph
and names the first pass that broke it. An exception inside a pass becomes a ``PassError`` that
names the pass and the passes that ran before it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Sequence

import onnx
import onnx_graphsurgeon as gs

from graphpass.check import verify as _verify
from graphpass.errors import BadModelError, GraphpassError, PassError, VerificationError
from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.pass_base import Pass
from graphpass.passes.framework.registry import get_pass
from graphpass.ir import model_io
from graphpass.ir.graph import count_nodes, iter_graphs, toposort

__all__ = ["PassRecord", "PassManager", "CONTRACT_CHECK_MAX_NODES"]

#: Above this many nodes the per-pass fingerprint (the ``modified`` honesty check) is skipped
#: unless ``PassContext.check_contract`` is set explicitly: it is a development aid.
CONTRACT_CHECK_MAX_NODES = 5_000

#: Up to this many nodes every pass application is estimated (else only the scored ones).
ESTIMATE_EACH_MAX_NODES = 5_000

log = logging.getLogger(__name__)


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


class PassManager:
    """Runs ``passes`` (names or classes) over a graph, in order, round after round.

    Rounds repeat until no pass changes the graph or ``ctx.max_rounds`` is reached.
    """

    def __init__(self, passes: Sequence[str | type[Pass]], ctx: PassContext | None = None):
        self.ctx = ctx or PassContext()
        classes = [get_pass(p) if isinstance(p, str) else p for p in passes]
        self.skipped = [c.name for c in classes if c.name in self.ctx.disabled]
        self.passes = [c() for c in classes if c.name not in self.ctx.disabled]
        self.records: list[PassRecord] = []
        self._dump_count = 0
        self._promises: list = []  # promises of the applications so far (verify_each's tolerance)
        self._fp16_reference = False
        self.initial_cost: float | None = None
        #: the cost model's report on the input graph (None without a cost model)
        self.initial_report = None
        self.final_cost: float | None = None

    # -- helpers ---------------------------------------------------------------------------

    def _estimate(self, graph: gs.Graph, keep: bool = False) -> float | None:
        cm = self.ctx.cost_model
        if cm is None or not getattr(cm, "active", False):
            return None
        report = cm.estimate(graph, **self.ctx.cost_options)
        if keep:
            self.initial_report = report
        return report.total_us

    def _reference(self, graph: gs.Graph):
        model = model_io.to_proto(graph)
        feeds, ref, _, runner, _ = _verify.reference(model, seed=self.ctx.seed, input_shapes=self.ctx.input_shapes)
        _verify.check_deterministic("the input model", model, runner, feeds, ref)  # else every pass "breaks" it
        self._fp16_reference = runner.fp16
        return feeds, ref

    def _verify(self, graph: gs.Graph, name: str, feeds, ref) -> None:
        model = model_io.to_proto(graph)
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:
            raise VerificationError(
                f"after pass '{name}': the ONNX checker rejects the model: {str(e).splitlines()[0]}"
            ) from e
        # judged like optimize --verify: at the loosest promise of the passes applied so far
        try:
            runner = _verify.Runner(model)
            got = runner.run(feeds)
        except BadModelError as e:  # the input model ran: this pass's output is to blame
            raise VerificationError(f"after pass '{name}': {e}") from e
        tol = _verify.tolerance_for(self._promises, fp16=self._fp16_reference or runner.fp16)
        bad = [c for c in _verify.compare(ref, got, tol.rtol, tol.atol) if not c.ok]
        if bad:
            raise VerificationError(f"after pass '{name}': {_verify.describe(bad[0])} from the input model at {tol}")

    def _dump(self, graph: gs.Graph, name: str) -> None:
        """Write the graph after ``name`` to the dump folder (the CLI passes a staging folder
        there, moved into place only when the run succeeds). A write error is exit 2."""
        assert self.ctx.dump_dir is not None
        self._dump_count += 1
        path = Path(self.ctx.dump_dir) / f"{self._dump_count:03d}_{name}.onnx"
        try:
            Path(self.ctx.dump_dir).mkdir(parents=True, exist_ok=True)
            model_io.save(graph, path, emit="device")
        except OSError as e:
            from graphpass.outputs import write_error

            raise write_error(path, e) from None

    # -- the loop --------------------------------------------------------------------------

    def run(self, graph: gs.Graph) -> list[PassRecord]:
        with model_io.gc_frozen():
            return self._run(graph)

    def _run(self, graph: gs.Graph) -> list[PassRecord]:
        ctx = self.ctx
        feeds = ref = None
        if ctx.verify_each:
            feeds, ref = self._reference(graph)
        history: list[str] = []
        snapshot = None
        cost = self._estimate(graph, keep=True)
        self.initial_cost = cost
        stale = False
        total = len(self.passes)
        nodes_now = count_nodes(graph)
        if ctx.check_contract is None:  # auto: on for graphs a fingerprint costs little on
            # (counted in node inputs and outputs too: one Split of 100,000 outputs is no small graph)
            edges = sum(len(n.inputs) + len(n.outputs) for g in iter_graphs(graph) for n in g.nodes)
            ctx.check_contract = nodes_now <= CONTRACT_CHECK_MAX_NODES and edges <= 4 * CONTRACT_CHECK_MAX_NODES
        applied = 0
        limit = ctx.max_applications
        for rnd in range(1, max(1, ctx.max_rounds) + 1):
            changed = False
            for k, p in enumerate(self.passes):
                if p.run_once and rnd > 1:
                    continue
                if limit is not None and applied >= limit:
                    break
                if ctx.on_pass:
                    ctx.on_pass(p.name, rnd, k, total)
                nodes_before = nodes_now
                scored = p.scored_in(ctx) and not p.required
                # every application is estimated on graphs up to ESTIMATE_EACH_MAX_NODES; above,
                # only the ones the cost model may veto (an estimate of 100k nodes takes ~2 s)
                estimate_after = cost is not None and (scored or nodes_before <= ESTIMATE_EACH_MAX_NODES)
                # the snapshot to roll back to stays valid until a pass changes the graph
                if cost is not None and scored and snapshot is None:
                    snapshot = model_io.snapshot(graph)
                t0 = time.perf_counter()
                try:
                    result = p.apply(graph, ctx)
                except GraphpassError:
                    raise
                except Exception as e:
                    raise PassError(p.name, history, e) from e
                seconds = time.perf_counter() - t0
                history.append(p.name)
                if result.modified and not p.preserves_order:
                    toposort(graph)
                nodes_now = count_nodes(graph) if result.modified else nodes_before
                rec = PassRecord(
                    index=len(self.records) + 1,
                    name=p.name,
                    round=rnd,
                    seconds=seconds,
                    nodes_before=nodes_before,
                    nodes_after=nodes_now,
                    modified=result.modified,
                    stats=dict(result.stats),
                    cost_before_us=cost,
                )
                if result.modified:
                    new_cost = self._estimate(graph) if estimate_after else None
                    rec.cost_after_us = new_cost
                    if scored and snapshot is not None and new_cost is not None and cost is not None and new_cost > cost * (1 + 1e-9) + 1e-9:
                        restored = model_io.restore(snapshot)
                        _replace_graph(graph, restored)
                        rec.rolled_back = True
                        rec.modified = False
                        rec.nodes_after = nodes_now = count_nodes(graph)
                        rec.note = f"rolled back: estimate rose from {cost:.1f} to {new_cost:.1f} us"
                        snapshot = None  # from_proto may have consumed it
                        log.info("%s %s", p.name, rec.note)
                    else:
                        snapshot = None  # the graph changed: the next scored pass needs a new one
                        applied += 1
                        rec.application = applied
                        if new_cost is not None:
                            cost = new_cost
                        elif cost is not None:
                            rec.cost_before_us = None
                            stale = True
                        changed = True
                        if ctx.verify_each:
                            self._promises.append(getattr(p, "promise", _verify.UNDECLARED))
                            self._verify(graph, p.name, feeds, ref)
                        if ctx.dump_dir is not None:
                            self._dump(graph, p.name)
                else:
                    rec.cost_after_us = cost
                self.records.append(rec)
            if not changed or (limit is not None and applied >= limit):
                break
        if stale and cost is not None:
            self.final_cost = self._estimate(graph)
        else:
            self.final_cost = cost
        return self.records


def _replace_graph(graph: gs.Graph, other: gs.Graph) -> None:
    """Make ``graph`` (the caller's object) hold the contents of ``other``."""
    graph.nodes = other.nodes
    graph.inputs = other.inputs
    graph.outputs = other.outputs
    graph.functions = other.functions
    for key in ("_gp_model",):
        if key in other.__dict__:
            graph.__dict__[key] = other.__dict__[key]
