"""What the cost model says about storage formats, node by node: the layout passes' oracle.

Layout propagation (``passes/layout``) chooses a storage format for every tensor. It asks this
oracle, never the hardware numbers directly, so the choice minimizes exactly what
:meth:`AscendCostModel.estimate` charges:

* :meth:`FormatOracle.role` — what a node does with formats: ``fixed`` (the op-info table
  gives the formats, e.g. Conv takes and gives NC1HWC0), ``choice`` (format-agnostic or reduce
  ops that can run in ND or NC1HWC0), ``nd`` (ND islands, AI CPU and host ops, unknown ops) or
  ``free`` (Shape/Size read no data); :meth:`FormatOracle.roles` gives every node's role and
  memo key in one walk (the layout plan's);
* :meth:`FormatOracle.node_us` — the estimate of a ``choice`` node in each format (padding
  inflation, the repacking kernel of a Concat of unaligned C in NC1HWC0);
* :meth:`FormatOracle.transdata_us` — one explicit TransData of a tensor (memory-bound
  kernel, GE-FT/§9 of ascend_facts.md).

A ``choice`` node may use NC1HWC0 only when the cost model's own rule allows it (FE-SEL
broadcast rule; C-axis Concat/Split; reduce) *and* every runtime tensor it touches is a float
tensor of static rank-4 shape (a TransData of a symbolic or int tensor is not something the
passes can price; such tensors stay in their origin format).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir import annotations as A

if TYPE_CHECKING:  # pragma: no cover
    from graphpass.cost_model.ascend import AscendCostModel

__all__ = ["FormatOracle", "NodeRole", "FIVE_HD", "PLAIN", "plain"]

FIVE_HD = "NC1HWC0"
#: Formats with the same bytes in the same order (converting between them is free).
PLAIN = frozenset({"ND", "NCHW"})
_FLOATS = frozenset({np.dtype("float16"), np.dtype("float32")})


def plain(fmt: str) -> str:
    """``fmt`` with NCHW folded into ND (the cost model treats them as one)."""
    return "ND" if fmt in PLAIN else fmt


@dataclasses.dataclass
class NodeRole:
    """How one node constrains formats.

    kind: ``fixed`` | ``choice`` | ``nd`` | ``free``.
    ins / outs: for ``fixed`` and ``nd`` nodes, the format of each input / output (None for an
        input that is a compile-time constant or empty). For ``choice`` nodes, the formats in ND
        mode (``ins``/``outs``) and in NC1HWC0 mode (``ins5``/``outs5``).
    why: for a ``choice`` node that must stay in ND, or an ``nd`` node, the reason.
    """

    kind: str
    ins: list[str | None]
    outs: list[str]
    ins5: list[str | None] = dataclasses.field(default_factory=list)
    outs5: list[str] = dataclasses.field(default_factory=list)
    why: str = ""
    label: str = ""
    layout: str = ""  # the op-info layout class (agnostic, reduce, fixed, nd, ...)


class FormatOracle:
    """Per-node format facts of one graph under one cost model and precision mode."""

    def __init__(self, model: "AscendCostModel", graph: gs.Graph, precision_mode: str | None = None,
                 input_shapes: dict[str, list[int]] | None = None):
        from graphpass.cost_model.ascend import _Ctx

        self.model = model
        self.graph = graph
        mode = precision_mode or model.profile.default_precision_mode
        self.cx = _Ctx(model, mode, 1, dict(input_shapes or {}))
        self.cx.set_graph(graph)
        self.const: set[int] = set()
        static = model.static_inputs(graph)
        for node in graph.nodes:  # GE's compile-time constant folding, as the estimate does it
            info = model.ops.lookup(node.op, node.domain)
            if model._folded_by_ge(node, info, self.const, static):
                self.const.update(id(t) for t in node.outputs)
        self._roles: dict[tuple, NodeRole] = {}
        self._td: dict[tuple, float] = {}

    # -- tensors ---------------------------------------------------------------------------

    def is_const(self, t: gs.Tensor) -> bool:
        """A compile-time constant: a weight, or a value GE folds (its format is set up front)."""
        return isinstance(t, gs.Constant) or id(t) in self.const

    def is_runtime(self, t: gs.Tensor) -> bool:
        return bool(t.name) and not self.is_const(t)

    def opaque_reason(self, t: gs.Tensor) -> str:
        """Why a runtime tensor cannot be priced in another format ('' when it can)."""
        from graphpass.ir.shapes import dim_hint

        shape = t.shape
        if shape is None:
            return f"tensor '{t.name}' has unknown rank"
        odd = [d for d in shape if not (type(d) is int or isinstance(d, np.integer)) or int(d) < 0]
        if odd:
            return f"tensor '{t.name}' has a symbolic shape {list(shape)} ({dim_hint(self.graph, odd[0])})"
        return ""

    def shape(self, t: gs.Tensor) -> tuple[int, ...]:
        return self.model._shape(t, self.cx)

    def five_hd_tensor_reason(self, t: gs.Tensor) -> str:
        why = self.opaque_reason(t)
        if why:
            return why
        if len(t.shape) != 4:
            return f"tensor '{t.name}' is rank {len(t.shape)} (NC1HWC0 needs rank 4)"
        try:
            dt = np.dtype(t.dtype)
        except TypeError:
            dt = None
        if dt not in _FLOATS:
            return f"tensor '{t.name}' is {getattr(dt, 'name', t.dtype)} (TransData takes float16/float32)"
        return ""

    # -- nodes -----------------------------------------------------------------------------

    def label(self, node: gs.Node) -> str:
        info = self.model.ops.lookup(node.op, node.domain)
        return info.ascend if info is not None else node.op

    def engine(self, node: gs.Node) -> str:
        info = self.model.ops.lookup(node.op, node.domain)
        engine, _, _ = self.model._engine(node, info, self.cx)
        ann = A.get_engine(node)
        return ann if ann in ("AICORE", "AICPU", "HOST") else engine

    def role_key(self, node: gs.Node) -> tuple | None:
        """What :meth:`role` memoizes a node's role by: op, domain, engine annotation, each
        input's (shape, dtype, runtime), each output's (shape, dtype), attributes (None: an
        unhashable part, a subgraph or a tensor)."""
        const, Constant = self.const, gs.Constant  # is_runtime, inlined: a key per node
        try:
            key = (node.op, node.domain, A.get_engine(node),
                   tuple([(tuple(t.shape) if t.shape is not None else None, t.dtype,
                           bool(t.name) and not (isinstance(t, Constant) or id(t) in const)) for t in node.inputs]),
                   tuple([(tuple(t.shape) if t.shape is not None else None, t.dtype) for t in node.outputs]),
                   tuple(sorted([(k, str(v)) for k, v in node.attrs.items()])))
            hash(key)
        except TypeError:
            return None
        return key

    def roles(self, nodes: Iterable[gs.Node]) -> Iterator[tuple[tuple | None, NodeRole]]:
        """``(role_key(node), role(node, copy=False, key=that key))`` of each node, one at a time:
        the same keys and roles, with the key put together inline and hashed once (the layout
        plan's walk over every node; a key is dropped once the caller moves on: a 100k-node
        graph's keys held at once were ~20 MB)."""
        const, Constant, get_engine = self.const, gs.Constant, A.get_engine
        memo, make = self._roles, self._role
        for node in nodes:
            attrs = node.attrs
            try:  # role_key
                key = (node.op, node.domain, get_engine(node),
                       tuple([((tuple(s) if (s := t.shape) is not None else None), t.dtype,
                               bool(t.name) and not (isinstance(t, Constant) or id(t) in const)) for t in node.inputs]),
                       tuple([((tuple(s) if (s := t.shape) is not None else None), t.dtype) for t in node.outputs]),
                       tuple(sorted([(k, str(v)) for k, v in attrs.items()])) if attrs else ())
                hit = memo.get(key)  # (hashes the key: unhashable, a TypeError)
            except TypeError:
                yield None, make(node)
                continue
            if hit is None:
                hit = memo[key] = make(node)
            yield key, hit

    def role(self, node: gs.Node, copy: bool = True, key: tuple | None | bool = False) -> NodeRole:
        """The node's :class:`NodeRole` (memoized by :meth:`role_key`; ``key``: that key if the
        caller has it). ``copy=False``: the memoized role itself, shared by every node of the
        same key, for a caller that only reads it (the layout plan)."""
        if key is False:
            key = self.role_key(node)
        if key is None:
            return self._role(node)
        hit = self._roles.get(key)
        if hit is None:
            hit = self._roles[key] = self._role(node)
        if not copy:
            return hit
        return dataclasses.replace(hit, ins=list(hit.ins), outs=list(hit.outs), ins5=list(hit.ins5), outs5=list(hit.outs5))

    def _role(self, node: gs.Node) -> NodeRole:
        model = self.model
        info = model.ops.lookup(node.op, node.domain)
        label = info.ascend if info is not None else node.op
        runtime = [self.is_runtime(t) for t in node.inputs]
        n_out = len(node.outputs)

        def nd(why: str) -> NodeRole:
            return NodeRole("nd", ["ND" if r else None for r in runtime], ["ND"] * n_out, why=why, label=label)

        if node.op in ("Shape", "Size") and node.domain in (None, "", "ai.onnx"):
            return NodeRole("free", [None] * len(runtime), ["ND"] * n_out, label=label)
        if info is None:
            return nd(f"{node.op} is not in the op-info table (kept in its origin format, costed as AI CPU)")
        engine = self.engine(node)
        if engine != "AICORE":
            return nd(f"{label} runs on {'AI CPU' if engine == 'AICPU' else 'the host'}, which reads ND")
        if info.layout == "fixed":
            ins, outs = model._formats(node, info, {}, self.cx, self.const)
            return NodeRole("fixed", [plain(f) if r else None for f, r in zip(ins, runtime)], [plain(f) for f in outs],
                            label=label)
        if info.layout in ("nd", "none", "any"):
            why = f"{label} accepts ND only" if info.layout == "nd" else f"{label} has no data layout of its own"
            return nd(why)
        # agnostic / reduce: what the cost model's rule gives when the first runtime input is 5HD
        first = next((t for t, r in zip(node.inputs, runtime) if r), None)
        if first is None:
            return nd(f"{label} has no runtime input")
        ins5, outs5 = model._formats(node, info, {id(first): FIVE_HD}, self.cx, self.const)
        ins0, outs0 = ["ND"] * len(runtime), ["ND"] * n_out
        role = NodeRole("choice", [f if r else None for f, r in zip(ins0, runtime)], outs0,
                        [plain(f) if r else None for f, r in zip(ins5, runtime)], [plain(f) for f in outs5], label=label,
                        layout=info.layout)
        if FIVE_HD not in role.ins5:
            role.kind, role.why = "nd", self._why_not_5hd(node, label)
            return role
        for t, f in list(zip(node.inputs, role.ins5)) + list(zip(node.outputs, role.outs5)):
            if f == FIVE_HD:
                why = self.five_hd_tensor_reason(t)
                if why:
                    role.kind, role.why = "nd", f"{label} stays in ND: {why}"
                    return role
        return role

    def _why_not_5hd(self, node: gs.Node, label: str) -> str:
        if node.op in ("Concat", "Split"):
            return f"{label} along axis {node.attrs.get('axis', 0)} (not C) cannot run in NC1HWC0"
        shapes = [self.shape(t) for t in node.inputs if self.is_runtime(t)]
        if any(len(s) != 4 for s in shapes):
            return f"{label} has an input of rank {next(len(s) for s in shapes if len(s) != 4)} (NC1HWC0 needs rank 4)"
        return f"{label} broadcasts over C (the NC1HWC0 broadcast rule needs the same C on every input)"

    def node_us(self, node: gs.Node, role: NodeRole, five_hd: bool) -> float:
        """Estimate of a ``choice`` node with its runtime tensors in ND or NC1HWC0."""
        model = self.model
        info = model.ops.lookup(node.op, node.domain)
        engine, compute16, _ = model._engine(node, info, self.cx)
        ins = role.ins5 if five_hd else role.ins
        outs = role.outs5 if five_hd else role.outs
        rec = model._node_cost(node, info, engine, compute16, [f or "ND" for f in ins], list(outs), False, self.cx)
        return rec["us"]

    def native_5hd(self, node: gs.Node) -> bool:
        """Whether a ``choice`` node runs in NC1HWC0 as itself: a Concat/Split along C needs every
        part's C to be a multiple of C0 (GE-CNT); otherwise FE converts it to ND (seed 002, item 3)."""
        if node.op == "Concat":
            parts = [t for t in node.inputs if self.is_runtime(t)]
        elif node.op == "Split":
            parts = [t for t in node.outputs if t.name]
        else:
            return True
        return all(len(self.shape(t)) == 4 and self.shape(t)[1] % self.model.fr.c0_2byte == 0 for t in parts)

    def choice_note(self, node: gs.Node) -> str:
        """Why a node that could run in NC1HWC0 is dearer there (for the report)."""
        if node.op == "Concat":
            chans = [self.shape(t)[1] for t in node.inputs if self.is_runtime(t) and len(self.shape(t)) == 4]
            c0 = self.model.fr.c0_2byte
            if any(c % c0 for c in chans):
                return f"Concat of C={'/'.join(str(c) for c in chans)} inputs cannot stay in 5HD (C not a multiple of {c0}: repacking kernel)"
        return f"{self.label(node)} costs less in ND than in NC1HWC0 here (estimate)"

    @property
    def kernel_launch_us(self) -> float:
        """What one more kernel costs before it moves a byte (the profile's launch overhead): what
        a UB fusion saves, which the per-node prices of :meth:`node_us` leave out."""
        return self.model.pv.kernel_launch_us

    def transdata_us(self, t: gs.Tensor, src: str, dst: str) -> float:
        """Estimate of one explicit ``TransData(src -> dst)`` of ``t``: what the estimate charges it."""
        if plain(src) == plain(dst):
            return 0.0
        key = (tuple(self.shape(t)), t.dtype, src, dst)
        hit = self._td.get(key)
        if hit is None:
            hit = self._td[key] = self.model._transdata_us(t, src, dst, self.cx)
        return hit

