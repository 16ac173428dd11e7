"""The cost-model interface the pass manager and passes talk to.

A cost model never knows which pass asks: it sees a graph and returns a :class:`CostReport`.
:class:`NullCostModel` estimates nothing and so never vetoes a rewrite (``create("none")``).
"""

from __future__ import annotations

import abc
from typing import Any

import onnx_graphsurgeon as gs

from graphpass.cost_model.report import CostReport

__all__ = ["CostModel", "NullCostModel", "ESTIMATE_OPTIONS", "check_estimate_options"]

#: The keyword options every cost model's ``estimate`` takes.
ESTIMATE_OPTIONS = ("precision_mode", "iterations_per_loop", "loop_trips", "input_shapes", "dims")


def check_estimate_options(options: dict[str, Any]) -> None:
    """A misspelled estimate option is a TypeError (it was silently ignored)."""
    unknown = sorted(k for k in options if k not in ESTIMATE_OPTIONS)
    if unknown:
        raise TypeError(f"estimate has no option {', '.join(repr(k) for k in unknown)}; "
                        f"its options: {', '.join(ESTIMATE_OPTIONS)}")


class CostModel(abc.ABC):
    """Interface: ``estimate(graph) -> CostReport``."""

    target: str

    #: False for a model that estimates nothing (the pass manager then skips scoring).
    active: bool = True

    @abc.abstractmethod
    def estimate(self, graph: gs.Graph, **kwargs: Any) -> CostReport: ...

    def choose(self, candidates: "list[gs.Graph]", **kwargs: Any) -> int:
        """Index of the cheapest candidate (for rewrites with alternatives); 0 on ties or no model."""
        totals = [self.estimate(g, **kwargs).total_us for g in candidates]
        if any(t is None for t in totals):
            return 0
        return min(range(len(totals)), key=lambda i: (totals[i], i))


class NullCostModel(CostModel):
    """Estimates nothing: every graph costs ``None``, so no rewrite is ever rolled back."""

    active = False

    def __init__(self, target: str = "none"):
        self.target = target

    def estimate(self, graph: gs.Graph, **kwargs: Any) -> CostReport:
        check_estimate_options(kwargs)
        return CostReport(target=self.target, total_us=None, assumptions=["no cost model loaded"])
