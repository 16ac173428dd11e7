"""Concat chains merged and Split/Slice re-chunking removed.

    Concat(axis=a)(..., Concat(axis=a)(p, q), ...)          =>  Concat(axis=a)(..., p, q, ...)
    Concat(axis=a)(Split(axis=a)(x) outputs, all, in order) =>  x
    Slice(Slice(x, s1, e1, axes1), s2, e2, axes2), steps 1  =>  Slice(x, composed starts/ends)

All exact. The inner Concat must have no other reader; the Split's outputs must be read only by
that Concat; Slices compose on static shapes with unit steps (indices resolved and clamped as
ONNX defines them).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, register
from graphpass.passes.framework.pass_base import PassResult, EXACT
from graphpass.passes.framework.rewrite import RulePass, single_reader
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes, replace_uses
from graphpass.ir.shapes import static_shape

__all__ = ["MergeConcats"]


def _axis(node: gs.Node, rank: int | None) -> int | None:
    a = int(node.attrs.get("axis", 0))
    if a < 0:
        return None if rank is None else a + rank
    return a


def _rank(t: gs.Tensor) -> int | None:
    s = t.shape
    return len(s) if s is not None else None


def _slice_params(node: gs.Node, shape: list[int]):
    """(starts, ends) per axis of a unit-step Slice, resolved against ``shape``; None if unknown."""
    if len(node.inputs) < 3 or not all(isinstance(t, gs.Constant) for t in node.inputs[1:3]):
        return None
    starts = [int(v) for v in np.asarray(node.inputs[1].values).ravel()]
    ends = [int(v) for v in np.asarray(node.inputs[2].values).ravel()]
    rank = len(shape)
    if len(node.inputs) > 3 and node.inputs[3].name:
        if not isinstance(node.inputs[3], gs.Constant):
            return None
        axes = [int(a) % rank for a in np.asarray(node.inputs[3].values).ravel()]
    else:
        axes = list(range(len(starts)))
    if len(node.inputs) > 4 and node.inputs[4].name:
        if not isinstance(node.inputs[4], gs.Constant) or any(int(s) != 1 for s in np.asarray(node.inputs[4].values).ravel()):
            return None
    out = {}
    for a, s, e in zip(axes, starts, ends):
        d = shape[a]
        s = max(0, min(d, s + d if s < 0 else s))
        e = max(0, min(d, e + d if e < 0 else e))
        out[a] = (s, max(s, e))
    return out


@register
class MergeConcats(RulePass):
    """Flattens Concat chains, drops Split->Concat round trips, composes Slice chains.

    Cases:
      1. a Concat input produced by a same-axis Concat read only here is spliced in;
      2. a Concat of every output of a same-axis Split, in order, is the Split's input;
      3. Slice -> Slice with unit steps and static shapes becomes one Slice.
    """

    name = "merge_concats"
    summary = "Merge Concat chains, remove Split->Concat round trips, compose Slice chains."
    kind = PassKind.FUSION
    promise = EXACT
    ascend_name = None

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        stats = {"concats_merged": 0, "split_concat_removed": 0, "slices_composed": 0}
        names = None
        for g in list(iter_graphs(graph)):
            local = {id(n) for n in g.nodes}
            outs = {id(t) for t in g.outputs}
            dead: list[gs.Node] = []
            dead_ids: set[int] = set()
            for node in g.nodes:
                if id(node) in dead_ids or node.domain not in (None, "", "ai.onnx"):
                    continue
                if node.op == "Concat":
                    rank = _rank(node.outputs[0])
                    axis = _axis(node, rank)
                    # case 2: Concat of a whole Split, in order
                    first = node.inputs[0].inputs[0] if node.inputs and len(node.inputs[0].inputs) == 1 else None
                    if (first is not None and first.op == "Split" and id(first) in local and axis is not None
                            and _axis(first, _rank(first.inputs[0])) == axis
                            and len(node.inputs) == len(first.outputs)
                            and all(a is b for a, b in zip(node.inputs, first.outputs))
                            and all(single_reader(t, g) for t in first.outputs) and id(node.outputs[0]) not in outs):
                        replace_uses(node.outputs[0], first.inputs[0])
                        for n in (node, first):
                            n.inputs.clear()
                            n.outputs.clear()
                            dead_ids.add(id(n))
                            dead.append(n)
                        stats["split_concat_removed"] += 1
                        continue
                    # case 1: splice same-axis Concat inputs
                    new_inputs, changed = [], False
                    # decide before splicing: splicing one input changes the reader counts of others
                    # (Concat(Concat(a, t), t) must not splice the second t once the first is gone)
                    sole = [single_reader(t, g) for t in node.inputs]
                    for t, only in zip(list(node.inputs), sole):
                        p = t.inputs[0] if len(t.inputs) == 1 else None
                        if (p is not None and p.op == "Concat" and id(p) in local and id(p) not in dead_ids and axis is not None
                                and _axis(p, _rank(p.outputs[0])) == axis and only):
                            new_inputs.extend(p.inputs)
                            p.inputs.clear()
                            p.outputs.clear()
                            dead_ids.add(id(p))
                            dead.append(p)
                            changed = True
                            stats["concats_merged"] += 1
                        else:
                            new_inputs.append(t)
                    if changed:
                        node.inputs.clear()
                        node.inputs.extend(new_inputs)
                        A.mark_created(node, self.name, replaced=[node])
                elif node.op == "Slice" and node.inputs:
                    inner = node.inputs[0].inputs[0] if len(node.inputs[0].inputs) == 1 else None
                    if inner is None or inner.op != "Slice" or id(inner) not in local or not single_reader(node.inputs[0], g):
                        continue
                    x = static_shape(inner.inputs[0])
                    mid = static_shape(node.inputs[0])
                    if x is None or mid is None:
                        continue
                    a, b = _slice_params(inner, x), _slice_params(node, mid)
                    if a is None or b is None:
                        continue
                    comp = dict(a)
                    for axis, (s, e) in b.items():
                        base = a.get(axis, (0, x[axis]))[0]
                        comp[axis] = (base + s, base + e)
                    axes = sorted(comp)
                    names = names or NameGen(graph)
                    node.inputs[0] = inner.inputs[0]
                    node.inputs[1] = gs.Constant(names("slice_starts"), np.array([comp[k][0] for k in axes], np.int64))
                    node.inputs[2] = gs.Constant(names("slice_ends"), np.array([comp[k][1] for k in axes], np.int64))
                    axes_t = gs.Constant(names("slice_axes"), np.array(axes, np.int64))
                    while len(node.inputs) < 4:
                        node.inputs.append(gs.Variable.empty())
                    node.inputs[3] = axes_t
                    if len(node.inputs) > 4:
                        del node.inputs[4:]
                    inner.inputs.clear()
                    inner.outputs.clear()
                    dead_ids.add(id(inner))
                    dead.append(inner)
                    A.mark_created(node, self.name, replaced=[inner, node])
                    stats["slices_composed"] += 1
            remove_nodes(g, dead)
        return PassResult(any(stats.values()), stats)
