"""PassContext: what every pass may read about the run it is part of."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PassContext", "Explanation"]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """A site where a pass's pattern matched but its check refused, and why."""

    pass_name: str
    node: str
    op: str
    reason: str


_NO_OPTIONS = ("PassContext.options is gone: a pass's options are its constructor arguments "
               "(FoldConstants(size_limit=...)), or graphpass.optimize(options={pass: {option: value}})")


@dataclasses.dataclass(slots=True)
class PassContext:
    """What every pass may read about the run it is part of.

    How the run is driven (rounds, verification, dumps, progress, the bisect limit, the
    contract check) belongs to the pass manager and its instruments
    (:mod:`graphpass.infra.instruments`); pass options are constructor arguments of each pass
    (``FoldConstants(size_limit=...)``). The pass manager gives its passes a copy of the
    context whose ``explanations`` are the run's own, so a caller's context is never written.

    Attributes:
        target: hardware profile name for the cost model (``ascend910a`` by default).
        input_shapes: graph input name -> static shape, for static-shape specialization.
        cost_model: the cost model consulted by the pass manager and by passes (None = no model).
        cost_options: keyword arguments of every estimate (precision_mode, iterations_per_loop, loop_trips).
        seed: seed for generated inputs.
        explanations: where passes record why a rule did not fire (:meth:`explain`).
        max_memory: bytes of tensors the run may create (``--max-memory``; None: no limit).
        freeze_initializer_inputs: initializers that are also graph inputs may be folded as
            constants (``--freeze-initializers``); by default they stay inputs.
    """

    target: str = "ascend910a"
    input_shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cost_model: Any = None
    cost_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    explanations: list[Explanation] = dataclasses.field(default_factory=list)
    max_memory: int | None = None
    freeze_initializer_inputs: bool = False

    @property
    def options(self) -> Any:
        raise AttributeError(_NO_OPTIONS)

    @options.setter
    def options(self, value: Any) -> None:
        raise AttributeError(_NO_OPTIONS)

    def explain(self, pass_name: str, node: Any, reason: str) -> None:
        """Record why ``pass_name`` did not rewrite ``node`` (for ``--explain``)."""
        self.explanations.append(
            Explanation(pass_name, getattr(node, "name", "") or "", getattr(node, "op", ""), reason)
        )
