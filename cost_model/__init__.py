"""graphpass.cost_model: the Ascend cost model behind every pass decision.

    from graphpass.cost_model import get_target
    report = get_target("ascend910b2").cost_model.estimate(graph)
    print(report.to_table())

A :class:`Target` holds everything about one piece of hardware (profile, op table, precision
modes, UB fusion names, format oracle, cost model); passes read hardware facts only through it.

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
from graphpass.cost_model.target import DEFAULT_TARGET, KNOWN_TARGETS, NONE_TARGET, Target, get_target
from graphpass.cost_model.toolchain import PrecisionMode, load_precision_modes, load_ub_fusion

__all__ = [
    "AscendCostModel",
    "CostModel",
    "CostReport",
    "DEFAULT_TARGET",
    "HardwareProfile",
    "KNOWN_TARGETS",
    "NONE_TARGET",
    "NullCostModel",
    "OpInfo",
    "OpTable",
    "PRECISION_MODES",
    "PrecisionMode",
    "SCHEMA",
    "Target",
    "create",
    "get_target",
    "estimate",
    "known_targets",
    "load_op_table",
    "load_precision_modes",
    "load_profile",
    "load_ub_fusion",
]


def create(target: "str | Target" = DEFAULT_TARGET) -> CostModel:
    """The cost model of ``target`` (``"none"``: a model that estimates nothing); the same as
    ``get_target(target).cost_model``.

    Raises:
        UsageError: ``target`` is not a known profile (the message lists the known ones).
    """
    return get_target(target).cost_model


def estimate(model, target: "str | Target | None" = None, **options) -> CostReport:
    """The estimate of ``model`` on ``target`` (default: the default target).

    ``model`` is any form :func:`graphpass.ir.model.as_model` takes: a path, bytes, an
    ``onnx.ModelProto``, a :class:`graphpass.Model` or a ``gs.Graph``; it is not changed.
    ``options`` go to the cost model's ``estimate`` (``precision_mode``,
    ``iterations_per_loop``, ``loop_trips``, ``input_shapes``, ``fusion``: False prices every node
    as its own kernel through GM, without ATC's UB fusion and L2 residency).
    """
    from graphpass.ir.model import as_model

    return get_target(DEFAULT_TARGET if target is None else target).estimate(as_model(model).graph, **options)
