"""graphpass.cost_model: the Ascend cost model behind every pass decision.

    from graphpass.cost_model import create
    report = create("ascend910b2").estimate(graph)
    print(report.to_table())

Every figure it produces is an estimate from the profile and op-info data files in ``data/``,
each number tagged with its source and whether it is published (P), derived (D) or
estimated (E); see ``cost_model/ascend.py`` for the model itself.
"""

from __future__ import annotations

from graphpass.cost_model.ascend import AscendCostModel
from graphpass.cost_model.base import CostModel, NullCostModel
from graphpass.cost_model.op_info import OpInfo, OpTable, load_op_table
from graphpass.cost_model.profiles import PRECISION_MODES, HardwareProfile, known_targets, load_profile
from graphpass.cost_model.report import SCHEMA, CostReport
from graphpass.errors import UsageError

__all__ = [
    "AscendCostModel",
    "CostModel",
    "CostReport",
    "HardwareProfile",
    "KNOWN_TARGETS",
    "NullCostModel",
    "OpInfo",
    "OpTable",
    "PRECISION_MODES",
    "SCHEMA",
    "create",
    "estimate",
    "known_targets",
    "load_op_table",
    "load_profile",
]

#: Hardware profiles shipped in data/ (the default, ascend910a, first).
KNOWN_TARGETS = tuple(["ascend910a"] + [t for t in known_targets() if t != "ascend910a"])


def create(target: str = "ascend910a") -> CostModel:
    """The cost model for ``target`` (``"none"``: a model that estimates nothing).

    Raises:
        UsageError: ``target`` is not a known profile (the message lists the known ones).
    """
    if target == "none":
        return NullCostModel("none")
    if target not in KNOWN_TARGETS:
        raise UsageError(f"unknown target '{target}'; known targets: {', '.join(KNOWN_TARGETS)}")
    return AscendCostModel(target)


def estimate(model, target: str | None = None, **options) -> CostReport:
    """The estimate of ``model`` on ``target`` (default: :func:`create`'s default target).

    ``model`` is any form :func:`graphpass.ir.model.as_model` takes: a path, bytes, an
    ``onnx.ModelProto``, a :class:`graphpass.Model` or a ``gs.Graph``; it is not changed.
    ``options`` go to the cost model's ``estimate`` (``precision_mode``,
    ``iterations_per_loop``, ``loop_trips``, ``input_shapes``).
    """
    from graphpass.ir.model import as_model

    cm = create() if target is None else create(target)
    return cm.estimate(as_model(model).graph, **options)
