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

The interface (:class:`PassInstrument`) is in :mod:`~graphpass.passes.framework.instrument_base`,
the cost veto in :mod:`~graphpass.passes.framework.cost_veto` and the estimates it makes in a
forked child in :mod:`~graphpass.passes.framework.forked_estimate`; all are importable from here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

import onnx

from graphpass.cost_model.target import Target
from graphpass.errors import BadModelError, VerificationError
from graphpass.passes.framework.cost_veto import CostVeto
from graphpass.passes.framework.forked_estimate import FORK_MAX_NODES, fork_blocker
from graphpass.passes.framework.instrument_base import CONTRACT_CHECK_MAX_NODES, ESTIMATE_EACH_MAX_NODES, PassInstrument
from graphpass.passes.framework.pass_base import Pass, PassContractError
from graphpass.ir import model_io, profiling
from graphpass.ir.graph import count_nodes, fingerprint, iter_graphs

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

log = logging.getLogger(__name__)


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
