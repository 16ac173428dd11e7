"""PassContext: what every pass may read about the run it is part of."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from graphpass.cost_model.target import Target

__all__ = ["PassContext", "Explanation"]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """A site where a pass's pattern matched but its check refused, and why."""

    pass_name: str
    node: str
    op: str
    reason: str


@dataclasses.dataclass
class PassContext:
    """Settings of one optimization run, shared by the pass manager and every pass.

    Attributes:
        target: the hardware target (:class:`graphpass.Target`); a name or a Target may be
            given and is resolved once, on assignment. None (the default) is the ``none``
            target: no hardware facts, so passes that need them refuse to run
            (``graphpass.optimize`` passes the default target).
        disabled: pass names that must not run.
        enabled: default-off pass names that should run.
        max_rounds: cap of the fixed-point loop over the pipeline.
        verify_each: after each pass that changed the graph, run the ONNX checker and compare
            onnxruntime outputs against the input model on seeded random inputs.
        dump_dir: write the graph after each pass that changed it, numbered in order.
        input_shapes: graph input name -> static shape, for static-shape specialization.
        options: per-pass options, ``{pass_name: {option: value}}``.
        cost_model: the target's cost model (``ctx.target.cost_model``); giving one replaces the
            target's cost model for estimates (the target's hardware facts stay).
        cost_options: keyword arguments of every estimate (precision_mode, iterations_per_loop, loop_trips).
        seed: seed for generated inputs.
        check_contract: let :meth:`Pass.apply` fingerprint the graph to check ``modified``
            (None: the pass manager decides, on for graphs up to 20k nodes).
        on_pass: progress callback ``(pass_name, round, index, total)``.
        max_applications: stop after this many pass applications that changed the graph (like
            LLVM's -opt-bisect-limit; ``graphpass bisect`` searches over it).
        max_memory: bytes of tensors the run may create (``--max-memory``; None: no limit).
        freeze_initializer_inputs: initializers that are also graph inputs may be folded as
            constants (``--freeze-initializers``); by default they stay inputs.
    """

    target: Any = None  # a name, a Target or None; always a Target once set (see __setattr__)
    disabled: set[str] = dataclasses.field(default_factory=set)
    enabled: set[str] = dataclasses.field(default_factory=set)
    max_rounds: int = 4
    verify_each: bool = False
    dump_dir: Path | None = None
    input_shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    cost_model: Any = None
    cost_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    check_contract: bool | None = None
    on_pass: Callable[[str, int, int, int], None] | None = None
    explanations: list[Explanation] = dataclasses.field(default_factory=list)
    max_applications: int | None = None
    max_memory: int | None = None
    freeze_initializer_inputs: bool = False

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

    def explain(self, pass_name: str, node: Any, reason: str) -> None:
        """Record why ``pass_name`` did not rewrite ``node`` (for ``--explain``)."""
        self.explanations.append(
            Explanation(pass_name, getattr(node, "name", "") or "", getattr(node, "op", ""), reason)
        )
