"""Gathers of one tensor at constant scalar indices along one axis become one Split.

    Gather(x, i1, axis=a), ..., Gather(x, ik, axis=a)    (i scalar constants, x's dim d on a static)
        =>  p = Split(x, axis=a, sizes covering 0..d-1: [1] at each i, the gaps between as one part)
            Squeeze(p[part of i], axes=[a]) in place of each Gather

auto_optimizer's "Gather to Split" knowledge (issue 25): ``q, k, v = qkv[0], qkv[1], qkv[2]``
(torch's ``unbind`` and indexing) is three GatherV2 kernels on Ascend, each reading x; one SplitD
reads it once and the Squeezes are views. Exact: a Gather with a scalar index copies the slice
``x[..., i, ...]`` and drops the axis; the Split copies the same elements and the Squeeze drops the
same axis. Only in-range indices (a Gather out of range fails at run time, a Split would not); at
least two Gathers of the same tensor and axis (one Gather is already one kernel); the Gathers'
outputs keep their names and types (each Squeeze writes the tensor its Gather wrote).

The cost model decides (the pass is scored and needs a hardware target): the CANN kernels'
launch and data-movement costs say whether one Split beats the Gathers on the target. It is the
inverse direction of ``fuse_gather_split`` (Gather + Split -> Gathers with 1-D indices); the two
cannot undo each other in one run: this pass takes scalar indices only, and that one writes 1-D
indices only.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs
from graphpass.ir.model import opset_of
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, Pass

__all__ = ["GatherToSplit"]


def _scalar_index(t: gs.Tensor) -> int | None:
    if not isinstance(t, gs.Constant):
        return None
    v = np.asarray(t.values)
    if v.ndim != 0 or v.dtype.kind not in "iu":
        return None
    return int(v)


def _parts(indices: list[int], d: int) -> tuple[list[int], dict[int, int]]:
    """Split sizes covering 0..d-1 with a part of size 1 at each index, and index -> part."""
    sizes, where, pos = [], {}, 0
    for i in sorted(set(indices)):
        if i > pos:
            sizes.append(i - pos)
        where[i] = len(sizes)
        sizes.append(1)
        pos = i + 1
    if pos < d:
        sizes.append(d - pos)
    return sizes, where


@register
class GatherToSplit(Pass):
    """Several scalar-index Gathers of one tensor along one axis -> one Split and a Squeeze each."""

    name = "gather_to_split"
    anchor_ops = frozenset({"Gather"})  # nothing to do in a graph without them
    summary = "Gathers of one tensor at constant scalar indices along one axis -> one Split (+ a Squeeze each); exact."
    kind = PassKind.FUSION
    promise = EXACT
    scored = True  # whether one Split beats k Gathers is the target's cost model's call
    needs_target = True
    runs_after = ("fuse_gather_split",)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        opset = opset_of(graph) or 13
        names = None
        stats = {"splits": 0, "gathers": 0}
        for g in iter_graphs(graph):
            groups: dict[tuple[int, int], list[tuple[int, gs.Node]]] = defaultdict(list)
            dims: dict[tuple[int, int], int] = {}
            tensors: dict[int, gs.Tensor] = {}
            for node in g.nodes:
                if node.op != "Gather" or node.domain not in (None, "", "ai.onnx") or len(node.inputs) != 2:
                    continue
                x, i = node.inputs[0], _scalar_index(node.inputs[1])
                shape = x.shape
                if i is None or shape is None or not node.outputs or not node.outputs[0].name:
                    continue
                axis = int(node.attrs.get("axis", 0))
                axis = axis + len(shape) if axis < 0 else axis
                if not 0 <= axis < len(shape) or not isinstance(shape[axis], (int, np.integer)):
                    continue
                d = int(shape[axis])
                i = i + d if i < 0 else i
                if not 0 <= i < d:
                    continue  # out of range: the Gather fails at run time, keep it that way
                groups[(id(x), axis)].append((i, node))
                dims[(id(x), axis)] = d
                tensors[id(x)] = x
            if not any(len(v) >= 2 for v in groups.values()):
                continue
            if names is None:
                names = NameGen(graph)
            before: dict[int, list[gs.Node]] = {}
            replace: dict[int, gs.Node] = {}
            for (xid, axis), items in groups.items():
                if len(items) < 2:
                    continue
                x, d = tensors[xid], dims[(xid, axis)]
                sizes, where = _parts([i for i, _ in items], d)
                first = items[0][1]
                label = first.name or "gather"
                parts = [gs.Variable(names(f"{x.name}_part"), dtype=x.dtype) for _ in sizes]
                if opset >= 13:
                    sizes_t = gs.Constant(names(f"{x.name}_split_sizes"), np.array(sizes, np.int64))
                    split = gs.Node("Split", names(f"{label}_to_split"), {"axis": axis}, inputs=[x, sizes_t], outputs=parts)
                else:
                    split = gs.Node("Split", names(f"{label}_to_split"), {"axis": axis, "split": sizes},
                                    inputs=[x], outputs=parts)
                A.mark_created(split, self.name, replaced=[n for _, n in items])
                before.setdefault(id(first), []).append(split)
                for i, node in items:
                    out = node.outputs[0]
                    node.inputs.clear()
                    node.outputs.clear()  # the Squeeze writes the Gather's tensor: its name, type, shape stay
                    if opset >= 13:
                        axes = gs.Constant(names(f"{node.name or 'gather'}_axes"), np.array([axis], np.int64))
                        sq = gs.Node("Squeeze", node.name or names("squeeze"), inputs=[parts[where[i]], axes], outputs=[out])
                    else:
                        sq = gs.Node("Squeeze", node.name or names("squeeze"), {"axes": [axis]},
                                     inputs=[parts[where[i]]], outputs=[out])
                    A.meta(sq).update(A.meta(node))
                    A.mark_created(sq, self.name, replaced=[node])
                    replace[id(node)] = sq
                stats["splits"] += 1
                stats["gathers"] += len(items)
            nodes = []
            for n in g.nodes:
                nodes.extend(before.get(id(n), []))
                nodes.append(replace.get(id(n), n))
            g.nodes = nodes
        return PassResult(stats["splits"] > 0, stats)
