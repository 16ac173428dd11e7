"""The pass-instrument interface: the hooks a pass-manager run calls around every application,
and the graph sizes above which the costlier side jobs stop running on every application.

The instruments themselves are in :mod:`graphpass.passes.framework.instruments` (the cost veto
in :mod:`graphpass.passes.framework.cost_veto`); this module is what they all build on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_graphsurgeon as gs

from graphpass.passes.framework.pass_base import Pass, PassResult

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.passes.framework.context import PassContext
    from graphpass.passes.framework.manager import PassRecord, PassManager

__all__ = ["PassInstrument", "CONTRACT_CHECK_MAX_NODES", "ESTIMATE_EACH_MAX_NODES", "not_the_pass", "is_not_the_pass"]

#: Above this many nodes (or 4x as many node inputs and outputs) the per-pass fingerprint of
#: :class:`ContractCheck` is skipped unless asked for explicitly: it is a development aid.
CONTRACT_CHECK_MAX_NODES = 5_000

#: Up to this many nodes every pass application is estimated (else only the scored ones).
ESTIMATE_EACH_MAX_NODES = 5_000


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


def not_the_pass(error: BaseException) -> BaseException:
    """Mark ``error``, raised by an instrument's hook, as not the failure of the pass it surfaced
    around: the manager re-raises it as it is instead of as a ``PassError`` naming that pass (a
    forked estimate of the graph as it was before the pass, read only after it). Returns ``error``."""
    error.graphpass_not_the_pass = True  # type: ignore[attr-defined]
    return error


def is_not_the_pass(error: BaseException) -> bool:
    """Whether :func:`not_the_pass` marked ``error``."""
    return getattr(error, "graphpass_not_the_pass", False) is True
