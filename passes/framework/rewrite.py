"""The pattern-rewrite API: a pattern in op names, a ``check`` that says why it refuses, and a
``rewrite`` that builds the replacement (the onnxscript rewriter's split; tinygrad's rule tables).

One convention, for the built-in fusions, the cleanup passes and users' rules alike::

    rule.match(anchor, scope) -> Match | None     the pattern (default: an op chain, below)
    rule.check(match, ctx)    -> MatchResult      success, or fail("the reason") for --explain
    rule.rewrite(match, ctx)  -> tensor(s)        the new value of each output of the anchor

``rewrite`` does not touch the graph (model-level additions it needs, such as a device op's
function body, aside). It returns, for the anchor's outputs in order, either an existing tensor
(``x * 1 -> x``: return ``x``) or a tensor built with ``match.op(...)`` / ``match.copy(...)``
(new nodes, recorded on the match; None keeps that output). The engine then

1. places the new nodes where the anchor was (``graph.nodes`` stays topologically sorted);
2. rewires: a new node writes the anchor's old output tensor itself (its name, type and shape
   stay, so nothing downstream changes); an existing tensor takes over the old one's readers, and
   when the old one is a graph output, the existing tensor's producer writes it instead (refused
   with the reason when it cannot: a graph input, another graph output, a constant, a tensor of
   an enclosing scope);
3. removes every matched node that nothing reads any more (a matched node that is still read
   elsewhere stays, so a rule may match through shared tensors when its pattern allows it);
4. records provenance (``graphpass.pass``, ``graphpass.fused_from``) on the new nodes.

A pattern is a producer -> consumer chain of op types matched backwards from its last op (the
anchor): ``pattern = ("Conv", "BatchNormalization")`` matches a BatchNormalization whose input
``follow[i]`` comes from a Conv of the same graph. A step may be a tuple of op types (any of
them). With ``exclusive = True`` (the default) every intermediate tensor is read only inside
the match and is not a graph output. Patterns that are small DAGs (GELU, LayerNorm) override
``match`` and use the scope's ``producer`` / ``single_reader`` helpers.

Rules compose: a :class:`RuleSet` holds rules and other rule sets (``a + b`` concatenates);
earlier rules win at an anchor. Applying a rule set walks each graph (and every If/Loop/Scan
body) once, in order (or consumers first with ``reverse=True``): each node is offered to the
rules anchored at its op, nodes created by an earlier rewrite can be matched as producers by
later anchors, and nothing is rescanned per match, so a pass is linear in the graph size.

Counts per rule (``matched`` / ``refused`` / ``rewritten``) go into the pass's stats under
``"rules"``; every refusal goes to ``ctx.explain`` so ``--explain`` says why a rule did not fire.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework.context import PassContext
from graphpass.passes.framework.pass_base import Pass, PassKind, PassResult, Promise
from graphpass.ir.graph import NameGen, iter_graphs, replace_uses, replace_uses_many, toposort

__all__ = ["MatchResult", "Match", "Scope", "Rule", "RuleSet", "RuleCounts", "RulePass", "rule", "rule_pass",
           "apply_rules", "single_reader"]


@dataclasses.dataclass(frozen=True)
class MatchResult:
    """The answer of a rewrite rule's ``check``: success, or a failure with the reason why."""

    ok: bool
    reason: str = ""

    @classmethod
    def success(cls) -> "MatchResult":
        # one shared instance (frozen: nothing can change it); a frozen dataclass's __init__
        # costs ~1 us, asked several times per match (check, its helpers, the engine's commit)
        if cls is MatchResult:
            return _SUCCESS
        return cls(True)

    @classmethod
    def fail(cls, reason: str) -> "MatchResult":
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok


_SUCCESS = MatchResult(True)


def single_reader(t: gs.Tensor, graph: gs.Graph) -> bool:
    """``t`` is read by exactly one node and is not an output of ``graph``."""
    return len(t.outputs) == 1 and not any(o is t for o in graph.outputs)


_STD_DOMAINS = (None, "", "ai.onnx")


def _std(node: gs.Node) -> bool:
    return node.domain in _STD_DOMAINS


class Scope:
    """One graph being walked: what a rule's ``match`` may ask about it."""

    def __init__(self, graph: gs.Graph, root: gs.Graph, names: NameGen):
        self.graph = graph
        self.root = root
        self.names = names
        self._local: set[int] | None = None
        self.outputs: set[int] = {id(t) for t in graph.outputs}
        self.inputs: set[int] = {id(t) for t in graph.inputs}

    @property
    def local(self) -> set[int]:
        """The ids of this graph's nodes (and of the nodes rewrites placed in it so far), made
        when first asked: a walk whose rules look at no producer (Identity, x * 1: one op) and
        places nothing never needs it (~10k ids at 10k nodes, per walk). The graph's node list
        stays as it was until the walk ends, and a rewrite that places nodes asks it first."""
        if self._local is None:
            self._local = set(map(id, self.graph.nodes))
        return self._local

    def producer(self, t: gs.Tensor, *ops: str) -> gs.Node | None:
        """The default-domain node of this graph that writes ``t`` (if it is one of ``ops``, when given)."""
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if p is not None and id(p) in self.local and _std(p) and (not ops or p.op in ops):
            return p
        return None

    def single_reader(self, t: gs.Tensor) -> bool:
        """``t`` is read by exactly one node and is not an output of this graph."""
        return len(t.outputs) == 1 and id(t) not in self.outputs

    def is_output(self, t: gs.Tensor) -> bool:
        return id(t) in self.outputs

    def match(self, nodes: Sequence[gs.Node]) -> "Match":
        """A match of ``nodes`` (anchor last) in this scope."""
        return Match(list(nodes), self.graph, self.names, self.root, graph_outputs=self.outputs)


@dataclasses.dataclass
class Match:
    """The matched nodes (producer first, anchor last) in ``graph``; ``root`` is the model's top
    graph (where model-level things such as local functions go). ``check`` may store what it
    computed on the match (``m.sizes = ...``) for ``rewrite`` to use."""

    nodes: list[gs.Node]
    graph: gs.Graph
    names: NameGen
    root: gs.Graph | None = None
    created: list[gs.Node] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    graph_outputs: set[int] | None = dataclasses.field(default=None, repr=False)
    #: id -> what ``copy(..., reuse=True)`` / ``op(..., reuse=node)`` asked of a matched node the engine
    #: edits in place instead of building a new one (None: none)
    reused: dict[int, "_InPlace"] | None = dataclasses.field(default=None, repr=False)

    @property
    def anchor(self) -> gs.Node:
        return self.nodes[-1]

    def writes_graph_output(self) -> bool:
        """Whether an output of the anchor is an output of the graph."""
        if self.graph_outputs is None:
            self.graph_outputs = {id(t) for t in self.graph.outputs}
        return any(id(t) in self.graph_outputs for t in self.anchor.outputs)

    def op(self, op_type: str, inputs: Sequence[gs.Tensor], attrs: dict[str, Any] | None = None, *,
           domain: str | None = None, name: str | None = None, outputs: int | Sequence[bool] = 1,
           dtype: Any = None, shape: Any = None, reuse: gs.Node | None = None) -> gs.Variable | list[gs.Variable]:
        """A new node ``op_type(inputs)``; returns its output tensor (a list when ``outputs > 1``;
        ``outputs`` may also say per output whether it exists, an absent optional output being
        the empty tensor). The node enters the graph only if the rewrite is applied.

        ``reuse=node``: the new node may be ``node`` edited in place (its op, domain, name,
        attributes and inputs set, its annotations dropped), as :meth:`copy` ``reuse=True`` says,
        for a node of one output, ``dtype`` and ``shape`` not given and a ``name`` given."""
        if (reuse is not None and name is not None and dtype is None and shape is None and outputs == 1
                and self._reusable(reuse)):
            label = name or f"{self.anchor.name or op_type.lower()}_{op_type.lower()}"
            self.names(f"{label}_out")  # (the one name the new node would ask: later names stay the same)
            return self._reuse(reuse, list(inputs), dict(attrs or {}), (op_type, domain, name))
        label = name or f"{self.anchor.name or op_type.lower()}_{op_type.lower()}"
        present = [True] * outputs if isinstance(outputs, int) else list(outputs)
        outs = [gs.Variable(self.names(f"{label}_out"), dtype=dtype, shape=shape) if keep else gs.Variable.empty()
                for keep in present]
        node = gs.Node(op_type, name=name if name is not None else self.names(label), domain=domain,
                       inputs=list(inputs), outputs=outs, attrs=dict(attrs or {}))
        self.created.append(node)
        return outs[0] if len(outs) == 1 else outs

    def copy(self, node: gs.Node, inputs: Sequence[gs.Tensor] | None = None,
             attrs: dict[str, Any] | None = None, *, reuse: bool = False) -> gs.Variable:
        """A new node like ``node`` (op, domain, name, attributes, annotations, which optional
        outputs exist) with other ``inputs`` and ``attrs`` updated; returns its first output.

        ``reuse=True``: when ``node`` is a matched node (not the anchor) with one output read by
        nothing but the anchor, whose one output the returned tensor is to replace (``return
        m.copy(conv, ..., reuse=True)``), the engine edits ``node`` itself when the rewrite is
        applied (its inputs and attributes; it then writes the anchor's output and takes the
        copy's place in the node list) instead of building a copy and dropping ``node``: the same
        graph, counts, annotations and later names, with two objects and several undo records
        fewer. Otherwise (another node, the copy's output used elsewhere) a copy as without it;
        a rewrite that then uses the output otherwise than as the anchor's one value is a rule bug
        (TypeError when it is applied)."""
        from graphpass.ir import annotations as A

        if reuse and self._reusable(node):
            # the one name the copy would ask (its output's; the copy keeps the node's own name):
            # the walk's later names stay the same
            label = node.name or f"{self.anchor.name or node.op.lower()}_{node.op.lower()}"
            self.names(f"{label}_out")
            return self._reuse(node, list(node.inputs) if inputs is None else list(inputs),
                               {**node.attrs, **(attrs or {})}, None)
        outs = self.op(node.op, list(node.inputs) if inputs is None else inputs, {**node.attrs, **(attrs or {})},
                       domain=node.domain, name=node.name, outputs=[bool(t.name) for t in node.outputs] or 1)
        old = A.stored_meta(node)  # a read of ``node`` (A.meta would save it in an undo log and give it a dict)
        if old:
            A.meta(self.created[-1]).update(old)
        return outs if isinstance(outs, gs.Tensor) else outs[0]

    def _reuse(self, node: gs.Node, inputs: list[gs.Tensor], attrs: dict[str, Any],
               fields: tuple[str, str | None, str] | None) -> gs.Variable:
        if self.reused is None:
            self.reused = {}
        self.reused[id(node)] = _InPlace(node, inputs, attrs, fields)
        self.created.append(node)  # placed where the new node would be, marked as it would be
        return node.outputs[0]

    def _reusable(self, node: gs.Node) -> bool:
        """Whether ``copy(node, reuse=True)`` may edit ``node`` (see :meth:`copy`): a matched node
        other than the anchor, of gs's own class, one named output that only the anchor reads
        (not a graph output), and an anchor of one output (it dies once that one is given up,
        and ``node`` with it, as the copy's original would)."""
        anchor = self.anchor
        if node is anchor or type(node) is not gs.Node or len(node.outputs) != 1 or len(anchor.outputs) != 1:
            return False
        if not any(n is node for n in self.nodes) or (self.reused is not None and id(node) in self.reused):
            return False
        t = node.outputs[0]
        if not t.name or not all(r is anchor for r in t.outputs):
            return False
        if self.graph_outputs is None:
            self.graph_outputs = {id(o) for o in self.graph.outputs}
        return id(t) not in self.graph_outputs

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the pass stat ``key`` (kept only if the rewrite is applied)."""
        self.counts[key] = self.counts.get(key, 0) + n


class _InPlace:
    """What a rewrite asked of a matched node the engine edits in place (:meth:`Match.copy` /
    :meth:`Match.op` ``reuse``): its new inputs and attributes dict, and for ``op`` its new
    (op, domain, name); ``was``: the node's name and annotations before (for its provenance)."""

    __slots__ = ("node", "inputs", "attrs", "fields", "was")

    def __init__(self, node: gs.Node, inputs: list[gs.Tensor], attrs: dict[str, Any],
                 fields: tuple[str, str | None, str] | None):
        self.node, self.inputs, self.attrs, self.fields, self.was = node, inputs, attrs, fields, None

    def apply(self, old: gs.Tensor) -> None:
        """The new node's work done on the original: it reads the new inputs (leaves its old ones'
        readers and joins the new ones' at their end, as a new node reading them and the original
        dropped would), gets the new attributes dict (and op, domain, name, and no annotations,
        for ``op``) and writes ``old`` (its own output left unwritten, as the dropped original's
        was); the new node's own output would have had no dtype, shape or reader to hand on."""
        node = self.node
        ins = node.inputs
        ins.clear()  # (an undo log saves the node here)
        ins.extend(self.inputs)
        if self.fields is not None:
            d = node.__dict__
            self.was = _Was(node.name, d.get(_META_KEY))
            node.op, node.domain, node.name = self.fields
            if _META_KEY in d:
                del d[_META_KEY]  # (saved with the node; the new node had none before it is marked)
        node.attrs = self.attrs
        node.outputs[0] = old


class _Was:
    """A reused node as it was, for :func:`graphpass.ir.annotations.mark_created`'s ``replaced``
    (its name, and its annotations where ``annotations.get`` reads them)."""

    def __init__(self, name: str, meta: dict | None):
        self.name = name
        if meta is not None:
            self.__dict__[_META_KEY] = meta


_META_KEY = "_gp_meta"  # graphpass.ir.annotations' key in a node's __dict__


class Rule:
    """A rewrite rule. Subclass and set ``pattern`` (or override ``match``); override ``check``
    (default: always) and ``rewrite`` (see the module docstring for the convention).

    ``follow[i]`` is which input of ``pattern[i+1]`` leads to ``pattern[i]`` (default 0;
    ``None`` means any input, for commutative ops such as Add). ``exclusive``: every
    intermediate tensor must be read only inside the match.
    """

    pattern: tuple[str | tuple[str, ...], ...] = ()
    follow: tuple[int | None, ...] | None = None
    exclusive: bool = True
    name: str | None = None

    @property
    def label(self) -> str:
        """The rule's name in stats (``name``, else the class name in snake_case)."""
        if self.name:
            return self.name
        return re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__.lstrip("_")).lower()

    def anchors(self) -> frozenset[str] | None:
        """The op types a match can end in (None: any op)."""
        if not self.pattern:
            return None
        last = self.pattern[-1]
        return frozenset((last,) if isinstance(last, str) else last)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        """The chain ``pattern`` ending in ``anchor``, or None."""
        pattern = self.pattern
        if not pattern or anchor.domain not in _STD_DOMAINS:  # (_std and _is spelled out: ~15k calls per CNN run)
            return None
        last = pattern[-1]
        if anchor.op != last if isinstance(last, str) else anchor.op not in last:
            return None
        if len(pattern) == 1:
            return scope.match((anchor,))
        chain = [anchor]
        node = anchor
        follow = self.follow or (0,) * (len(pattern) - 1)
        local = scope._local
        if local is None:
            local = scope.local
        outputs, exclusive = scope.outputs, self.exclusive
        for step in range(len(pattern) - 2, -1, -1):
            idx = follow[step]
            want = pattern[step]
            inputs = node.inputs
            found = None
            for i in (range(len(inputs)) if idx is None else (idx,)):
                if i >= len(inputs):
                    continue
                t = inputs[i]
                # scope.producer(t) and scope.single_reader(t), spelled out (a call each per step)
                writers = t.inputs
                p = writers[0] if len(writers) == 1 else None
                if (p is not None and id(p) in local and p.domain in _STD_DOMAINS
                        and (p.op == want if isinstance(want, str) else p.op in want)
                        and (not exclusive or (len(t.outputs) == 1 and id(t) not in outputs))):
                    found = p
                    break
            if found is None:
                return None
            chain.append(found)
            node = found
        return scope.match(reversed(chain))

    def check(self, m: Match, ctx: PassContext) -> MatchResult:
        return MatchResult.success()

    def rewrite(self, m: Match, ctx: PassContext) -> gs.Tensor | Sequence[gs.Tensor | None]:
        """The new value of the anchor's output (or one per output; None keeps that output)."""
        raise NotImplementedError


def _is(node: gs.Node, step: str | tuple[str, ...]) -> bool:
    return node.op == step if isinstance(step, str) else node.op in step


class _FunctionRule(Rule):
    def __init__(self, pattern, rewrite, check, name, follow, exclusive):
        self.pattern = tuple(pattern)
        self.follow = follow
        self.exclusive = exclusive
        self.name = name
        self._rewrite = rewrite
        self._check = check

    def check(self, m: Match, ctx: PassContext) -> MatchResult:
        verdict = None if self._check is None else self._check(m)
        if verdict is None or verdict is True:
            return MatchResult.success()
        if isinstance(verdict, str):
            return MatchResult.fail(verdict)
        if isinstance(verdict, MatchResult):
            return verdict
        raise TypeError(f"the check of rule '{self.label}' returned {verdict!r}: return None to accept, "
                        "or a reason string / MatchResult.fail(reason) to refuse")

    def rewrite(self, m: Match, ctx: PassContext):
        return self._rewrite(m)


def rule(pattern: Sequence[str | tuple[str, ...]], rewrite: Callable[[Match], Any], *,
         check: Callable[[Match], MatchResult | str | None] | None = None, name: str | None = None,
         follow: tuple[int | None, ...] | None = None, exclusive: bool = True) -> Rule:
    """A rule from functions: ``rule(("Relu", "Relu"), lambda m: m.nodes[-1].outputs[0] ...)``.
    ``check(m)`` returns a MatchResult, or a reason string to refuse, or None to accept."""
    return _FunctionRule(pattern, rewrite, check, name or "_".join(
        s if isinstance(s, str) else "|".join(s) for s in pattern).lower(), follow, exclusive)


class RuleSet:
    """An ordered collection of rules and rule sets (flattened); ``a + b`` concatenates."""

    def __init__(self, *rules: "Rule | RuleSet | Iterable[Rule | RuleSet]"):
        self.rules: list[Rule] = []
        for r in rules:
            self._add(r)

    def _add(self, r) -> None:
        if isinstance(r, Rule):
            self.rules.append(r)
        elif isinstance(r, RuleSet):
            self.rules.extend(r.rules)
        elif isinstance(r, Iterable):
            for x in r:
                self._add(x)
        else:
            raise TypeError(f"not a rule or rule set: {r!r}")

    def __add__(self, other: "Rule | RuleSet | Iterable") -> "RuleSet":
        return RuleSet(self, other)

    def __radd__(self, other) -> "RuleSet":
        return RuleSet(other, self)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def apply(self, graph: gs.Graph, ctx: PassContext, pass_name: str, *, reverse: bool = False) -> "RuleCounts":
        return apply_rules(graph, self, ctx, pass_name, reverse=reverse)


class RuleCounts(dict):
    """Per-rule counts: ``{rule: {"matched": m, "refused": r, "rewritten": w}}``, plus the
    nodes each rule ``removed`` and ``created`` and the stats its matches counted. Prints short."""

    def entry(self, name: str) -> dict[str, int]:
        return self.setdefault(name, {"matched": 0, "refused": 0, "rewritten": 0, "removed": 0, "created": 0})

    def total(self, key: str) -> int:
        return sum(e.get(key, 0) for e in self.values())

    def __repr__(self) -> str:
        parts = [f"{k} {v['rewritten']}/{v['matched']}" + (f" ({v['refused']} refused)" if v["refused"] else "")
                 for k, v in self.items() if v["matched"]]
        return ", ".join(parts) or "none matched"

    __str__ = __repr__


def apply_rules(graph: gs.Graph, rules: RuleSet | Sequence[Rule], ctx: PassContext, pass_name: str, *,
                reverse: bool = False) -> RuleCounts:
    """Apply ``rules`` over ``graph`` and every nested graph in one walk each (see the module docstring)."""
    from graphpass.ir import annotations as A

    rules = rules if isinstance(rules, RuleSet) else RuleSet(rules)
    counts = RuleCounts()
    entries: dict[int, dict[str, int]] = {}  # id(rule) -> its counts (a label is a regex of the class name)
    for r in rules:
        entries[id(r)] = counts.entry(r.label)
    by_op: dict[str, list[Rule]] = {}
    anywhere: list[Rule] = []
    for r in rules:
        ops = r.anchors()
        if ops is None:
            anywhere.append(r)
        else:
            for op in ops:
                by_op.setdefault(op, []).append(r)
    order_of = {id(r): i for i, r in enumerate(rules)}
    names = LazyNameGen(graph)
    for g in list(iter_graphs(graph)):
        order = list(g.nodes)
        # the nodes offered to a rule: those of an anchor op (rewrites never change an existing
        # node's op), found in one pass over the list; a graph with none is not walked further
        offered = order if anywhere else [n for n in order if n.op in by_op]
        if not offered:
            continue
        scope = Scope(g, graph, names)
        pos: dict[int, int] | None = None  # id(node) -> index in order, built at the first rewrite
        dead: set[int] = set()
        moved: set[int] = set()  # nodes a rewrite edited in place (copy(reuse=True)): placed at its anchor now
        placed: dict[int, list[gs.Node]] = {}
        unsorted = False
        try:
            for node in (reversed(offered) if reverse else offered):
                if id(node) in dead or (moved and id(node) in moved):  # (a copy is not offered either)
                    continue
                candidates = by_op.get(node.op, [])
                if anywhere:
                    candidates = sorted(candidates + anywhere, key=lambda r: order_of[id(r)])
                for r in candidates:
                    m = r.match(node, scope)
                    if m is None or (dead and not dead.isdisjoint(map(id, m.nodes))):
                        continue
                    m.root = graph
                    entry = entries[id(r)]
                    entry["matched"] += 1
                    verdict = r.check(m, ctx)
                    if verdict:
                        try:
                            verdict = _commit(m, r.rewrite(m, ctx), scope, dead)
                        except BaseException:
                            _discard(m)  # a rule's bug: its half-built nodes must not stay readers
                            raise
                    if not verdict:
                        entry["refused"] += 1
                        ctx.explain(pass_name, m.anchor, verdict.reason)
                        continue
                    entry["rewritten"] += 1
                    entry["removed"] += sum([id(n) in dead for n in m.nodes])
                    if m.reused:  # (each counted as the copy's original would be: removed, and created)
                        entry["removed"] += len(m.reused)
                        moved.update(m.reused)
                    if m.counts:
                        for k, v in m.counts.items():
                            entry[k] = entry.get(k, 0) + v
                    if m.created:  # (a rewrite that only rewires, x * 1 -> x, places nothing)
                        entry["created"] += len(m.created)
                        placed.setdefault(id(m.anchor), []).extend(m.created)
                        if not unsorted:
                            if pos is None:
                                pos = {id(n): i for i, n in enumerate(order)}
                            unsorted = _reads_later(m, pos)
                        replaced = m.nodes
                        if m.reused:  # (an op edited in place: its provenance as it was)
                            was = {k: e.was for k, e in m.reused.items() if e.was is not None}
                            if was:
                                replaced = [was.get(id(n), n) for n in replaced]
                        for n in m.created:
                            A.mark_created(n, pass_name, replaced=replaced)
                    break
        finally:  # also when a rule raises: the graph keeps what was rewritten so far, consistently
            if placed:
                nodes = []
                for n in order:
                    new = placed.get(id(n))
                    if new is not None:
                        nodes.extend(c for c in new if id(c) not in dead)  # a new node may die too
                    if id(n) not in dead and not (moved and id(n) in moved):
                        nodes.append(n)
                g.nodes = nodes
                if unsorted:  # a rewrite read a tensor written after its anchor: re-sort this graph
                    toposort(g, recurse=False)
            elif dead:
                g.nodes = [n for n in order if id(n) not in dead]
    return counts


def _reads_later(m: Match, pos: dict[int, int]) -> bool:
    """Whether a new node reads a tensor written at or after its anchor's position (where the
    new nodes go); records the new nodes' position for later matches."""
    at = pos[id(m.anchor)]
    new = {id(n) for n in m.created}
    later = False
    for n in m.created:
        for t in n.inputs:
            p = t.inputs[0] if len(t.inputs) == 1 else None
            if p is not None and id(p) not in new and pos.get(id(p), -1) >= at:
                later = True
        pos[id(n)] = at
    return later


class LazyNameGen:
    """A :class:`NameGen` built on the first name asked for (most walks create nothing, and
    building one reads every tensor name of the model). The same names as a NameGen built when
    the pass starts, for a pass that makes every new name with it."""

    def __init__(self, graph: gs.Graph):
        self._graph = graph
        self._gen: NameGen | None = None

    def __call__(self, prefix: str) -> str:
        if self._gen is None:
            self._gen = NameGen(self._graph)
        return self._gen(prefix)


def _movable(new: gs.Tensor, scope: Scope, created: set[int]) -> bool:
    """Whether ``new``'s producer may write a graph output in its place (``new`` is an intermediate of this graph)."""
    return (not isinstance(new, gs.Constant) and id(new) not in scope.inputs and id(new) not in scope.outputs
            and len(new.inputs) == 1 and (id(new.inputs[0]) in scope.local or id(new.inputs[0]) in created))


def _commit(m: Match, result, scope: Scope, dead: set[int]) -> MatchResult:
    """Apply a rewrite's result (see the module docstring); refuse, leaving the graph as it was,
    when a graph output cannot be rewired."""
    anchor = m.anchor
    if isinstance(result, gs.Tensor) and len(anchor.outputs) == 1 and anchor.outputs[0] is not result:
        return _commit_one(m, result, scope, dead)
    news = [result] if isinstance(result, gs.Tensor) else list(result)
    if len(news) > len(anchor.outputs):
        raise TypeError(f"rewrite returned {len(news)} values for {len(anchor.outputs)} outputs of {anchor.op}")
    created = {id(n) for n in m.created}
    pairs = [(old, new) for old, new in zip(anchor.outputs, news) if new is not None and new is not old]
    if not any(old.outputs or scope.is_output(old) for old, _ in pairs) and not any(
            id(n) not in dead and all(not t.outputs and not scope.is_output(t) for t in n.outputs) for n in m.nodes):
        # nothing reads what it replaces and no matched node dies: counting it as fired would
        # claim a change that is not there (and keep the fixed-point loop going)
        _discard(m)
        return MatchResult.fail("the rewrite changes nothing (it replaces no output that is read)")
    for old, new in pairs:
        made = len(new.inputs) == 1 and id(new.inputs[0]) in created
        if not made and scope.is_output(old) and not _movable(new, scope, created):
            _discard(m)
            return MatchResult.fail(f"'{old.name}' is a graph output and '{new.name}' cannot take its name")
    # the writer of ``new`` writes ``old`` itself (old's name, type and shape stay) when it is a
    # new node or ``old`` is a graph output; else old's readers read ``new``
    writers = [new.inputs[0] if len(new.inputs) == 1 else None for _, new in pairs]
    takes = [w is not None and (id(w) in created or scope.is_output(old)) for w, (old, _) in zip(writers, pairs)]
    # each pair's writer and choice decided before any moves: the same as pair by pair when no
    # tensor is in two pairs (else one pair's rewiring changes the next one's writer: the same
    # new tensor for two outputs, an output swapped with another; decided pair by pair below)
    apart = len(pairs) == 1 or len({id(t) for pair in pairs for t in pair}) == 2 * len(pairs)  # (one: old is not new)
    # every output of the anchor gets another writer: the anchor dies, and gives them all up at
    # once (no fresh tensor to write in their place, as _detach gives a node that stays)
    cleared = apart and len(pairs) == len(anchor.outputs) and all(takes)
    reused = m.reused
    if reused:
        # copy(reuse=True): the edited node's output must be the anchor's one new value, read by
        # nothing but the anchor (then the node is dropped where its copy would be)
        for e in reused.values():
            node = e.node
            t = node.outputs[0]
            if not (cleared and len(pairs) == 1 and pairs[0][1] is t and all(r is anchor for r in t.outputs)):
                _discard(m)
                raise TypeError(f"a rewrite used the output of '{node.name}', reused in place, otherwise "
                                "than as the anchor's one new value")
    if not apart and any(id(new) in {id(o) for o, _ in pairs} for _, new in pairs):
        # an output replaced by another output that is itself replaced (two outputs swapped): the
        # readers move all at once, each to what it read before the rewrite asked for (pair by
        # pair, the second pair moved back the readers the first had just moved: Sub(a, b) became
        # Sub(a, a)); a tensor that would change writer in such a cycle is refused
        if any(takes):
            _discard(m)
            return MatchResult.fail("the rewrite swaps outputs of which one is a graph output or gets a new writer")
        replace_uses_many(pairs)
        pairs = []
    if cleared:
        # the names _detach would have taken, asked first as it asked them (a lazy NameGen is
        # built before anything moves): the walk's later names stay the same
        for old, _ in pairs:
            scope.names(f"{old.name or 'dead'}_old")
        anchor.outputs.clear()
    for (old, new), writer, take in zip(pairs, writers, takes):
        if not apart:
            writer = new.inputs[0] if len(new.inputs) == 1 else None
            take = writer is not None and (id(writer) in created or scope.is_output(old))
        if take:
            if reused and id(writer) in reused:
                reused[id(writer)].apply(old)
                continue
            if not cleared:
                _detach(old, scope)
            if old.dtype is None:
                old.dtype = new.dtype
            if new.shape is not None and not _static(old.shape) and _static(new.shape):
                old.shape = new.shape  # the rewrite knows the shape: keep the more precise one
            if new.outputs:  # (a new node's output is mostly read by nothing yet)
                replace_uses(new, old)
            writer.outputs[writer.outputs.index(new)] = old
        else:
            replace_uses(old, new)
    _sweep(m, scope, dead)
    return MatchResult.success()


def _commit_one(m: Match, new: gs.Tensor, scope: Scope, dead: set[int]) -> MatchResult:
    """:func:`_commit` of the common case, an anchor of one output given one other tensor: the
    same steps and edits in the same order, without the lists of pairs (one rewrite in ~4 of a
    CNN's passes: fold_batchnorm, fuse_conv_activation, eliminate_identity, merge_transposes)."""
    anchor = m.anchor
    old = anchor.outputs[0]
    outputs = scope.outputs
    is_out = id(old) in outputs
    if not old.outputs and not is_out and not any(
            id(n) not in dead and all(not t.outputs and id(t) not in outputs for t in n.outputs) for n in m.nodes):
        _discard(m)
        return MatchResult.fail("the rewrite changes nothing (it replaces no output that is read)")
    writers = new.inputs
    writer = writers[0] if len(writers) == 1 else None
    made = False
    if writer is not None:
        for n in m.created:
            if n is writer:
                made = True
                break
    if not made and is_out and not _movable(new, scope, {id(n) for n in m.created}):
        _discard(m)
        return MatchResult.fail(f"'{old.name}' is a graph output and '{new.name}' cannot take its name")
    take = made or (writer is not None and is_out)  # (and the anchor gives its one output up: cleared)
    reused = m.reused
    if reused:
        for e in reused.values():
            node = e.node
            t = node.outputs[0]
            if not (take and new is t and all(r is anchor for r in t.outputs)):
                _discard(m)
                raise TypeError(f"a rewrite used the output of '{node.name}', reused in place, otherwise "
                                "than as the anchor's one new value")
    if take:
        scope.names(f"{old.name or 'dead'}_old")
        anchor.outputs.clear()
        if reused and id(writer) in reused:
            reused[id(writer)].apply(old)
        else:
            if old.dtype is None:
                old.dtype = new.dtype
            if new.shape is not None and not _static(old.shape) and _static(new.shape):
                old.shape = new.shape
            if new.outputs:
                replace_uses(new, old)
            writer.outputs[writer.outputs.index(new)] = old
    else:
        replace_uses(old, new)
    _sweep(m, scope, dead)
    return MatchResult.success()


def _sweep(m: Match, scope: Scope, dead: set[int]) -> None:
    """The new nodes join the scope; the matched nodes nothing reads any more die (but the ones
    ``copy(reuse=True)`` edited, which live on in their copy's place)."""
    if m.created:
        local = scope.local
        for n in m.created:
            local.add(id(n))
    # consumers first (the anchor is last): a chain dies in one sweep, and a second finds nothing
    # more (none is needed once all died); the nodes that die are the same in any order (a node
    # dies once nothing reads it)
    outputs = scope.outputs
    reused = m.reused
    alive = [n for n in m.nodes if id(n) not in dead and not (reused and id(n) in reused)]
    changed = True
    while changed and alive:
        changed = False
        for n in reversed(alive):
            if id(n) not in dead and all(not t.outputs and id(t) not in outputs for t in n.outputs):
                n.inputs.clear()  # (an undo log saves the node here, whatever its lists hold)
                if n.outputs:  # (none left when the anchor gave them all up)
                    n.outputs.clear()
                dead.add(id(n))
                changed = True
        if changed and len(alive) > 1:
            alive = [n for n in alive if id(n) not in dead]
        else:
            break  # (one node: it died, or nothing changed)


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _discard(m: Match) -> None:
    """Disconnect the nodes a rewrite built (gs registers a new node as a reader of its inputs);
    a node ``copy(reuse=True)`` would edit is left as it is (nothing was done to it yet)."""
    reused = m.reused or ()
    for n in m.created:
        if id(n) in reused:
            continue
        n.inputs.clear()
        n.outputs.clear()
    m.created.clear()
    m.reused = None


def _detach(t: gs.Tensor, scope: Scope) -> None:
    """Give ``t``'s producer a fresh tensor in its place, so ``t`` can get another writer."""
    for p in list(t.inputs):
        p.outputs[p.outputs.index(t)] = gs.Variable(scope.names(f"{t.name or 'dead'}_old"), dtype=t.dtype, shape=t.shape)


class RulePass(Pass):
    """A pass that applies a rule set (``rules``) in one walk per graph, explaining every refusal.

    ``reverse = True`` walks consumers first (the largest match wins over a smaller one inside
    it). Stats: ``fired`` (rewrites), ``refused`` and ``rules`` (per-rule counts); a pass may
    override :meth:`summarize` to name its own stats from the counts.
    """

    rules: ClassVar[RuleSet | Sequence[Rule]] = ()
    reverse: ClassVar[bool] = False
    preserves_order = True  # new nodes take the anchor's place

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        counts = apply_rules(graph, self.rule_set(ctx), ctx, self.name, reverse=self.reverse)
        return PassResult(counts.total("rewritten") > 0, self.summarize(counts))

    def can_act(self, ops: frozenset[str], ctx: PassContext) -> bool:
        """Whether a rule can anchor at one of ``ops`` (apply_rules tries a rule only on nodes
        of its anchors: with none in the graph, the walk would match nothing). A subclass with
        its own ``run`` may apply other rules than ``rules``: only its ``anchor_ops`` count."""
        if type(self).run is not RulePass.run:
            return super().can_act(ops, ctx)
        for r in self.rule_set(ctx):
            anchors = r.anchors()
            if anchors is None or not anchors.isdisjoint(ops):
                return True
        return False

    def rule_set(self, ctx: PassContext) -> RuleSet | Sequence[Rule]:
        """The rules of this application (a pass may choose them from its options)."""
        return self.rules

    def summarize(self, counts: RuleCounts) -> dict[str, Any]:
        return {"fired": counts.total("rewritten"), "refused": counts.total("refused"), "rules": counts}


def rule_pass(name: str, rules: RuleSet | Rule | Sequence[Rule], *, summary: str | None = None,
              kind: PassKind = PassKind.FUSION, promise: Promise | None = None, reverse: bool = False,
              register: bool = False, **attrs: Any) -> type[RulePass]:
    """A :class:`RulePass` subclass named ``name`` applying ``rules``; ``register=True`` adds it to
    the pass registry (so ``optimize(passes=[name])`` and the CLI find it). ``promise`` defaults
    to exact: declare a tolerance if a rule can change a value by rounding."""
    from graphpass.passes.framework.pass_base import EXACT
    from graphpass.passes.framework.registry import register as _register

    rules = RuleSet(rules)
    cls = type(_camel(name), (RulePass,), {
        "name": name, "summary": summary or f"rewrite rules: {', '.join(r.label for r in rules)}", "kind": kind,
        "promise": promise or EXACT, "rules": rules, "reverse": reverse, "__doc__": summary or None,
        "__module__": attrs.pop("module", __name__), **attrs})
    return _register(cls) if register else cls


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_")) or "RulePass"

