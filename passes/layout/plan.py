"""The layout problem of one graph: roles, the energy, the optimal and greedy assignments,
and the TransData each assignment implies.

Vocabulary: an *endpoint* is one side of a tensor (its producer, or one reader) with the
format that side gives or wants: either a constant format ("ND", "NC1HWC0", "FRACTAL_NZ", ...)
or the variable of a format-agnostic node (ND when 0, NC1HWC0 when 1). A tensor needs one
TransData per distinct wanted format that differs from the format it is produced in (a
conversion is shared by every reader that wants it; GE's SameTransdataBreadthFusionPass does
the same merge).

Only the top graph is planned. Subgraph bodies (If/Loop/Scan) keep their origin format: a
tensor a body reads is wanted in ND. Tensors of unknown rank or symbolic shape are not planned
(no term, no TransData): they stay in their origin format and the plan lists why.
"""

from __future__ import annotations

import dataclasses

import onnx_graphsurgeon as gs

from graphpass.cost_model.formats import FIVE_HD, FormatOracle, NodeRole
from graphpass.ir import annotations as A
from graphpass.passes.layout.solver import Energy, solve

__all__ = ["LayoutPlan", "Conversion", "MODES"]

MODES = ("optimal", "greedy")
_UNSET = object()  # an endpoint not looked up yet
_PLANNED = frozenset({"ND", FIVE_HD})  # the formats of a variable


@dataclasses.dataclass(frozen=True, slots=True)
class _End:
    fmt: str | None = None  # a constant format
    var: int | None = None  # or the variable of a choice node

    def resolve(self, x: list[int]) -> str:
        if self.var is None:
            return self.fmt  # type: ignore[return-value]
        return FIVE_HD if x[self.var] else "ND"


@dataclasses.dataclass(slots=True)
class _Reader:
    end: _End
    node: gs.Node | None  # None: a graph output
    kind: str  # "node" | "output" | "body"
    index: int | None = None  # which input of ``node`` (None: every input that is the tensor)


@dataclasses.dataclass(slots=True)
class _Tensor:
    tensor: gs.Tensor
    producer: _End
    readers: list[_Reader]
    shape: tuple | None = None  # the static shape its prices are asked by (None: of the oracle; LayoutPlan._price)


@dataclasses.dataclass
class Conversion:
    """One TransData an assignment needs: ``tensor`` from ``src`` to ``dst`` for ``readers``."""

    tensor: gs.Tensor
    src: str
    dst: str
    readers: list[_Reader]
    us: float


def _signature(node: gs.Node, role) -> tuple | None:
    """What a node's cost depends on: op, formats, shapes, dtypes, attributes (None: not hashable).
    ``_build`` puts the same tuple together from the oracle's role key when it has one."""
    try:
        key = (node.op, node.domain, tuple(role.ins), tuple(role.ins5), tuple(role.outs5),
               tuple((tuple(t.shape) if t.shape is not None else None, t.dtype) for t in node.inputs),
               tuple((tuple(t.shape) if t.shape is not None else None, t.dtype) for t in node.outputs),
               tuple(sorted((k, str(v)) for k, v in node.attrs.items())))
        hash(key)
        return key
    except TypeError:
        return None


class LayoutPlan:
    """Build once per graph; then :meth:`assign` and :meth:`conversions` per mode."""

    def __init__(self, graph: gs.Graph, oracle: FormatOracle):
        self.graph = graph
        self.oracle = oracle
        self.roles: dict[int, NodeRole] = {}
        self.var_node: list[gs.Node] = []
        self.var_of: dict[int, int] = {}
        self.energy = Energy()
        self.tensors: list[_Tensor] = []
        self.skipped: dict[str, None] = {}  # reasons tensors were left in their origin format
        self._td: dict[tuple, float] = {}
        self._build()

    # -- building ------------------------------------------------------------------------

    def _build(self) -> None:
        g, o = self.graph, self.oracle
        nodes = g.nodes
        at: dict[int, tuple[NodeRole, int]] = {}  # id(node) of the top graph -> (role, variable or -1)
        per_node: list[tuple[NodeRole, int]] = []  # the same, in node order
        memo: dict = {}
        roles = self.roles
        var_of = self.var_of
        var_node = self.var_node
        energy = self.energy
        unary = energy.unary
        role_lists: dict[int, tuple] = {}
        role_costs: dict[int, tuple[float, float]] = {}  # id(role) -> its (ND, NC1HWC0) costs
        for node, (rkey, role) in zip(nodes, o.roles(nodes)):  # read only: one role per key, not a copy per node
            roles[id(node)] = role
            if role.kind != "choice":
                at[id(node)] = rv = (role, -1)
                per_node.append(rv)
            else:
                # the nodes of one role (one role key) have the same signature below: costs looked up once
                costs = role_costs.get(id(role)) if rkey is not None else None
                if costs is None:
                    lists = role_lists.get(id(role))
                    if lists is None:
                        lists = role_lists[id(role)] = (tuple(role.ins), tuple(role.ins5), tuple(role.outs5), role)
                    key = _signature(node, role) if rkey is None else (
                        node.op, node.domain, lists[0], lists[1], lists[2], tuple([(s, d) for s, d, _ in rkey[3]]),
                        rkey[4], rkey[5])
                    costs = memo.get(key) if key is not None else None
                    if costs is None:
                        costs = (o.node_us(node, role, False), o.node_us(node, role, True))
                        if key is not None:
                            memo[key] = costs
                    if rkey is not None:
                        role_costs[id(role)] = costs
                var_of[id(node)] = v = len(unary)  # Energy.add_var
                at[id(node)] = rv = (role, v)
                per_node.append(rv)
                unary.append([costs[0], costs[1]])
                var_node.append(node)
        energy.n = len(unary)
        self._var_end = var_end = [_End(var=v) for v in range(energy.n)]
        self._fmt_end: dict[str | None, _End] = {}
        outputs = {id(t) for t in g.outputs}
        const, Constant, opaque_reason = o.const, gs.Constant, o.opaque_reason
        tensors, skipped, price = self.tensors, self.skipped, self._price
        Variable = gs.Variable
        add, end_of = energy.add_any_sorted, self._end
        nd = end_of("ND")
        # per role (id), the endpoint of each input position (None: the node's variable), filled as met
        in_ends: dict[int, list] = {}
        unset = _UNSET
        for t, end in self._produced(g, per_node):
            if not t.name or isinstance(t, Constant) or id(t) in const:  # not oracle.is_runtime(t)
                continue
            shape = t.shape
            static = shape is not None
            if static:
                for d in shape:
                    if type(d) is not int or d < 0:
                        static = False
                        break
            # a static shape has no reason to be opaque (the oracle words the reason otherwise)
            if not static:
                why = opaque_reason(t)
                if why:
                    skipped.setdefault(why, None)
                    continue
            # the tensor's prices: asked of the shape cache by this key (None: of the oracle)
            tk = tuple(shape) if static and type(t) is Variable else None
            readers: list[_Reader] = []
            fixed: set[str] = set()  # the constant formats readers want (filled in reader order)
            found: set[int] = set()  # the readers' variables
            consumers = t.outputs
            seen: set[int] | None = set() if len(consumers) > 1 else None
            for consumer in consumers:
                c = id(consumer)
                if seen is not None:
                    if c in seen:  # a node reading the tensor twice is listed twice
                        continue
                    seen.add(c)
                rv = at.get(c)
                if rv is None:  # not a node of the top graph
                    readers.append(_Reader(nd, consumer, "body"))
                    fixed.add("ND")
                    continue
                role, v = rv
                if role.kind == "free":
                    continue
                ends = in_ends.get(id(role))
                if ends is None:
                    ends = in_ends[id(role)] = [unset] * len(consumer.inputs)
                for i, u in enumerate(consumer.inputs):
                    if u is t:
                        e = ends[i] if i < len(ends) else unset
                        if e is unset:
                            e = self._in_end(role, i)
                            if i < len(ends):
                                ends[i] = e
                        if e is None:
                            readers.append(_Reader(var_end[v], consumer, "node", i))
                            found.add(v)
                        else:
                            readers.append(_Reader(e, consumer, "node", i))
                            fixed.add(e.fmt)
            if id(t) in outputs:
                readers.append(_Reader(nd, None, "output"))
                fixed.add("ND")
            if not readers:
                continue
            tensors.append(_Tensor(t, end, readers, tk))
            # the energy's terms of the tensor (each of its prices asked once here)
            if end.var is None:
                src = end.fmt
                energy.constant += sum(price(t, tk, src, f) for f in fixed if f != src)
                if found:
                    vars_ = tuple(sorted(found))
                    for f, val in (("ND", 0), (FIVE_HD, 1)):
                        if f != src and f not in fixed:
                            add(val, price(t, tk, src, f), vars_)
                continue
            v = end.var
            if fixed and not fixed <= _PLANNED:
                for f in fixed - {"ND", FIVE_HD}:  # e.g. FRACTAL_NZ: its price depends on v's format
                    unary[v][0] += price(t, tk, "ND", f)
                    unary[v][1] += price(t, tk, FIVE_HD, f)
            w = price(t, tk, "ND", FIVE_HD)  # symmetric: bytes in + bytes out
            found.add(v)
            members = tuple(sorted(found))
            energy.constant -= w
            for f, val in (("ND", 0), (FIVE_HD, 1)):
                if f in fixed:
                    energy.constant += w
                else:
                    add(val, w, members)

    def _end(self, fmt: str | None) -> _End:
        """The endpoint of constant format ``fmt`` (one object per format: endpoints are frozen)."""
        hit = self._fmt_end.get(fmt)
        if hit is None:
            hit = self._fmt_end[fmt] = _End(fmt)
        return hit

    def _produced(self, g: gs.Graph, per_node: list[tuple[NodeRole, int]]) -> list[tuple[gs.Tensor, _End]]:
        """Every tensor the top graph makes (its inputs, then each node's outputs in order), with
        the endpoint of its producer; ``per_node``: each node's role and variable (-1: none)."""
        nd = self._end("ND")
        out = [(t, nd) for t in g.inputs]
        var_end = self._var_end
        out_ends: dict[int, list] = {}  # per role (id): each output's constant endpoint, or None (a variable's)
        append = out.append
        for node, (role, v) in zip(g.nodes, per_node):
            outputs = node.outputs
            ends = out_ends.get(id(role))
            if ends is None or len(ends) != len(outputs):
                ends = out_ends[id(role)] = self._out_ends(role, len(outputs))
            if role.kind == "choice":
                v_end = var_end[v]
                for t, e in zip(outputs, ends):
                    append((t, v_end if e is None else e))
            else:
                for t, e in zip(outputs, ends):
                    append((t, e))
        return out

    def _out_ends(self, role: NodeRole, n: int) -> list[_End | None]:
        """The producer endpoint of each of ``n`` outputs of a node of ``role`` (None: the node's variable)."""
        outs, end = role.outs, self._end
        if role.kind == "choice":
            outs5 = role.outs5
            return [None if outs[j] != outs5[j] else end(outs[j] if j < len(outs) else "ND") for j in range(n)]
        return [end(outs[j] if j < len(outs) else "ND") for j in range(n)]

    def _in_end(self, role: NodeRole, i: int) -> _End | None:
        """The endpoint input ``i`` of a node of ``role`` wants (None: the node's variable)."""
        if role.kind == "choice":
            f0, f1 = role.ins[i], role.ins5[i]
            if f0 != f1:
                return None
            return self._end(f0 or "ND")
        f = role.ins[i] if i < len(role.ins) else "ND"
        return self._end(f or "ND")

    def _price(self, t: gs.Tensor, shape: tuple | None, src: str, dst: str) -> float:
        """The oracle's price of a TransData of ``t``, asked once per (shape, dtype, src, dst) for a
        variable of static shape (``shape``: that shape as a tuple, None for any other tensor): the
        oracle's own key for it (its shape is the static shape as it is), so the same figure."""
        if shape is None:
            return self.oracle.transdata_us(t, src, dst)
        key = (shape, t.dtype, src, dst)
        try:
            hit = self._td.get(key)
        except TypeError:  # an unhashable dtype: the oracle decides
            return self.oracle.transdata_us(t, src, dst)
        if hit is None:
            hit = self._td[key] = self.oracle.transdata_us(t, src, dst)
        return hit

    # -- assignments ---------------------------------------------------------------------

    def assign(self, mode: str = "optimal") -> tuple[list[int], dict[int, str]]:
        """Compute format of every choice node (and, greedy only, outputs stored differently)."""
        if mode == "optimal":
            return solve(self.energy), {}
        if mode == "greedy":
            return self._greedy()
        raise ValueError(f"unknown layout mode '{mode}' (known: {', '.join(MODES)})")

    def _greedy(self) -> tuple[list[int], dict[int, str]]:
        """The rule the seeds complain about (GE-FMT; seed 002 items 3 and 8): a format-agnostic
        op takes its first runtime input's format, and its output keeps that format even when the
        op itself cannot run in it (an unaligned Concat computes in ND between TransData and
        converts its output back to NC1HWC0). Returns the compute formats and, for outputs
        stored in another format than computed, that stored format."""
        if not self.energy.n:  # no choice node: nothing to assign, and only a choice node stores differently
            return [], {}
        x = [0] * self.energy.n
        stored: dict[int, str] = {}
        fmt: dict[int, str] = {}
        for t in self.graph.inputs:
            fmt[id(t)] = "ND"
        roles, var_of, native_5hd = self.roles, self.var_of, self.oracle.native_5hd
        first_of: dict[int, int] = {}  # role -> the position of its first runtime input
        for node in self.graph.nodes:
            role = roles[id(node)]
            outs = role.outs
            if role.kind == "choice":
                v = var_of[id(node)]
                k = first_of.get(id(role))
                if k is None:
                    k = first_of[id(role)] = next(i for i, f in enumerate(role.ins) if f is not None)
                first = node.inputs[k]
                if fmt.get(id(first), "ND") == FIVE_HD:
                    if native_5hd(node):
                        x[v], outs = 1, role.outs5
                    elif role.layout == "agnostic":
                        for t, f in zip(node.outputs, role.outs5):
                            stored[id(t)] = f
            for j, t in enumerate(node.outputs):
                fmt[id(t)] = stored.get(id(t)) or (outs[j] if j < len(outs) else "ND")
        return x, stored

    def conversions(self, x: list[int], stored: dict[int, str] | None = None) -> list[Conversion]:
        """The TransData assignment ``x`` needs. ``stored``: tensors kept in another format than
        their producer computes (greedy only): each first gets a conversion from the compute
        format, with ``readers`` empty."""
        stored = stored or {}
        out: list[Conversion] = []
        price = self._price  # (by the shape the build found)
        for rec in self.tensors:
            p = rec.producer
            src = p.fmt if p.var is None else (FIVE_HD if x[p.var] else "ND")  # _End.resolve
            if stored:
                keep = stored.get(id(rec.tensor))
                if keep is not None and keep != src:
                    out.append(Conversion(rec.tensor, src, keep, [], price(rec.tensor, rec.shape, src, keep)))
                    src = keep
            by_fmt: dict[str, list[_Reader]] | None = None  # (made for the few tensors converted)
            for r in rec.readers:
                end = r.end
                f = end.fmt if end.var is None else (FIVE_HD if x[end.var] else "ND")
                if f != src:
                    if by_fmt is None:
                        by_fmt = {f: [r]}
                    else:
                        by_fmt.setdefault(f, []).append(r)
            if by_fmt is not None:
                for f, readers in by_fmt.items():
                    out.append(Conversion(rec.tensor, src, f, readers, price(rec.tensor, rec.shape, src, f)))
        return out

    def annotations_agree(self, x: list[int]) -> bool:
        """Whether no planned tensor carries a format annotation other than the one assignment
        ``x`` gives it (a tensor without one is left to GE, who gives it that format)."""
        get_format = A.get_format
        for rec in self.tensors:
            f = get_format(rec.tensor)
            if f is not None and f != rec.producer.resolve(x):
                return False
        return True

    def nodes_us(self, x: list[int]) -> float:
        return sum(self.energy.unary[v][b] for v, b in enumerate(x))

    # -- explanations --------------------------------------------------------------------

    def reason(self, conv: Conversion, x: list[int], mode: str) -> str:
        if not conv.readers:
            p = self.roles.get(id(conv.tensor.inputs[0])) if conv.tensor.inputs else None
            label = p.label if p is not None else "the op"
            return (f"greedy: {label} '{conv.tensor.inputs[0].name}' computed in {conv.src}, but its output keeps its "
                    f"first input's format {conv.dst} (seed 002)")
        r = conv.readers[0]
        more = f" (+{len(conv.readers) - 1} more reader{'s' if len(conv.readers) > 2 else ''})" if len(conv.readers) > 1 else ""
        return self._reader_reason(r, conv, x, mode) + more

    def _reader_reason(self, r: _Reader, conv: Conversion, x: list[int], mode: str) -> str:
        if r.kind == "output":
            return f"graph output '{conv.tensor.name}' leaves in its origin format (ND)"
        if r.kind == "body":
            return f"{r.node.op} '{r.node.name}' reads it inside a subgraph body (bodies keep their origin format)"
        node = r.node
        role = self.roles[id(node)]
        label = f"{role.label} '{node.name}'" if node.name else role.label
        if role.kind == "fixed":
            return f"{label} takes {conv.dst}"
        if role.kind == "nd":
            return role.why + (f" ('{node.name}')" if node.name and node.name not in role.why else "")
        v = self.var_of[id(node)]
        if mode == "greedy":
            return f"{label} follows its first input's format (greedy)"
        u0, u1 = self.energy.unary[v]
        if conv.dst == "ND" and u0 < u1:
            return self.oracle.choice_note(node) + f" ('{node.name}')"
        return f"{label} runs in {conv.dst} with its neighbours: cheaper overall (min-cut)"
