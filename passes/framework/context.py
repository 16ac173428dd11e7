"""PassContext: what every pass may read about the run it is part of."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

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
        target: hardware profile name for the cost model (``ascend910a`` by default).
        disabled: pass names that must not run.
        enabled: default-off pass names that should run.
        max_rounds: cap of the fixed-point loop over the pipeline.
        verify_each: after each pass that changed the graph, run the ONNX checker and compare
            onnxruntime outputs against the input model on seeded random inputs.
        dump_dir: write the graph after each pass that changed it, numbered in order.
        input_shapes: graph input name -> static shape, for static-shape specialization.
        options: per-pass options, ``{pass_name: {option: value}}``.
        cost_model: the cost model consulted by the pass manager and by passes (None = no model).
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

    target: str = "ascend910a"
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

    def explain(self, pass_name: str, node: Any, reason: str) -> None:
        """Record why ``pass_name`` did not rewrite ``node`` (for ``--explain``)."""
        self.explanations.append(
            Explanation(pass_name, getattr(node, "name", "") or "", getattr(node, "op", ""), reason)
        )
