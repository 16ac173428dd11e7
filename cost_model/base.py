"""The cost-model interface the pass manager and passes talk to.

A cost model never knows which pass asks: it sees a graph and returns a :class:`CostReport`.
The analytical Ascend model is its own piece of work (issue 3); until it lands, ``create``
returns :class:`NullCostModel` for every known target, which estimates nothing and so never
vetoes a rewrite.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import onnx_graphsurgeon as gs

__all__ = ["CostReport", "CostModel", "NullCostModel"]


@dataclasses.dataclass
class CostReport:
    """An estimate for one graph. ``total_us`` is an estimate, not a measurement."""

    target: str
    total_us: float | None
    per_node: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    assumptions: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CostModel(abc.ABC):
    """Interface: ``estimate(graph) -> CostReport``."""

    target: str

    #: False for a model that estimates nothing (the pass manager then skips scoring).
    active: bool = True

    @abc.abstractmethod
    def estimate(self, graph: gs.Graph, **kwargs: Any) -> CostReport: ...


class NullCostModel(CostModel):
    """Estimates nothing: every graph costs ``None``, so no rewrite is ever rolled back."""

    active = False

    def __init__(self, target: str = "none"):
        self.target = target

    def estimate(self, graph: gs.Graph, **kwargs: Any) -> CostReport:
        return CostReport(target=self.target, total_us=None, assumptions=["no cost model loaded"])
