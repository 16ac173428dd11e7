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
from graphpass.check.promise import EXACT, REASSOCIATION, Promise  # re-exported: their home is graphpass.check.promise

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


def __getattr__(name: str) -> Any:
    """``MatchResult`` moved to :mod:`graphpass.infra.rewrite` (the rewrite API); re-exported here."""
    if name == "MatchResult":
        from graphpass.passes.framework.rewrite import MatchResult

        return MatchResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    #: True when the pass needs hardware facts (``ctx.target`` with a profile): applied under
    #: the ``none`` target it raises a UsageError; the pass manager skips it and says why.
    needs_target: ClassVar[bool] = False

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
        if self.needs_target:
            ctx.target.require(f"pass '{self.name}'")
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
