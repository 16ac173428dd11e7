"""Target: everything graphpass knows about one piece of hardware, in one object.

    import graphpass as gp
    t = gp.Target.load("ascend910b2")     # cached: the same object on every call
    t.profile.ai_core_count, t.op_table.lookup("Conv", ""), t.cost_model.estimate(graph)

A target holds the hardware profile (``data/<name>.toml``), the op-info table
(``data/op_info.toml``), ATC's precision modes (``data/precision_modes.toml``) and UB fusion
names (``data/ub_fusion.toml``), the format oracle and the cost model built on them. Passes read
hardware facts only through the target of their context (``ctx.target``).

The ``none`` target is explicit: it has no profile, no op table, no format oracle and a cost
model that estimates nothing; it still knows the toolchain's vocabulary (precision modes, UB
fusion names), which belongs to no chip. A pass that needs hardware facts declares
``needs_target``: called directly under ``none`` it raises a :class:`graphpass.UsageError`; a
pipeline run under ``none`` skips it and the report says why.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_graphsurgeon as gs

from graphpass.cost_model.base import CostModel, NullCostModel
from graphpass.cost_model.op_info import OpTable, load_op_table
from graphpass.cost_model.profiles import HardwareProfile, known_targets, load_profile
from graphpass.cost_model.toolchain import PrecisionMode, load_precision_modes, load_ub_fusion
from graphpass.errors import UsageError
from graphpass.ir import profiling

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.cost_model.formats import FormatOracle

__all__ = ["Target", "DEFAULT_TARGET", "NONE_TARGET", "KNOWN_TARGETS", "get_target"]

#: The target graphpass optimizes for unless told otherwise (the one place its name is written).
DEFAULT_TARGET = "ascend910a"

#: The name of the target without hardware facts (no estimates, no placement, no layout).
NONE_TARGET = "none"

#: Hardware profiles shipped in data/ (the default first).
KNOWN_TARGETS = tuple([DEFAULT_TARGET] + [t for t in known_targets() if t != DEFAULT_TARGET])


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
    """One hardware target: profile, op table, precision modes, UB fusion names, cost model.

    Build one with :meth:`Target.load` (or :func:`get_target`); ``Target.load("none")`` is the
    target without hardware facts.

    Attributes:
        name: the profile's name (``"none"`` for the none target).
        profile: the hardware profile (None for the none target).
        op_table: how each ONNX op maps to Ascend (None for the none target).
        precision_modes: ATC's precision modes, in the data file's order.
        ub_fusion: the Ascend pass names of ATC's UB fusions.
        cost_model: what estimates graphs for this target (a model that estimates nothing for
            the none target; :meth:`with_cost_model` plugs in another).
    """

    name: str
    profile: HardwareProfile | None
    op_table: OpTable | None
    precision_modes: tuple[PrecisionMode, ...]
    ub_fusion: frozenset[str]
    cost_model: CostModel
    #: the analytical model of the profile (format oracle, placement); None for the none target
    _hardware: Any = dataclasses.field(default=None, repr=False)

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def load(cls, name: "str | Path" = DEFAULT_TARGET) -> "Target":
        """The target called ``name`` (a profile of data/, a profile file's path, or ``"none"``).

        Cached: loading a name twice gives the same object.

        Raises:
            UsageError: ``name`` is not a known target (the message lists the known ones), or
                its data files are malformed (the message names file and key).
        """
        if isinstance(name, Target):
            return name
        if not isinstance(name, (str, Path)):
            raise UsageError(f"a target is a name ({', '.join(KNOWN_TARGETS)}, {NONE_TARGET}) or a Target, "
                             f"not {type(name).__name__}")
        return _load(str(name))

    @classmethod
    def none(cls) -> "Target":
        """The target without hardware facts."""
        return _load(NONE_TARGET)

    @classmethod
    def resolve(cls, target: "str | Path | Target | None") -> "Target":
        """``target`` as a Target: a Target as it is, a name loaded, None the none target."""
        return cls.none() if target is None else cls.load(target)

    def with_cost_model(self, cost_model: CostModel | None) -> "Target":
        """This target with another cost model for estimates (hardware facts unchanged)."""
        if cost_model is None or cost_model is self.cost_model:
            return self
        return dataclasses.replace(self, cost_model=cost_model)

    # -- what it knows -----------------------------------------------------------------------

    @property
    def has_hardware(self) -> bool:
        """Whether the target has hardware facts (a profile); False for the none target."""
        return self.profile is not None

    @property
    def estimates(self) -> bool:
        """Whether the cost model produces estimates (False for the none target's)."""
        return bool(self.cost_model.active)

    @property
    def default_precision_mode(self) -> str | None:
        return self.profile.default_precision_mode if self.profile is not None else None

    def precision_mode_names(self, *, mixed_precision: bool = False, lowers: bool = False) -> tuple[str, ...]:
        """Names of the precision modes; only those the mixed_precision pass implements, or
        only those that compute something in fp16, when asked."""
        return tuple(m.name for m in self.precision_modes
                     if (m.mixed_precision or not mixed_precision) and (m.lowers or not lowers))

    def require(self, who: str) -> "Target":
        """This target, if it has hardware facts; else a UsageError naming ``who`` needs one."""
        if not self.has_hardware:
            raise UsageError(
                f"{who} needs a hardware target and the target is '{self.name}': "
                f"give one, e.g. PassContext(target='{DEFAULT_TARGET}') "
                f"(known: {', '.join(KNOWN_TARGETS)})")
        return self

    def format_oracle(self, graph: gs.Graph, precision_mode: str | None = None,
                      input_shapes: dict[str, list[int]] | None = None, **_: Any) -> "FormatOracle":
        """Per-node storage-format facts of ``graph`` on this target (the layout passes' oracle)."""
        self.require("the format oracle")
        return self._hardware.format_oracle(graph, precision_mode=precision_mode, input_shapes=input_shapes)

    def placement(self, graph: gs.Graph, precision_mode: str | None = None, **_: Any):
        """Engine of every node (by id) with the reason when it is not AI Core, and the report."""
        self.require("placement")
        return self._hardware.placement(graph, precision_mode=precision_mode)

    @profiling.timed("cost estimate")
    def estimate_with_placement(self, graph: gs.Graph, *, node_records: bool = True, **kwargs: Any):
        """``(report, engines)``: the estimate of ``graph`` and, when the estimates are this
        target's own hardware model's, the engine of every node as :meth:`placement` gives it
        (one walk for both; None when a cost model of one's own estimates). ``node_records=False``:
        the report's per-node list stays empty (its totals only; less memory on a big graph)."""
        if self.has_hardware and self.cost_model is self._hardware:
            from graphpass.cost_model.base import check_estimate_options

            check_estimate_options(kwargs)
            engines, report = self._hardware.placement(graph, node_records=node_records, **kwargs)
            return report, engines
        return self.estimate(graph, **kwargs), None

    @profiling.timed("cost estimate")
    def incremental_estimate(self, graph: gs.Graph, _full_fraction: float | None = None, **kwargs: Any):
        """An :class:`~graphpass.cost_model.incremental.IncrementalEstimate` of ``graph`` (its
        full report in ``.report``, its engines in ``.engines``), when the estimates are this
        target's own hardware model's (as :meth:`estimate_with_placement`); else None.
        ``_full_fraction=0``: every edit is updated, however large (the development check)."""
        if self.has_hardware and self.cost_model is self._hardware:
            from graphpass.cost_model.base import check_estimate_options
            from graphpass.cost_model.incremental import IncrementalEstimate

            check_estimate_options(kwargs)
            if _full_fraction == 0:  # never estimate in full for the size of an edit
                return IncrementalEstimate(self._hardware, graph, full_fraction=None, **kwargs)
            return IncrementalEstimate(self._hardware, graph, **kwargs)
        return None

    @profiling.timed("cost estimate")
    def estimate(self, model: Any, **kwargs: Any):
        """The cost model's report on ``model`` (a gs.Graph, or any form
        :func:`graphpass.ir.model.as_model` takes; ``total_us`` None when the model estimates
        nothing)."""
        if not isinstance(model, gs.Graph):
            from graphpass.ir.model import as_model

            model = as_model(model).graph
        return self.cost_model.estimate(model, **kwargs)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Target({self.name!r})"


@functools.lru_cache(maxsize=16)
def _load(name: str) -> Target:
    modes, ub = load_precision_modes(), load_ub_fusion()
    if name == NONE_TARGET:
        return Target(NONE_TARGET, None, None, modes, ub, NullCostModel(NONE_TARGET))
    if not name.endswith(".toml") and name not in KNOWN_TARGETS:
        raise UsageError(f"unknown target '{name}'; known targets: {', '.join(KNOWN_TARGETS)}, {NONE_TARGET}")
    from graphpass.cost_model.ascend import AscendCostModel  # it builds on this module's constants

    profile = load_profile(name)
    table = load_op_table()
    model = AscendCostModel(profile, table)
    return Target(profile.name, profile, table, modes, ub, model, model)


def get_target(name: "str | Path | Target" = DEFAULT_TARGET) -> Target:
    """The target called ``name`` (cached); see :meth:`Target.load`."""
    return Target.load(name)
