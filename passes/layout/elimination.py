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

Tables are flat Python lists of floats (index bits in scope order, the first variable the most
significant, as numpy's C order): nearly every table of a layout energy has one to three
variables, where a list and Python floats cost a fraction of a small numpy array's overhead;
steps over one or two variables (nearly all) are written out.
Each entry is summed in the same order as before (``0.0 + t_f1 + t_f2 + ...`` over a
variable's factors in the same set order) and minimized and argmin'ed with numpy's rules (NaN
wins a minimum; argmin takes the first minimum), so the assignment is bit for bit the one the
numpy version returned (tests/passes/test_layout_elimination.py compares them).
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

__all__ = ["eliminate"]

_DIRECT = 4
#: Tables over this many variables or more are summed and minimized in numpy (a list of 2^k
#: Python floats costs more there); the same elementwise operations, the same values.
_NUMPY_FROM = 6
_INF = float("inf")


def _any_table(k: int, value: int, w: float) -> list[float]:
    t = [w] * (1 << k)
    t[0 if value == 1 else (1 << k) - 1] = 0.0  # no variable takes ``value``: the term is 0
    return t


_PROJ: dict[tuple[int, tuple[int, ...]], list[int]] = {}


def _projection(k: int, positions: tuple[int, ...]) -> list[int]:
    """For each index of a table over ``k`` variables, the index into a factor over the
    variables at ``positions`` (ascending) of that scope."""
    key = (k, positions)
    hit = _PROJ.get(key)
    if hit is None:
        shifts = [k - 1 - p for p in positions]
        hit = []
        for i in range(1 << k):
            j = 0
            for s in shifts:
                j = (j << 1) | ((i >> s) & 1)
            hit.append(j)
        _PROJ[key] = hit
    return hit


def _min(a: float, b: float) -> float:
    """numpy's minimum of two floats: a NaN wins (the first one)."""
    if a <= b:
        return a
    if b < a:
        return b
    return a if a != a else b


def _argmin(a: float, b: float) -> int:
    """numpy's argmin of [a, b]: the first minimum, or the first NaN."""
    if a != a:
        return 0
    if b != b:
        return 1
    return 1 if b < a else 0


def _sum_and_min_numpy(fs, scopes, tables, shape_of, k, axis) -> tuple[list[float], list[float]]:
    """A wide step in numpy: the factors summed in order, then the minimum over ``axis``; both
    as flat lists (C order, as the lists of the narrow steps)."""
    total = np.zeros((2,) * k)
    for f in fs:
        shape = [1] * k
        for u in scopes[f]:
            shape[shape_of[u]] = 2
        total = total + np.asarray(tables[f], dtype=np.float64).reshape(shape)
    return total.ravel().tolist(), total.min(axis=axis).ravel().tolist()


def eliminate(unary, any1, any0, max_width: int = 12) -> list[int] | None:
    """Minimizing assignment of the local energy, or None if it is too wide to eliminate."""
    n = len(unary)
    scopes: list[tuple[int, ...]] = []
    tables: list[list[float]] = []
    n_vars = n

    # each factor goes into the factor sets of its variables as it is made: every set gets its
    # factors in increasing number (the order the sets iterate in depends on it)
    scopes.extend([(v,) for v in range(n)])
    tables.extend([[float(c0), float(c1)] for c0, c1 in unary])
    factors_of: list[set[int]] = [{v} for v in range(n)]
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for value, terms in ((1, any1), (0, any0)):
        for w, vs in terms:
            w = float(w)
            if len(vs) == 2:  # most terms (a tensor read by one other variable): _any_table(2, ...) written out
                a, b = vs
                if b < a:
                    a, b = b, a
                f = len(scopes)
                scopes.append((a, b))
                tables.append([0.0, w, w, w] if value == 1 else [w, w, w, 0.0])
                factors_of[a].add(f)
                factors_of[b].add(f)
                neighbours[a].add(b)
                neighbours[b].add(a)
                continue
            vs = tuple(sorted(vs))
            if len(vs) <= _DIRECT:
                f = len(scopes)
                scopes.append(vs)
                tables.append(_any_table(len(vs), value, w))
                for u in vs:
                    factors_of[u].add(f)
                if len(vs) > 1:
                    for a, b in itertools.permutations(vs, 2):
                        neighbours[a].add(b)
                continue
            z = n_vars  # z = 1: some variable in S takes ``value`` (the term is paid)
            n_vars += 1
            factors_of.append({len(scopes)})
            neighbours.append(set())
            scopes.append((z,))
            tables.append([0.0, w])
            pair = [0.0, 0.0, 0.0, 0.0]
            pair[value * 2] = _INF  # x_v == value forces z = 1
            for v in vs:
                f = len(scopes)
                scopes.append((v, z))
                tables.append(pair)
                factors_of[v].add(f)
                factors_of[z].add(f)
                neighbours[v].add(z)
                neighbours[z].add(v)
    # the factors of a variable not yet eliminated are all alive (eliminating v replaces every
    # factor over v by one over the rest, in the factor sets of the rest), and its scope is
    # itself and its neighbours
    heap = [(len(neighbours[v]), v) for v in range(n_vars)]
    heapq.heapify(heap)
    done = [False] * n_vars
    trail: list[tuple[int, tuple[int, ...], list[float]]] = []
    heappop, heappush = heapq.heappop, heapq.heappush
    while heap:
        deg, v = heappop(heap)
        if done[v] or deg != len(neighbours[v]):
            continue
        if deg > max_width:
            return None
        fs = list(factors_of[v])  # the set's order: the order the factors are summed in
        if deg == 0:
            scope = (v,)
            t0 = t1 = 0.0
            for f in fs:
                t = tables[f]
                t0 += t[0]
                t1 += t[1]
            total = [t0, t1]
            reduced = [_min(t0, t1)]
        elif deg == 1:
            (u,) = neighbours[v]
            scope = (v, u) if v < u else (u, v)
            a = scope[0]
            t0 = t1 = t2 = t3 = 0.0
            for f in fs:
                t = tables[f]
                sf = scopes[f]
                if len(sf) == 2:
                    t0 += t[0]
                    t1 += t[1]
                    t2 += t[2]
                    t3 += t[3]
                elif sf[0] == a:  # over the first variable: index bit 1
                    t0 += t[0]
                    t1 += t[0]
                    t2 += t[1]
                    t3 += t[1]
                else:
                    t0 += t[0]
                    t1 += t[1]
                    t2 += t[0]
                    t3 += t[1]
            total = [t0, t1, t2, t3]
            reduced = [_min(t0, t2), _min(t1, t3)] if v == a else [_min(t0, t1), _min(t2, t3)]
        else:
            scope = tuple(sorted(neighbours[v] | {v}))
            k = len(scope)
            shape_of = {u: i for i, u in enumerate(scope)}
            axis = shape_of[v]
            if k >= _NUMPY_FROM:
                total, reduced = _sum_and_min_numpy(fs, scopes, tables, shape_of, k, axis)
            else:
                # the sum of the factors, entry by entry in the order numpy added the arrays
                total = [0.0] * (1 << k)
                for f in fs:
                    t = tables[f]
                    sf = scopes[f]
                    if sf == scope:
                        total = [a + b for a, b in zip(total, t)]
                    else:
                        proj = _projection(k, tuple([shape_of[u] for u in sf]))
                        total = [a + t[j] for a, j in zip(total, proj)]
                # minimum over v: v's bit is bit (k - 1 - axis) of an index of ``total``
                bit = 1 << (k - 1 - axis)
                low = bit - 1
                reduced = []
                for r in range(1 << (k - 1)):
                    i0 = ((r & ~low) << 1) | (r & low)
                    reduced.append(_min(total[i0], total[i0 | bit]))
        trail.append((v, scope, total))
        done[v] = True
        new = len(scopes)  # factors keep their numbers (the sets' order depends on them)
        if deg == 0:
            scopes.append(())  # a constant nobody reads
            tables.append(reduced)
            continue
        rest = (u,) if deg == 1 and u != v else tuple([w for w in scope if w != v])  # (deg 1: its one neighbour)
        scopes.append(rest)
        tables.append(reduced)
        for u in rest:
            fu = factors_of[u]
            fu.difference_update(fs)
            fu.add(new)
            nu = neighbours[u]
            nu.discard(v)
            if deg > 1:
                nu.update([w for w in rest if w != u])
            heappush(heap, (len(nu), u))
    x = [0] * n_vars
    for v, scope, total in reversed(trail):
        k = len(scope)
        i0 = 0
        bit = 0
        for p, u in enumerate(scope):
            if u == v:
                bit = 1 << (k - 1 - p)
            elif x[u]:
                i0 |= 1 << (k - 1 - p)
        x[v] = _argmin(total[i0], total[i0 | bit])
    return x[:n]
