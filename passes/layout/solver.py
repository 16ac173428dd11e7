"""The exact two-format solver: ND vs NC1HWC0 as a minimum s-t cut.

Every format-agnostic node ``v`` gets a binary variable ``x_v`` (0 = ND, 1 = NC1HWC0). The
energy the layout pass minimizes is

    E(x) = constant + sum_v u_v(x_v) + sum_k w_k * [any x_v = 1, v in S_k] + sum_k w_k * [any x_v = 0, v in S_k]

Unary terms ``u_v`` price the node itself in each format (padding inflation, the repacking
kernel of a Concat of unaligned C). The two "any" terms price TransData: a tensor whose producer
and readers do not all agree needs one conversion, and for a tensor produced in format p and
read by a set R of nodes, ``w * [not all of {p} + R in one format] = w * [any is 1] + w * [any
is 0] - w``. Each "any" term is a coverage function, hence submodular, and is represented
exactly by one auxiliary node in the flow graph (Kolmogorov & Zabih, "What energy functions can
be minimized via graph cuts?", 2004):

    w * [any x_v = 1]:  s -> a (capacity w),  a -> v (infinite) for v in S
    w * [any x_v = 0]:  b -> t (capacity w),  v -> b (infinite) for v in S

with source side = 0 (ND) and sink side = 1 (NC1HWC0); ``u_v(1)`` is the edge s -> v and
``u_v(0)`` the edge v -> t. The minimum cut is therefore the minimum of E, not a bound. The
energy splits into independent components (variables that share no term); each is solved on
its own. Components of one variable are decided directly, small ones (up to
``BRUTE_FORCE_MAX`` variables) by enumeration, larger ones by exact variable elimination
(``elimination.py``: residual networks chain every block into one long, thin region, on which
max-flow was superlinear — 108 s for 100k nodes — and elimination is linear), and only a region
too wide to eliminate by the minimum cut. All four are exact; the tests check each against
brute force.

Capacities are integers (picoseconds): networkx's max-flow is exact on integers.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence


from graphpass.passes.layout.elimination import eliminate

__all__ = ["Energy", "solve", "brute_force", "BRUTE_FORCE_MAX", "MAX_WIDTH"]

#: Components with at most this many variables are enumerated.
BRUTE_FORCE_MAX = 6
#: Larger ones are solved by variable elimination while no step couples more than this many
#: variables (``elimination.py``), else by the minimum cut. 0: always cut.
MAX_WIDTH = 12
_SCALE = 1_000_000  # µs -> ps: integer capacities


@dataclasses.dataclass
class Energy:
    """A pseudo-boolean energy over ``n`` binary variables (see the module docstring)."""

    n: int = 0
    unary: list[list[float]] = dataclasses.field(default_factory=list)
    any1: list[tuple[float, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    any0: list[tuple[float, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    constant: float = 0.0

    def add_var(self, cost0: float = 0.0, cost1: float = 0.0) -> int:
        self.unary.append([cost0, cost1])
        self.n += 1
        return self.n - 1

    def add_any(self, value: int, weight: float, variables: Sequence[int]) -> None:
        """Add ``weight * [some variable in variables == value]``."""
        if weight < 0:
            raise ValueError("an 'any' term needs a non-negative weight")
        vs = tuple(sorted(set(variables)))
        if not vs or weight == 0:
            return
        if len(vs) == 1:  # [x_v == value]: a unary term, no auxiliary node needed
            self.unary[vs[0]][value] += weight
            return
        (self.any1 if value == 1 else self.any0).append((weight, vs))

    def add_any_sorted(self, value: int, weight: float, vs: tuple[int, ...]) -> None:
        """:meth:`add_any` for ``vs`` already a sorted tuple of distinct variables."""
        if weight < 0:
            raise ValueError("an 'any' term needs a non-negative weight")
        if not vs or weight == 0:
            return
        if len(vs) == 1:
            self.unary[vs[0]][value] += weight
            return
        (self.any1 if value == 1 else self.any0).append((weight, vs))

    def value(self, x: Sequence[int]) -> float:
        get = x.__getitem__  # (``1 in``: some x[v] == 1; the same terms summed in the same order)
        e = self.constant + sum([u[xv] for u, xv in zip(self.unary, x)])
        e += sum([w for w, vs in self.any1 if 1 in map(get, vs)])
        e += sum([w for w, vs in self.any0 if 0 in map(get, vs)])
        return e


def _components(energy: Energy) -> list[list[int]]:
    parent = list(range(energy.n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for _, vs in itertools.chain(energy.any1, energy.any0):
        r = find(vs[0])
        for v in vs[1:]:
            rv = find(v)
            if rv != r:
                parent[rv] = r
    groups: dict[int, list[int]] = {}
    for v in range(energy.n):
        groups.setdefault(find(v), []).append(v)
    return list(groups.values())


def _enumerate(unary, any1, any0) -> list[int]:
    n = len(unary)
    best, best_x = None, None
    for bits in itertools.product((0, 1), repeat=n):
        e = sum(u[b] for u, b in zip(unary, bits))
        e += sum(w for w, vs in any1 if any(bits[v] for v in vs))
        e += sum(w for w, vs in any0 if any(not bits[v] for v in vs))
        if best is None or e < best - 1e-12:
            best, best_x = e, list(bits)
    return best_x


def _cut(unary, any1, any0) -> list[int]:
    import networkx as nx  # imported here: a tenth of a second every graphpass start paid for it
    from networkx.algorithms.flow import boykov_kolmogorov

    g = nx.DiGraph()
    s, t = "s", "t"
    g.add_node(s)
    g.add_node(t)
    for v, (c0, c1) in enumerate(unary):
        lo = min(c0, c1)
        c0, c1 = round((c0 - lo) * _SCALE), round((c1 - lo) * _SCALE)
        g.add_node(v)
        if c1:
            g.add_edge(s, v, capacity=c1)  # cut when v is on the sink side (NC1HWC0)
        if c0:
            g.add_edge(v, t, capacity=c0)  # cut when v is on the source side (ND)
    for k, (w, vs) in enumerate(any1):
        a = ("a", k)
        g.add_edge(s, a, capacity=round(w * _SCALE))
        for v in vs:
            g.add_edge(a, v)  # no capacity attribute: infinite
    for k, (w, vs) in enumerate(any0):
        b = ("b", k)
        g.add_edge(b, t, capacity=round(w * _SCALE))
        for v in vs:
            g.add_edge(v, b)
    _, (source_side, _) = nx.minimum_cut(g, s, t, flow_func=boykov_kolmogorov)
    return [0 if v in source_side else 1 for v in range(len(unary))]


def solve(energy: Energy) -> list[int]:
    """An assignment of minimum energy."""
    x = [0] * energy.n
    comps = _components(energy)
    # index terms by component once (each term belongs to the component of its first variable)
    comp_of = {}
    for ci, comp in enumerate(comps):
        for v in comp:
            comp_of[v] = ci
    per1: list[list] = [[] for _ in comps]
    per0: list[list] = [[] for _ in comps]
    for w, vs in energy.any1:
        per1[comp_of[vs[0]]].append((w, vs))
    for w, vs in energy.any0:
        per0[comp_of[vs[0]]].append((w, vs))
    for ci, comp in enumerate(comps):
        if len(comp) == 1:
            v = comp[0]
            c0 = energy.unary[v][0] + sum(w for w, _ in per0[ci])
            c1 = energy.unary[v][1] + sum(w for w, _ in per1[ci])
            x[v] = 1 if c1 < c0 else 0
            continue
        if len(comp) == energy.n:  # one component of every variable (a CNN): numbered as it is
            unary, any1, any0 = energy.unary, per1[ci], per0[ci]
        else:
            index = {v: i for i, v in enumerate(comp)}
            unary = [energy.unary[v] for v in comp]
            any1 = [(w, tuple(index[v] for v in vs)) for w, vs in per1[ci]]
            any0 = [(w, tuple(index[v] for v in vs)) for w, vs in per0[ci]]
        if len(comp) <= BRUTE_FORCE_MAX:
            local = _enumerate(unary, any1, any0)
        else:
            local = eliminate(unary, any1, any0, MAX_WIDTH) if MAX_WIDTH else None
            if local is None:  # too wide to eliminate: the minimum cut
                local = _cut(unary, any1, any0)
        for v, b in zip(comp, local):
            x[v] = b
    return x


def brute_force(energy: Energy) -> tuple[list[int], float]:
    """Minimum over all 2^n assignments, vectorized (for tests; n up to ~18)."""
    import numpy as np

    n = energy.n
    bits = ((np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)
    e = np.full(1 << n, energy.constant, dtype=np.float64)
    for v, (c0, c1) in enumerate(energy.unary):
        e += np.where(bits[:, v], c1, c0)
    for w, vs in energy.any1:
        e += w * bits[:, list(vs)].any(axis=1)
    for w, vs in energy.any0:
        e += w * (~bits[:, list(vs)]).any(axis=1)
    k = int(np.argmin(e))
    return [int(b) for b in bits[k]], float(e[k])
