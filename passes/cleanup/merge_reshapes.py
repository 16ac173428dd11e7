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

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes, replace_uses
from graphpass.ir.shapes import static_shape
from graphpass.passes.cleanup._common import is_onnx_op, local_producer, outputs_free

__all__ = ["MergeReshapes"]

_SHAPE_ONLY = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


@register
class MergeReshapes(Pass):
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

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"merged": 0, "noop_removed": 0}
        names = None
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            local = {id(n) for n in g.nodes}
            dead = []
            for node in g.nodes:
                if not is_onnx_op(node, "Reshape") or len(node.inputs) < 2:
                    continue
                data, shape_t = node.inputs[0], node.inputs[1]
                if not isinstance(shape_t, gs.Constant):
                    continue
                target = [int(v) for v in np.asarray(shape_t.values).ravel()]
                allowzero = int(node.attrs.get("allowzero", 0))
                while True:  # hop over the whole chain of shape-only producers
                    data = node.inputs[0]
                    first = local_producer(data, local, *_SHAPE_ONLY)
                    if first is None or not first.inputs:
                        break
                    if not allowzero and 0 in target:
                        mid = static_shape(data)
                        if mid is None or len(mid) < len(target):
                            break
                        target = [mid[i] if v == 0 else v for i, v in enumerate(target)]
                        names = names or NameGen(graph)
                        node.inputs[1] = gs.Constant(names(shape_t.name or "shape"), np.array(target, dtype=np.int64))
                    node.inputs[0] = first.inputs[0]
                    stats["merged"] += 1
                    if outputs_free(first, g):
                        first.inputs.clear()
                        dead.append(first)
                src, out = node.inputs[0], node.outputs[0]
                a, b = static_shape(src), static_shape(out)
                if a is not None and a == b and id(out) not in outs:
                    replace_uses(out, src)
                    node.inputs.clear()
                    dead.append(node)
                    stats["noop_removed"] += 1
            remove_nodes(g, dead)
        return PassResult(bool(stats["merged"] or stats["noop_removed"]), stats)
