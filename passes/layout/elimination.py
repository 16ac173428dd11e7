"""Exact minimization by variable elimination (min-sum dynamic programming).

The layout energy of a CNN is a long, thin structure: residual additions chain every block
into one connected region, so a region can hold tens of thousands of variables while each
variable only ever interacts with a handful of others. Max-flow on such a region is
superlinear in practice (networkx's Boykov-Kolmogorov took 108 s on a 53k-variable chain);
eliminating variables one at a time in min-degree order keeps every intermediate table small
(its *width* is the number of variables it couples), so the work is linear in the region's
size times 2^width. This is exact — the classic bucket elimination of Dechter (1999) on the
min-sum semiring — and returns None when some step would couple more than ``max_width``
variables, in which case the caller falls back to the minimum cut.

Terms: a unary table per variable; ``w * [any x_v = 1]`` and ``w * [any x_v = 0]`` over a
set S. A set of up to ``_DIRECT`` variables becomes one table over S; a larger one gets an
auxiliary variable z (the same construction as the cut's auxiliary node): ``w * z`` plus, for
each v in S, an infinite penalty on (x_v = 1, z = 0) — pairwise tables only.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

__all__ = ["eliminate"]

_DIRECT = 4
_INF = np.inf


def _any_table(k: int, value: int, w: float) -> np.ndarray:
    t = np.full((2,) * k, w, dtype=np.float64)
    t[(1 - value,) * k] = 0.0  # no variable takes ``value``: the term is 0
    return t


def eliminate(unary, any1, any0, max_width: int = 12) -> list[int] | None:
    """Minimizing assignment of the local energy, or None if it is too wide to eliminate."""
    n = len(unary)
    scopes: list[tuple[int, ...]] = []
    tables: list[np.ndarray] = []
    n_vars = n

    def add(scope: tuple[int, ...], table: np.ndarray) -> None:
        scopes.append(scope)
        tables.append(table)

    for v, (c0, c1) in enumerate(unary):
        add((v,), np.array([c0, c1], dtype=np.float64))
    for value, terms in ((1, any1), (0, any0)):
        for w, vs in terms:
            vs = tuple(sorted(vs))
            if len(vs) <= _DIRECT:
                add(vs, _any_table(len(vs), value, w))
                continue
            z = n_vars  # z = 1: some variable in S takes ``value`` (the term is paid)
            n_vars += 1
            add((z,), np.array([0.0, w]))
            pair = np.zeros((2, 2))
            pair[value, 0] = _INF  # x_v == value forces z = 1
            for v in vs:
                add((v, z), pair)
    # factor index per variable, adjacency
    factors_of: list[set[int]] = [set() for _ in range(n_vars)]
    for f, scope in enumerate(scopes):
        for v in scope:
            factors_of[v].add(f)
    neighbours: list[set[int]] = [set() for _ in range(n_vars)]
    for scope in scopes:
        for a, b in itertools.permutations(scope, 2):
            neighbours[a].add(b)
    alive = [True] * len(scopes)
    heap = [(len(neighbours[v]), v) for v in range(n_vars)]
    heapq.heapify(heap)
    done = [False] * n_vars
    trail: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    while heap:
        deg, v = heapq.heappop(heap)
        if done[v] or deg != len(neighbours[v]):
            continue
        if deg > max_width:
            return None
        fs = [f for f in factors_of[v] if alive[f]]
        scope = tuple(sorted(set().union(*(scopes[f] for f in fs))))
        shape_of = {u: i for i, u in enumerate(scope)}
        total = np.zeros((2,) * len(scope))
        for f in fs:
            shape = [1] * len(scope)
            for u in scopes[f]:
                shape[shape_of[u]] = 2
            total = total + tables[f].reshape(shape)
            alive[f] = False
        axis = shape_of[v]
        trail.append((v, scope, total))
        rest = tuple(u for u in scope if u != v)
        done[v] = True
        new = len(scopes)
        scopes.append(rest)
        tables.append(total.min(axis=axis))
        alive.append(True)
        for u in rest:
            factors_of[u].difference_update(fs)
            factors_of[u].add(new)
            neighbours[u].discard(v)
            neighbours[u].update(w for w in rest if w != u)
            heapq.heappush(heap, (len(neighbours[u]), u))
    x = [0] * n_vars
    for v, scope, total in reversed(trail):
        index = tuple(slice(None) if u == v else x[u] for u in scope)
        x[v] = int(np.argmin(total[index]))
    return x[:n]
