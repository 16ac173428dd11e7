"""The pass contract: ``pass_(model, ctx=None) -> PassResult(modified, stats, model)``.

Modelled on onnx_ir's ``_pass_infra`` and torch.fx's ``PassBase``; the metadata a pass declares
is data, like TVM's ``PassInfo``. A pass implements ``run(graph, ctx)``; calling it checks the
contract around that: ``requires(model)`` before (a model the pass does not support raises
:class:`PassPreconditionError`, an :class:`~graphpass.errors.UnsupportedError`), ``ensures(model)``
after, a ``PassResult`` returned, and ``modified=False`` only when the structure is unchanged.
A pass's options are typed keyword arguments of its constructor (``FoldConstants(size_limit=1)``);
an unknown one is a ``TypeError`` naming the valid ones.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import onnx_graphsurgeon as gs

from graphpass.errors import UnsupportedError
from graphpass.ir.graph import fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.passes.framework.context import PassContext

__all__ = ["PassKind", "PassResult", "MatchResult", "Pass", "PassContractError", "PassPreconditionError",
           "PassPostconditionError", "Promise", "EXACT", "REASSOCIATION", "graph_of"]


class PassKind(str, enum.Enum):
    """The family of a pass. ``ANALYSIS`` passes only read: calling one that changes the graph
    (or says it did) is a :class:`PassContractError`; they write what they find in ``stats``."""

    CLEANUP = "cleanup"
    LAYOUT = "layout"
    FUSION = "fusion"
    LOWERING = "lowering"
    PLACEMENT = "placement"
    PRECISION = "precision"
    ANALYSIS = "analysis"


@dataclasses.dataclass
class PassResult:
    """What one application of a pass did. ``stats`` holds counts such as ``{"removed": 3}``;
    ``model`` is the model the pass was called on (changed in place; None from ``run``, filled
    in by :meth:`Pass.__call__`)."""

    modified: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: Any = None


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
    """A pass broke the contract (no PassResult, claimed no change but changed the graph, an
    analysis pass that changed the graph, or a failed ``ensures``): a bug in the pass."""


class PassPreconditionError(UnsupportedError):
    """``requires(model)`` refused: the model is not one this pass supports (exit 2, one line)."""


class PassPostconditionError(PassContractError):
    """``ensures(model)`` refused after ``run``: the pass left the model in a state it promises
    never to leave it in."""


def graph_of(model: Any) -> gs.Graph:
    """The ``gs.Graph`` a pass works on: ``model`` itself, or ``model.graph`` for a graphpass
    Model (anything whose ``graph`` attribute is a ``gs.Graph``)."""
    if isinstance(model, gs.Graph):
        return model
    graph = getattr(model, "graph", None)
    if isinstance(graph, gs.Graph):
        return graph
    raise TypeError(
        f"a pass takes a graphpass Model or an onnx_graphsurgeon Graph, not {type(model).__name__}"
        " (load it first: graphpass.load(...))"
    )


def _option_params(init: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """The keyword options ``init`` declares, and whether it takes ``**kwargs``."""
    params = list(inspect.signature(init).parameters.values())[1:]  # drop self
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    return [p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)], var_kw


class Pass:
    """Base class of every graphpass pass.

    Subclasses set the class attributes and implement :meth:`run`. ``required`` passes are
    never rolled back by the cost model (e.g. a lowering that makes the graph compilable);
    ``run_once`` passes run only in the first round of the pass manager's fixed-point loop.
    Passes get ``graph.nodes`` in topological order (load sorts; the manager re-sorts after a
    pass that does not declare ``preserves_order``).

    Options are keyword-only arguments of the subclass's ``__init__``, stored on the instance
    (``self.size_limit``); the base class checks their names, so ``FoldConstants(size_limt=1)``
    is a ``TypeError`` that lists the valid ones.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    kind: ClassVar[PassKind]
    default_enabled: ClassVar[bool] = True
    required: ClassVar[bool] = False
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
    #: Ordering, checked by ``pipelines.build``: pass names (or whole :class:`PassKind`
    #: families) that must come earlier / later in a pipeline that holds both.
    runs_after: ClassVar[tuple[str | PassKind, ...]] = ()
    runs_before: ClassVar[tuple[str | PassKind, ...]] = ()

    def __init__(self, **options: Any) -> None:
        if options:  # a pass without options: any keyword is a typo
            raise TypeError(_unknown_options(type(self), sorted(options), []))

    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)])

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_gp_checked", False):
            return
        params, var_kw = _option_params(init)
        if var_kw:
            return  # takes anything: the subclass checks its own options
        valid = [p.name for p in params]

        @functools.wraps(init)
        def checked(self: "Pass", *args: Any, **options: Any) -> None:
            unknown = sorted(set(options) - set(valid))
            if unknown:
                raise TypeError(_unknown_options(cls, unknown, valid))
            init(self, *args, **options)

        checked._gp_checked = True  # type: ignore[attr-defined]
        cls.__init__ = checked  # type: ignore[method-assign]

    # -- options ---------------------------------------------------------------------------

    @classmethod
    def option_names(cls) -> list[str]:
        """The names of the options the constructor takes."""
        return [p.name for p in _option_params(cls.__init__)[0]]

    @classmethod
    def from_options(cls, options: "dict[str, Any] | None" = None) -> "Pass":
        """``cls(**options)``; kept for callers holding options as a dict."""
        return cls(**dict(options or {}))

    def options(self, ctx: "PassContext | None" = None) -> dict[str, Any]:
        """The instance's option values, ``{name: value}`` (``ctx`` is ignored: options are
        constructor arguments now, no longer read from the context)."""
        return {n: getattr(self, n) for n in self.option_names() if hasattr(self, n)}

    # -- metadata --------------------------------------------------------------------------

    @classmethod
    def is_scored(cls) -> bool:
        if cls.scored is not None:
            return cls.scored
        return cls.kind not in (PassKind.CLEANUP, PassKind.ANALYSIS)

    def scored_in(self, ctx: "PassContext") -> bool:
        """Whether the cost model may veto this application (a pass may depend on its options)."""
        return self.is_scored()

    # -- the contract ----------------------------------------------------------------------

    def requires(self, model: Any) -> None:
        """Pre-condition, checked before :meth:`run`: raise :class:`PassPreconditionError`
        (with the reason) when ``model`` is not one this pass supports. Default: any model."""

    def ensures(self, model: Any) -> None:
        """Post-condition, checked after :meth:`run`: raise :class:`PassPostconditionError`
        when the pass left ``model`` in a state it promises never to leave. Default: nothing."""

    def run(self, graph: gs.Graph, ctx: "PassContext") -> PassResult:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, model: Any, ctx: "PassContext | None" = None) -> PassResult:
        """Apply the pass to ``model`` (a graphpass Model or a ``gs.Graph``, changed in place)
        and check the contract: ``requires``, a ``PassResult`` from ``run``, ``ensures``, and
        that ``modified=False`` left the structure unchanged. Returns the result with
        ``result.model`` set to ``model``."""
        from graphpass.passes.framework.context import PassContext

        graph = graph_of(model)
        ctx = ctx if ctx is not None else PassContext()
        before = fingerprint(graph)
        result = self.apply_to(model, graph, ctx)
        if not result.modified and fingerprint(graph) != before:
            raise PassContractError(f"pass '{self.name}' changed the graph but returned modified=False")
        return result

    def apply_to(self, model: Any, graph: gs.Graph, ctx: "PassContext") -> PassResult:
        """``requires``, ``run``, the result's type, ``ensures``: the checks every application
        gets (the pass manager calls this; the ``modified`` honesty check is its ContractCheck
        instrument's job there, :meth:`__call__`'s here)."""
        self.requires(model)
        analysis = self.kind is PassKind.ANALYSIS
        before = fingerprint(graph) if analysis else None
        result = self.run(graph, ctx)
        if not isinstance(result, PassResult):
            raise PassContractError(f"pass '{self.name}' returned {type(result).__name__}, not PassResult")
        if analysis and (result.modified or fingerprint(graph) != before):
            raise PassContractError(f"analysis pass '{self.name}' changed the graph: an analysis only reads")
        self.ensures(model)
        result.model = model
        return result

    def apply(self, graph: gs.Graph, ctx: "PassContext") -> PassResult:
        """``self(graph, ctx)``: the older name of a checked application."""
        return self(graph, ctx)

    @classmethod
    def as_function(cls) -> Callable[..., PassResult]:
        """The pass as a plain function ``fn(model, ctx=None, *, <the pass's options>)``:
        ``cls(**options)(model, ctx)``. Its signature is the pass's real one."""

        def fn(model: Any, ctx: "PassContext | None" = None, **options: Any) -> PassResult:
            return cls(**options)(model, ctx)

        opts = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in _option_params(cls.__init__)[0]]
        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
             inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None), *opts],
            return_annotation=PassResult,
        )
        fn.__name__ = cls.name
        fn.__qualname__ = cls.name
        fn.__module__ = cls.__module__
        fn.__doc__ = f"{cls.summary}\n\n{cls.__doc__ or ''}"
        fn.pass_class = cls  # type: ignore[attr-defined]
        return fn


def _unknown_options(cls: type, unknown: list[str], valid: list[str]) -> str:
    name = getattr(cls, "name", cls.__name__)
    known = ", ".join(valid) if valid else "none"
    return f"pass '{name}' has no option {', '.join(repr(u) for u in unknown)}; its options: {known}"

