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
from graphpass.check.promise import EXACT, REASSOCIATION, Promise  # re-exported: their home is graphpass.check.promise
from graphpass.ir.graph import fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.passes.framework.context import PassContext

__all__ = ["PassKind", "PassResult", "MatchResult", "Pass", "PassContractError", "PassPreconditionError",
           "PassPostconditionError", "Promise", "EXACT", "REASSOCIATION", "graph_of", "MERGE_EQUAL_CONSTANTS",
           "EDITS"]

#: An edit that only makes readers of a Constant read another Constant equal to it in dtype,
#: shape, bytes (-0.0 is not 0.0, NaN payloads count), export dtype and annotations: the two
#: differ in name, identity, scope (a body's may become an outer one) and number of readers
#: only. No node, op type, attribute, Variable, shape or graph input/output changes.
MERGE_EQUAL_CONSTANTS = "merge_equal_constants"

#: The kinds of edit a :class:`PassResult` may name (``edit``, ``survives``), with what each keeps.
EDITS = frozenset({MERGE_EQUAL_CONSTANTS})


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
    #: (a result that changed the graph) the one kind of edit (:data:`EDITS`) the application
    #: made, when it made only that kind; None: anything may have changed
    edit: str | None = None
    #: (a result that changed nothing) kinds of edit (:data:`EDITS`) after which the pass would
    #: still change nothing: the pass manager does not run it again after such an edit (see
    #: :meth:`Pass.survives_edits`). A claim the pass proves from what this run saw.
    survives: frozenset[str] = frozenset()


def __getattr__(name: str) -> Any:
    """``MatchResult`` moved to :mod:`graphpass.passes.framework.rewrite` (the rewrite API); re-exported here."""
    if name == "MatchResult":
        from graphpass.passes.framework.rewrite import MatchResult

        return MatchResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    #: True when the pass needs hardware facts (``ctx.target`` with a profile): applied under
    #: the ``none`` target it raises a UsageError; the pass manager skips it and says why.
    needs_target: ClassVar[bool] = False
    #: The op types the pass rewrites at (None: it may act anywhere). With a set, the pass
    #: manager does not run the pass on a graph (bodies and functions included) that holds none
    #: of them (see :meth:`can_act`).
    anchor_ops: ClassVar[frozenset[str] | None] = None
    #: True when an application that changed the graph leaves a graph the pass (same options,
    #: same context) would not change: the pass manager does not run it on a version of the
    #: graph only it made. Tested on the corpus (tests/infra/test_manager_skips.py).
    idempotent: ClassVar[bool] = False

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

    def can_act(self, ops: frozenset[str], ctx: "PassContext") -> bool:
        """False only when the pass cannot change a graph whose nodes (in every graph, body and
        function) have the op types ``ops``: the pass manager then skips it, as it skips a pass
        that already saw the same graph. Default: from :attr:`anchor_ops`."""
        return self.anchor_ops is None or not self.anchor_ops.isdisjoint(ops)

    def survives_edits(self, result: PassResult) -> frozenset[str]:
        """The kinds of edit (:data:`EDITS`) after which this pass, having changed nothing
        (``result``), would still change nothing. Default: what the result says
        (``result.survives``); a pass whose result the rewrite engine makes may read its counts."""
        return result.survives

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
        if self.needs_target:
            ctx.target.require(f"pass '{self.name}'")
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

