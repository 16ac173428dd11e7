"""The pass contract: ``run(graph, ctx) -> PassResult(modified, stats)``.

Modelled on onnx_ir's ``_pass_infra`` and torch.fx's ``PassBase``; the metadata a pass declares
is data, like TVM's ``PassInfo``. :meth:`Pass.apply` checks the contract: a pass must return a
``PassResult``, and one that says ``modified=False`` must leave the graph's structure unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import onnx_graphsurgeon as gs

from graphpass.ir.graph import fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.passes.framework.context import PassContext

__all__ = ["PassKind", "PassResult", "MatchResult", "Pass", "PassContractError", "Promise", "EXACT", "REASSOCIATION"]


class PassKind(str, enum.Enum):
    CLEANUP = "cleanup"
    LAYOUT = "layout"
    FUSION = "fusion"
    LOWERING = "lowering"
    PLACEMENT = "placement"
    PRECISION = "precision"
    ANALYSIS = "analysis"


@dataclasses.dataclass
class PassResult:
    """What one application of a pass did. ``stats`` holds counts such as ``{"removed": 3}``."""

    modified: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MatchResult:
    """The answer of a rewrite rule's ``check``: success, or a failure with the reason why."""

    ok: bool
    reason: str = ""

    @classmethod
    def success(cls) -> "MatchResult":
        return cls(True)

    @classmethod
    def fail(cls, reason: str) -> "MatchResult":
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass(frozen=True)
class Promise:
    """What a pass promises about the outputs of the graphs it rewrites.

    ``exact``: bitwise-equal outputs on every input (NaN positions and the sign of zero
    included) wherever onnxruntime itself is deterministic. ``tolerance``: outputs may differ by
    float rounding only, from the cause named in ``reason`` (reassociation of BN/scale/bias
    folds, MatMul+Add, a different summation order, a fused kernel instead of its
    decomposition); elementwise ``|a - b| <= atol + rtol * |b|``, and NaN/inf positions and
    signs stay exactly where the original has them. A rewrite that can change a value beyond
    that is a bug, never a tolerance.

    What a tolerance covers, precisely (settled when the fuzzer and two reviews probed it):
    it bounds one application on the values the rewritten nodes produce. Two things lie outside
    any rounding bound and are stated, not hidden: (1) an intermediate that overflows in one
    form and not the other (inputs near the dtype's max: ``(x*a)*b`` vs ``x*(a*b)``, a
    decomposed LayerNorm's ``(x-mu)^2``) moves an inf/NaN; inf and NaN *inputs* and parameters
    still land exactly where the original puts them; (2) later nodes can amplify the bounded
    error (cancellation, deep networks), so whole-model checks (``verify``) use a measured floor.
    For float16 models "exact" is judged under fp16 emulation (every float16 tensor rounded, as
    the spec computes): onnxruntime's CPU provider runs float16 ops without a float16 kernel in
    float32 between casts it places itself, so its bits follow the graph's structure.
    """

    kind: str  # "exact" | "tolerance" | "opt-in" (a precision change the user asked for: no bound)
    name: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    reason: str = "bitwise-equal outputs on every input"

    @classmethod
    def tolerance(cls, name: str, *, rtol: float, atol: float, reason: str) -> "Promise":
        return cls("tolerance", name, rtol, atol, reason)

    @classmethod
    def opt_in(cls, name: str, *, rtol: float, atol: float, reason: str) -> "Promise":
        """A change of precision the user asks for (never in a default pipeline): values outside
        the lower precision's range overflow and cancellation amplifies its rounding, so no
        per-element bound holds; ``rtol``/``atol`` are only ``verify``'s starting point, and
        ``graphpass precision`` (with fp16 emulation) is what judges the result."""
        return cls("opt-in", name, rtol, atol, reason)

    @property
    def bounded(self) -> bool:
        """Whether the promise is a bound the outputs are held to (exact or a rounding tolerance)."""
        return self.kind != "opt-in"

    @property
    def exact(self) -> bool:
        return self.kind == "exact"

    def __str__(self) -> str:
        if self.exact:
            return "exact"
        if not self.bounded:
            return f"{self.name} (opt-in, no bound)"
        return f"{self.name} (rtol {self.rtol:g}, atol {self.atol:g})"


EXACT = Promise("exact")

#: Float rounding from folding per-channel scales/biases into weights ((x*a)*b -> x*(a*b)).
REASSOCIATION = Promise.tolerance(
    "reassociation", rtol=1e-5, atol=1e-6,
    reason="scales and biases folded into weights: (x*a)*b -> x*(a*b), (x+a)+b -> x+(a+b)")


class PassContractError(AssertionError):
    """A pass broke the contract (no PassResult, or claimed no change but changed the graph)."""


class Pass:
    """Base class of every graphpass pass.

    Subclasses set the class attributes and implement :meth:`run`. ``required`` passes are
    never rolled back by the cost model (e.g. a lowering that makes the graph compilable);
    ``run_once`` passes run only in the first round of the pass manager's fixed-point loop.
    Passes get ``graph.nodes`` in topological order (load sorts; the manager re-sorts after a
    pass that does not declare ``preserves_order``).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    kind: ClassVar[PassKind]
    default_enabled: ClassVar[bool] = True
    required: ClassVar[bool] = False
    idempotent: ClassVar[bool] = True
    run_once: ClassVar[bool] = False
    #: True when the pass keeps ``graph.nodes`` in topological order (it only removes nodes,
    #: or rewires readers to tensors produced earlier). Otherwise the pass manager re-sorts.
    preserves_order: ClassVar[bool] = False
    #: Whether the pass manager may veto an application by the cost model (roll it back when
    #: the estimate rises). None: every kind but cleanup and analysis, whose rewrites only
    #: remove or precompute work.
    scored: ClassVar[bool | None] = None
    #: The corresponding Ascend (ATC/FE) fusion pass, where one exists.
    ascend_name: ClassVar[str | None] = None
    #: What the pass promises about outputs (:class:`Promise`): every pass declares its own.
    promise: ClassVar[Promise]

    def run(self, graph: gs.Graph, ctx: "PassContext") -> PassResult:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def is_scored(cls) -> bool:
        if cls.scored is not None:
            return cls.scored
        return cls.kind not in (PassKind.CLEANUP, PassKind.ANALYSIS)

    def scored_in(self, ctx: "PassContext") -> bool:
        """Whether the cost model may veto this application (a pass may depend on its options)."""
        return self.is_scored()

    def options(self, ctx: "PassContext") -> dict[str, Any]:
        """Per-pass options from the context (``ctx.options[self.name]``)."""
        return ctx.options.get(self.name, {})

    def apply(self, graph: gs.Graph, ctx: "PassContext") -> PassResult:
        """Run the pass and check its contract."""
        before = fingerprint(graph) if ctx.check_contract is not False else None
        result = self.run(graph, ctx)
        if not isinstance(result, PassResult):
            raise PassContractError(f"pass '{self.name}' returned {type(result).__name__}, not PassResult")
        if before is not None and not result.modified and fingerprint(graph) != before:
            raise PassContractError(f"pass '{self.name}' changed the graph but returned modified=False")
        return result

    @classmethod
    def as_function(cls) -> Callable[..., PassResult]:
        """The pass as a plain function ``fn(graph, ctx=None, **options) -> PassResult``."""

        def fn(graph: gs.Graph, ctx: "PassContext | None" = None, **options: Any) -> PassResult:
            from graphpass.passes.framework.context import PassContext

            ctx = ctx or PassContext()
            if options:
                ctx.options = {**ctx.options, cls.name: {**ctx.options.get(cls.name, {}), **options}}
            return cls().apply(graph, ctx)

        functools.update_wrapper(fn, cls.run)
        fn.__name__ = cls.name
        fn.__qualname__ = cls.name
        fn.__doc__ = f"{cls.summary}\n\n{cls.__doc__ or ''}"
        return fn
