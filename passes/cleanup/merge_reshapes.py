"""Reshape-chain merging.

    {Reshape, Flatten, Squeeze, Unsqueeze}(x) -> Reshape(s)   =>  Reshape(x, s)
        when s is a constant with no 0 entry (or allowzero=1), or its 0 entries can be resolved
        from the static shape of the intermediate tensor
    Reshape(x, s) with static output shape == static input shape  =>  removed
    Reshape(f(Reshape(x, t1)), t2) with f elementwise (scalar constants only) and t2 giving x's
        own shape  =>  f(x)     (the flatten/unflatten exporters write around an MLP's GELU)
    Unsqueeze(Unsqueeze(x, a1), a2)  =>  Unsqueeze(x, a)    (a: a1's dims mapped past a2's, and a2;
        on any shape, symbolic dims included; negative axes need x's rank)

A reshape only rearranges the shape, not the data order, so the last one alone decides the result.
The intermediate op stays if something else reads its output.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RuleCounts, RulePass, Scope
from graphpass.ir.shapes import static_shape

__all__ = ["MergeReshapes"]

_SHAPE_ONLY = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


class _Chain(Rule):
    """Cases 1 and 2: a Reshape after one or more shape-only ops reads the chain's input (the
    ops it hops over stay if read elsewhere); then case 3 if the result changes no shape."""

    pattern = (_SHAPE_ONLY, "Reshape")
    exclusive = False

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if anchor.op != "Reshape" or len(anchor.inputs) < 2 or not isinstance(anchor.inputs[1], gs.Constant):
            return None
        target = [int(v) for v in np.asarray(anchor.inputs[1].values).ravel()]
        allowzero = int(anchor.attrs.get("allowzero", 0))
        hops, resolved, data = [], False, anchor.inputs[0]
        while True:  # hop over the whole chain of shape-only producers
            first = scope.producer(data, *_SHAPE_ONLY)
            if first is None or not first.inputs:
                break
            if not allowzero and 0 in target:
                mid = static_shape(data)
                if mid is None or len(mid) < len(target):
                    break
                target = [mid[i] if v == 0 else v for i, v in enumerate(target)]
                resolved = True
            hops.append(first)
            data = first.inputs[0]
        if not hops:
            return None
        m = scope.match(hops[::-1] + [anchor])
        m.source, m.target, m.resolved = data, target, resolved
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        node = m.anchor
        m.count("merged", len(m.nodes) - 1)
        a, b = static_shape(m.source), static_shape(node.outputs[0])
        if a is not None and a == b and not m.writes_graph_output():
            m.count("noop_removed")
            return m.source
        shape = node.inputs[1]
        if m.resolved:
            shape = gs.Constant(m.names(shape.name or "shape"), np.array(m.target, dtype=np.int64))
        return m.copy(node, inputs=[m.source, shape])


def _unsqueeze_axes(node: gs.Node) -> list[int] | None:
    """The constant axes of an Unsqueeze (input from opset 13, attribute before), or None."""
    if len(node.inputs) > 1:
        axes = node.inputs[1]
        return [int(v) for v in np.asarray(axes.values).ravel()] if isinstance(axes, gs.Constant) else None
    axes = node.attrs.get("axes")
    return None if axes is None else [int(v) for v in axes]


def compose_unsqueezes(a1: list[int], a2: list[int], rank: int | None) -> list[int] | None:
    """The axes of one Unsqueeze doing Unsqueeze(a1) then Unsqueeze(a2) on a tensor of ``rank``
    (None: unknown, then only non-negative axes are resolved). None where not resolvable or not
    valid (a repeated or out-of-range axis: the model would fail; it is left to fail as it was)."""
    r1 = None if rank is None else rank + len(a1)
    r2 = None if r1 is None else r1 + len(a2)
    if any(a < 0 for a in a1 + a2) and rank is None:
        return None
    a1 = [a % r1 if a < 0 else a for a in a1] if r1 is not None else a1
    a2 = [a % r2 if a < 0 else a for a in a2] if r2 is not None else a2
    if len(set(a1)) != len(a1) or len(set(a2)) != len(a2):
        return None
    if (r1 is not None and any(a >= r1 for a in a1)) or (r2 is not None and any(a >= r2 for a in a2)):
        return None
    taken, kept = set(a2), []  # kept[p]: where the intermediate's dim p lands in the result
    k = 0
    while len(kept) <= max(a1, default=-1):
        if k not in taken:
            kept.append(k)
        k += 1
    return sorted(taken | {kept[p] for p in a1})


class _Unsqueezes(Rule):
    """Case 4: two Unsqueezes in a row become one (the first stays if read elsewhere)."""

    pattern = ("Unsqueeze", "Unsqueeze")
    exclusive = False

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None:
            return None
        inner, outer = m.nodes
        a1, a2 = _unsqueeze_axes(inner), _unsqueeze_axes(outer)
        if a1 is None or a2 is None or (len(inner.inputs) > 1) != (len(outer.inputs) > 1) or not inner.inputs:
            return None
        x = inner.inputs[0]
        m.axes = compose_unsqueezes(a1, a2, None if x.shape is None else len(x.shape))
        return m if m.axes is not None else None

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        inner, outer = m.nodes
        m.count("merged")
        x = inner.inputs[0]
        if len(outer.inputs) > 1:  # opset 13+: axes as an input
            axes = gs.Constant(m.names(outer.inputs[1].name or "axes"), np.array(m.axes, dtype=np.int64))
            return m.copy(outer, inputs=[x, axes])
        return m.copy(outer, inputs=[x], attrs={**outer.attrs, "axes": m.axes})


#: Ops that compute each output element from the same element of each input (with scalar constants):
#: a reshape before them and its inverse after them commute with them, bit for bit.
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid",
    "HardSigmoid", "Tanh", "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Floor", "Ceil",
    "Softplus", "Softsign", "Sin", "Cos", "Not", "Cast", "Clip", "Identity",
})


def _restores(t2: gs.Tensor, x: gs.Tensor, allowzero: int) -> bool:
    """Reshaping a tensor of x's element count to the constant ``t2`` gives exactly x's shape."""
    if not isinstance(t2, gs.Constant) or x.shape is None:
        return False
    target = [int(v) for v in np.asarray(t2.values).ravel()]
    if len(target) != len(x.shape) or (0 in target and not allowzero) or target.count(-1) > 1:
        return False
    for v, d in zip(target, x.shape):
        if v == -1:
            continue  # the one -1: the element count, the same as x's, leaves x's dim here
        if not isinstance(d, (int, np.integer)) or int(d) != v:
            return False
    return True


def _producers_first(region: list[gs.Node], inside: set[int]) -> list[gs.Node]:
    """The region's nodes, each after the region nodes it reads (a walk of the region only, not
    of the graph)."""
    done: set[int] = set()
    out: list[gs.Node] = []
    for start in region:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                done.add(id(node))
                out.append(node)
                continue
            stack.append((node, True))
            for t in node.inputs:
                p = t.inputs[0] if len(t.inputs) == 1 else None
                if p is not None and id(p) in inside and id(p) not in done:
                    stack.append((p, False))
    return out


class _AroundElementwise(Rule):
    """Case 5: a Reshape, elementwise ops, and a Reshape back to the first one's input shape: the
    elementwise ops run on the input as it is (both Reshapes go). Every tensor in between is read
    only inside the region; the constants are scalars (one element, rank 0 or 1), so no operand
    broadcasts differently at the other rank."""

    pattern = ("Reshape",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if anchor.op != "Reshape" or len(anchor.inputs) < 2 or not anchor.inputs[0].name:
            return None
        y = anchor.inputs[0]
        if not scope.single_reader(y):
            return None
        region, first, todo, seen = [], None, [y], set()
        while todo:
            t = todo.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            node = scope.producer(t)
            if node is None:
                return None
            if node.op == "Reshape":
                if first is not None and first is not node:
                    return None
                first = node
                continue
            if node.op not in _ELEMENTWISE or len(node.outputs) != 1 or len(region) > 64:
                return None
            region.append(node)
            for i in node.inputs:
                if isinstance(i, gs.Constant):
                    if np.asarray(i.values).size != 1 or np.asarray(i.values).ndim > 1:
                        return None
                elif i.name:
                    todo.append(i)
        if first is None or not region or len(first.inputs) < 2 or not first.inputs[0].name:
            return None
        inside = {id(n) for n in region}
        for t in [first.outputs[0]] + [n.outputs[0] for n in region]:
            readers = [r for r in t.outputs if id(r) in inside or r is anchor]
            if len(readers) != len(t.outputs) or scope.is_output(t):
                return None
        x = first.inputs[0]
        if x.shape is None or not len(x.shape):  # a [1] constant would make a scalar x rank 1
            return None
        if not _restores(anchor.inputs[1], x, int(anchor.attrs.get("allowzero", 0))):
            return None
        m = scope.match([first] + _producers_first(region, inside) + [anchor])
        m.x, m.mid, m.y = x, first.outputs[0], y
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("around_elementwise")
        new = {id(m.mid): m.x}
        for node in m.nodes[1:-1]:
            out = m.copy(node, inputs=[new.get(id(i), i) for i in node.inputs])
            new[id(node.outputs[0])] = out
        return new[id(m.y)]


class _Noop(Rule):
    """Case 3: a Reshape that does not change a static shape (not writing a graph output)."""

    pattern = ("Reshape",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or len(anchor.inputs) < 2 or not isinstance(anchor.inputs[1], gs.Constant):
            return None
        a, b = static_shape(anchor.inputs[0]), static_shape(anchor.outputs[0])
        return m if a is not None and a == b and not scope.is_output(anchor.outputs[0]) else None

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


@register
class MergeReshapes(RulePass):
    """Collapses chains of shape-only ops that end in a Reshape.

    Cases:
      1. the final Reshape's target has no 0: it reads the chain's input directly;
      2. its 0 entries copy dims of the intermediate tensor, known statically: they are
         replaced by those dims (a new shape constant), then as case 1;
      3. a Reshape that does not change a static shape is removed;
      4. Unsqueeze after Unsqueeze: one Unsqueeze of the composed axes, whatever the dims
         (negative axes need the input's rank; an invalid axis list is left as it is);
      5. Reshape -> elementwise ops with scalar constants -> Reshape back to the first input's
         shape (its static dims and at most one -1): the elementwise ops read the input itself.
    """

    name = "merge_reshapes"
    summary = "Collapse Reshape/Flatten/Squeeze/Unsqueeze -> Reshape chains and Unsqueeze pairs; drop no-op Reshapes."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    rules = (_AroundElementwise(), _Chain(), _Unsqueezes(), _Noop())

    def summarize(self, counts: RuleCounts) -> dict:
        return {"merged": counts.total("merged"), "noop_removed": counts.total("noop_removed"),
                "around_elementwise": counts.total("around_elementwise"), "rules": counts}
