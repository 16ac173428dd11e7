"""Reshape-chain merging.

    {Reshape, Flatten, Squeeze, Unsqueeze}(x) -> Reshape(s)   =>  Reshape(x, s)
        when s is a constant with no 0 entry (or allowzero=1), or its 0 entries can be resolved
        from the static shape of the intermediate tensor
    Reshape(x, s) with static output shape == static input shape  =>  removed

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
      3. a Reshape that does not change a static shape is removed.
    """

    name = "merge_reshapes"
    summary = "Collapse Reshape/Flatten/Squeeze/Unsqueeze -> Reshape chains; drop no-op Reshapes."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    rules = (_Chain(), _Noop())

    def summarize(self, counts: RuleCounts) -> dict:
        return {"merged": counts.total("merged"), "noop_removed": counts.total("noop_removed"), "rules": counts}
