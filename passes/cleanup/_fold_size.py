"""fold_constants' size policy: a fold never makes the file bigger unless asked to.

    new bytes (the folded tensors)  <=  freed bytes (the constants only the folded subgraph read,
                                          at the least bytes they took: graphpass.ir.size.freed_bytes)
                                        + for each node the fold removes, NODE_ALLOWANCE or
                                          the least bytes it took, whichever is smaller

Folding a set S of boundary tensors removes every fold node whose outputs are all either in S
or read only by removed nodes, and frees every constant (initializer, lowered Constant) that only
removed nodes read. Tensors are decided by *components*: two wanted tensors whose subgraphs are
joined through a node or a constant are decided together (a weight split in three is freed only when all three
parts fold), and when a component as a whole would grow, its tensors are tried one at a time
in topological order (each kept only if it does not grow the file given the ones kept before).

``NODE_ALLOWANCE`` (64 bytes): a removed node takes its NodeProto out of the file: an op type, an
output name and one name per input, each length-prefixed; exporter names run 20-60 bytes, so
a node of exporter output is 60-200 bytes, but a nameless hand-made one can be 12: a node is
credited the least bytes it took (:func:`graphpass.ir.size.node_bytes_least`) up to 64 (a chain
of 200 such nodes before a Tile no longer buys 12 kB of folded data). 64
bytes is an int64 shape vector of rank 8, so ``Shape -> Gather -> Concat`` chains that become a
shape vector fold; a fold that stores more (a ConstantOfShape weight fill, a Tile, an Expand)
needs ``fold_growing`` or room in the file.

Room: the rule above keeps each fold from growing its own part of the file. A fold that would
grow it still happens while the whole model stays no bigger than it was loaded: ``room`` is the
input's bytes minus an upper bound of the model's bytes now (:func:`graphpass.ir.size.bytes_bound`;
what earlier passes removed, exporter debug metadata stripped included), and each such fold is
charged its most bytes (data and initializer overhead, minus the least bytes of the constants
it frees, nothing for removed nodes) in topological order until the room is spent. A small GPT-2's tied lm_head weight,
transposed for the MatMul, folds this way (as onnxsim folds it) while the file still shrinks.
"""

from __future__ import annotations

from typing import Callable

import onnx_graphsurgeon as gs

from graphpass.ir.size import constant_overhead, freed_bytes, node_bytes_least

__all__ = ["NODE_ALLOWANCE", "plan", "SizeMemo"]

#: bytes of tensor data a fold may add per node it removes (see the module docstring)
NODE_ALLOWANCE = 64

#: a component with more (tensors x nodes) than this is not retried tensor by tensor
_MAX_GREEDY_WORK = 1 << 20


class SizeMemo:
    """The bytes a constant frees and a node takes, each computed once for the two size
    decisions of one batch (before evaluation, on the sizes shapes give; after it, on the
    computed ones): nothing changes the nodes or constants between them."""

    def __init__(self) -> None:
        self._freed: dict[int, tuple[gs.Constant, int]] = {}
        self._node: dict[int, tuple[gs.Node, int]] = {}

    def freed(self, c: gs.Constant) -> int:
        hit = self._freed.get(id(c))
        if hit is None or hit[0] is not c:
            hit = self._freed[id(c)] = (c, freed_bytes(c))
        return hit[1]

    def node(self, n: gs.Node) -> int:
        hit = self._node.get(id(n))
        if hit is None or hit[0] is not n:
            hit = self._node[id(n)] = (n, node_bytes_least(n))
        return hit[1]


class _Component:
    def __init__(self) -> None:
        self.tensors: list[gs.Tensor] = []
        self.nodes: dict[int, gs.Node] = {}


def _growth(chosen: list[gs.Tensor], nodes: list[gs.Node], sizes: dict[int, int], graph_outputs: set[int],
            bound: bool = False, memo: SizeMemo | None = None) -> int:
    """Bytes the file grows by when ``chosen`` (tensors produced inside ``nodes``, a component
    in topological order) are folded. ``bound``: the most it can grow (what the model-wide room
    is charged): each new initializer's own overhead counted, nothing for the removed nodes."""
    memo = memo if memo is not None else SizeMemo()
    chosen_ids = {id(t) for t in chosen}
    removed: set[int] = set()
    for n in reversed(nodes):  # topological order: readers first
        if all(id(o) in chosen_ids or (id(o) not in graph_outputs and all(id(r) in removed for r in o.outputs))
               for o in n.outputs):
            removed.add(id(n))
    freed = 0
    counted: set[int] = set()
    for n in nodes:
        if id(n) not in removed:
            continue
        for c in n.inputs:
            if (isinstance(c, gs.Constant) and id(c) not in counted and id(c) not in graph_outputs
                    and all(id(r) in removed for r in c.outputs)):
                counted.add(id(c))
                freed += memo.freed(c)  # the least it took: never pays for more than it freed
    new = sum(sizes.get(id(t), 0) for t in chosen)
    if bound:
        return new + sum(constant_overhead(t.name, len(t.shape) if t.shape is not None else 8) for t in chosen) - freed
    return new - freed - sum(min(NODE_ALLOWANCE, memo.node(n)) for n in nodes if id(n) in removed)


def plan(wanted: list[gs.Tensor], foldable: list[gs.Node], sizes: dict[int, int], graph_outputs: set[int],
         growing_limit: int | None, room: int | Callable[[], int] = 0, memo: SizeMemo | None = None
         ) -> tuple[list[gs.Tensor], list[gs.Tensor], list[gs.Tensor], int]:
    """Split ``wanted`` (boundary tensors of the foldable set, topologically ordered) into the
    ones to fold, the ones refused because the file would grow, and (only with
    ``growing_limit``, the ``fold_growing`` mode) the growing ones refused as over that limit.

    Args:
        sizes: bytes of each wanted tensor by id (0 when not known yet: evaluation tells).
        graph_outputs: ids of the graph's outputs (never freed).
        growing_limit: None by default; with ``fold_growing`` the size limit up to which a
            tensor is folded even when the file grows.
        room: bytes the model may still grow by (see the module docstring), or a function
            computing it, called only when a fold would grow the file (computing it walks the
            whole model); unused with ``growing_limit``.
        memo: the bytes of the batch's constants and nodes, when the caller decides it twice.

    Returns:
        (fold, grow, over, room used).
    """
    memo = memo if memo is not None else SizeMemo()
    order = {id(n): k for k, n in enumerate(foldable)}
    # components: fold nodes joined through the tensors and constants they share (linear)
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        root = i
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[i] != root:
            parent[i], i = root, parent[i]
        return root

    for n in foldable:
        for x in n.inputs:
            p = x.inputs[0] if len(x.inputs) else None
            if p is not None and id(p) in order:
                parent[find(id(p))] = find(id(n))
            elif isinstance(x, gs.Constant):
                parent[find(id(x))] = find(id(n))
    comps: dict[int, _Component] = {}
    for n in foldable:
        comps.setdefault(find(id(n)), _Component()).nodes[id(n)] = n
    for t in wanted:
        comps[find(id(t.inputs[0]))].tensors.append(t)
    fold: list[gs.Tensor] = []
    grow: list[gs.Tensor] = []
    over: list[gs.Tensor] = []
    used = 0
    for c in comps.values():
        if not c.tensors:
            continue
        nodes = sorted(c.nodes.values(), key=lambda n: order[id(n)])
        if _growth(c.tensors, nodes, sizes, graph_outputs, memo=memo) <= 0:
            fold.extend(c.tensors)
            continue
        kept: list[gs.Tensor] = []
        if len(c.tensors) > 1 and len(c.tensors) * len(nodes) <= _MAX_GREEDY_WORK:
            base = _growth([], nodes, sizes, graph_outputs, memo=memo)
            for t in c.tensors:
                g = _growth(kept + [t], nodes, sizes, graph_outputs, memo=memo)
                if g - base <= 0:
                    kept.append(t)
                    base = g
        if callable(room) and growing_limit is None and len(c.tensors) * len(nodes) <= _MAX_GREEDY_WORK:
            room = room()
        if growing_limit is None and not callable(room) and room - used > 0 \
                and len(c.tensors) * len(nodes) <= _MAX_GREEDY_WORK:
            # the model-wide room, charged at the most each fold can grow the file
            base = _growth(kept, nodes, sizes, graph_outputs, bound=True, memo=memo)
            taken = {id(t) for t in kept}
            for t in c.tensors:
                if id(t) in taken:
                    continue
                g = _growth(kept + [t], nodes, sizes, graph_outputs, bound=True, memo=memo)
                if g - base <= room - used:
                    used += max(0, g - base)
                    kept.append(t)
                    base = g
        fold.extend(kept)
        kept_ids = {id(t) for t in kept}
        for t in c.tensors:
            if id(t) in kept_ids:
                continue
            if growing_limit is None:
                grow.append(t)
            elif sizes.get(id(t), 0) <= growing_limit:
                fold.append(t)
            else:
                over.append(t)
    rank = {id(t): k for k, t in enumerate(wanted)}
    fold.sort(key=lambda t: rank[id(t)])
    return fold, grow, over, used
