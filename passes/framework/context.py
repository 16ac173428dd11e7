"""PassContext: what every pass may read about the run it is part of."""

from __future__ import annotations

import dataclasses
from typing import Any

from graphpass.cost_model.target import Target

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
    (:mod:`graphpass.passes.framework.instruments`); pass options are constructor arguments of each pass
    (``FoldConstants(size_limit=...)``). The pass manager gives its passes a copy of the
    context whose ``explanations`` are the run's own, so a caller's context is never written.

    Attributes:
        target: the hardware target (:class:`graphpass.Target`); a name or a Target may be
            given and is resolved once, on assignment. None (the default) is the ``none``
            target: no hardware facts, so passes that need them refuse to run
            (``graphpass.optimize`` passes the default target).
        input_shapes: graph input name -> static shape, for static-shape specialization (-1
            keeps a dim dynamic).
        dims: symbolic dim name -> value, fixed wherever the name appears (``--dim``).
        cost_model: the target's cost model (``ctx.target.cost_model``); giving one replaces the
            target's cost model for estimates (the target's hardware facts stay).
        cost_options: keyword arguments of every estimate (precision_mode, iterations_per_loop, loop_trips).
        seed: seed for generated inputs.
        explanations: where passes record why a rule did not fire (:meth:`explain`).
        max_memory: bytes of tensors the run may create (``--max-memory``; None: no limit).
        freeze_initializer_inputs: initializers that are also graph inputs may be folded as
            constants (``--freeze-initializers``); by default they stay inputs.
    """

    target: Any = None  # a name, a Target or None; always a Target once set (see __setattr__)
    input_shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cost_model: Any = None
    cost_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    explanations: list[Explanation] = dataclasses.field(default_factory=list)
    max_memory: int | None = None
    freeze_initializer_inputs: bool = False
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    #: (engines, report) of the graph as it is when the running pass starts, from the pass
    #: manager's cost veto when it has them (the run's target and precision mode): what
    #: ``target.placement(graph)`` would return, without a second walk. None otherwise.
    placement: tuple[dict[int, tuple[str, str]], Any] | None = None

    def __setattr__(self, key: str, value: Any) -> None:
        # the target is resolved once, here; ctx.cost_model is always ctx.target.cost_model
        if key == "target":
            value = Target.resolve(value)
            object.__setattr__(self, "cost_model", value.cost_model)
        elif key == "cost_model":
            target = Target.resolve(getattr(self, "target", None)).with_cost_model(value)
            object.__setattr__(self, "target", target)
            value = target.cost_model
        object.__setattr__(self, key, value)

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
