"""Matching the nodes and tensors of two graphs, in linear time.

1. Graph inputs by name (then by position; bodies and functions by position only); weights by
   content (dtype, dims, full hash of the values): the same name first, then any name; then by
   name (a changed weight).
2. Forward, in topological order of the after-graph: a node matches a before-node with the same
   op, number of outputs and attributes whose inputs are the matched tensors (a structural hash
   keyed on already matched inputs, in sorted order for commutative ops; node names play no part,
   so a re-export with other names still matches). Among several such before-nodes (two Relu of
   one tensor) the one with the same output names, else the same name, else the first.
3. By name: an unmatched node with a name that is unique on both sides and the same op.
4. Backward, from the graph outputs and every matched pair: the producers of corresponding inputs
   match when they have the same op (this reaches nodes below a rewrite whose input changed).
Steps 2-4 repeat while they find something (each pass is linear; a handful of rounds suffice).
Node provenance (``graphpass.fused_from``) is not used to match, only to group (see core.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict, deque

from graphpass.diff.views import GraphView

__all__ = ["Matching", "match"]


@dataclasses.dataclass
class Matching:
    a_of_b: dict[int, int] = dataclasses.field(default_factory=dict)
    b_of_a: dict[int, int] = dataclasses.field(default_factory=dict)
    how: dict[int, str] = dataclasses.field(default_factory=dict)  # after-node -> structure | name | neighbours
    tensor: dict[str, str] = dataclasses.field(default_factory=dict)  # after-tensor -> before-tensor
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)  # after input -> before input
    weights: dict[str, str] = dataclasses.field(default_factory=dict)  # after weight -> before weight

    def pair(self, ia: int, ib: int, how: str, a: GraphView, b: GraphView) -> None:
        self.a_of_b[ib] = ia
        self.b_of_a[ia] = ib
        self.how[ib] = how
        for ta, tb in zip(a.nodes[ia].outputs, b.nodes[ib].outputs):
            if ta and tb:
                self.tensor[tb] = ta


def match(a: GraphView, b: GraphView, max_rounds: int = 4, outer: dict[str, str] | None = None,
          positional: bool = False) -> Matching:
    """``outer``: the enclosing graphs' tensor matching (what a body reads from outside);
    ``positional``: inputs correspond by position only (a body's or a function's parameters)."""
    m = Matching()
    m.tensor.update(outer or {})
    m.tensor[""] = ""
    # 1. inputs and weights
    a_inputs = [name for name, _ in a.inputs]
    left = list(a_inputs)
    if not positional:
        taken = set()
        for name, _ in b.inputs:
            if name in a.input_names:
                m.inputs[name] = name
                taken.add(name)
        left = [n for n in a_inputs if n not in taken]
    rest = [name for name, _ in b.inputs if name not in m.inputs]
    for nb, na in zip(rest, left):  # renamed inputs: by position among the unmatched
        m.inputs[nb] = na
    by_digest: dict[tuple, deque] = defaultdict(deque)
    for name, d in a.digest.items():
        by_digest[d].append(name)
    used: set[str] = set()
    for name, d in b.digest.items():  # same name, same content (two equal biases stay apart)
        if a.digest.get(name) == d:
            m.weights[name] = name
            used.add(name)
    for name, d in b.digest.items():
        if name in m.weights:
            continue
        q = by_digest.get(d)
        while q and q[0] in used:
            q.popleft()
        if q:
            m.weights[name] = q.popleft()
            used.add(m.weights[name])
    for name in b.digest:
        if name not in m.weights and name in a.digest and name not in used:
            m.weights[name] = name  # same name, new value: a changed weight
            used.add(name)
    m.tensor.update(m.inputs)
    m.tensor.update(m.weights)

    index: dict[tuple, deque] = defaultdict(deque)
    for n in a.nodes:
        index[(n.key, tuple(sorted(n.inputs)) if n.commutative else tuple(n.inputs))].append(n.index)
    a_names = _unique_names(a)
    b_names = _unique_names(b)
    order_b = b.order()
    for _ in range(max_rounds):
        found = _forward(a, b, m, index, order_b)
        found += _by_name(a, b, m, a_names, b_names)
        found += _backward(a, b, m, order_b)
        if not found:
            break
    return m


def _unique_names(g: GraphView) -> dict[str, int]:
    seen: dict[str, int] = {}
    dup: set[str] = set()
    for n in g.nodes:
        if n.name:
            if n.name in seen:
                dup.add(n.name)
            seen[n.name] = n.index
    return {k: v for k, v in seen.items() if k not in dup}


def _forward(a: GraphView, b: GraphView, m: Matching, index, order_b) -> int:
    found = 0
    for ib in order_b:
        if ib in m.a_of_b:
            continue
        nb = b.nodes[ib]
        mapped = []
        for t in nb.inputs:
            ta = m.tensor.get(t)
            if ta is None:
                break
            mapped.append(ta)
        else:
            q = index.get((nb.key, tuple(sorted(mapped)) if nb.commutative else tuple(mapped)))
            while q and q[0] in m.b_of_a:
                q.popleft()
            if q:
                pick = q[0]
                if len(q) > 1:  # equal candidates: prefer the one that kept its output names, or its name
                    free = [i for i in itertools.islice(q, 64) if i not in m.b_of_a]
                    pick = next((i for i in free if a.nodes[i].outputs == nb.outputs),
                                next((i for i in free if nb.name and a.nodes[i].name == nb.name), free[0]))
                if pick == q[0]:
                    q.popleft()
                m.pair(pick, ib, "structure", a, b)
                found += 1
    return found


def _by_name(a: GraphView, b: GraphView, m: Matching, a_names, b_names) -> int:
    found = 0
    for name, ib in b_names.items():
        ia = a_names.get(name)
        if ia is None or ib in m.a_of_b or ia in m.b_of_a or a.nodes[ia].op != b.nodes[ib].op:
            continue
        m.pair(ia, ib, "name", a, b)
        found += 1
    return found


def _backward(a: GraphView, b: GraphView, m: Matching, order_b) -> int:
    found = 0
    work: list[tuple[str, str]] = []
    a_out = [n for n, _ in a.outputs]
    b_out = [n for n, _ in b.outputs]
    names_a = set(a_out)
    pairs = [(n, n) for n in b_out if n in names_a]
    rest_a = [n for n in a_out if n not in set(b_out)]
    rest_b = [n for n in b_out if n not in names_a]
    work += pairs + list(zip(rest_a, rest_b))
    for ib in reversed(order_b):
        ia = m.a_of_b.get(ib)
        if ia is not None:
            work.extend(zip(a.nodes[ia].inputs, b.nodes[ib].inputs))
    while work:
        ta, tb = work.pop()
        pa, pb = a.producer.get(ta), b.producer.get(tb)
        if pa is None or pb is None or pa[1] != pb[1]:
            continue
        ia, ib = pa[0], pb[0]
        if ia in m.b_of_a or ib in m.a_of_b or a.nodes[ia].op != b.nodes[ib].op:
            continue
        m.pair(ia, ib, "neighbours", a, b)
        found += 1
        work.extend(zip(a.nodes[ia].inputs, b.nodes[ib].inputs))
    return found
