"""graphpass.cost_model: the Ascend cost model behind every pass decision."""

from __future__ import annotations

from graphpass.cost_model.base import CostModel, CostReport, NullCostModel
from graphpass.errors import UsageError

__all__ = ["CostModel", "CostReport", "NullCostModel", "KNOWN_TARGETS", "create"]

#: Hardware profiles graphpass knows (ascend_facts.md §1). The default is the first.
KNOWN_TARGETS = ("ascend910a", "ascend910b2", "ascend310p3")


def create(target: str = "ascend910a") -> CostModel:
    """The cost model for ``target``.

    Raises:
        UsageError: ``target`` is not a known profile (the message lists the known ones).
    """
    if target not in KNOWN_TARGETS and target != "none":
        raise UsageError(f"unknown target '{target}'; known targets: {', '.join(KNOWN_TARGETS)}")
    return NullCostModel(target)
