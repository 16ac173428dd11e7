"""elimination.eliminate on flat Python tables returns exactly what the numpy version of
graphpass 63e5a37 returned (kept below as the reference): the same assignment on random
energies with ties, wide terms (auxiliary variables, infinite penalties), NaN and zero costs,
and the layout energies of real graphs."""

import heapq
import itertools
import random

import numpy as np
import pytest

import graphpass as gp
from graphpass.cost_model import create
from graphpass.passes.layout import elimination, solver
from graphpass.passes.layout.plan import LayoutPlan

_DIRECT = 4
_INF = np.inf


def _any_table(k: int, value: int, w: float) -> np.ndarray:
    t = np.full((2,) * k, w, dtype=np.float64)
    t[(1 - value,) * k] = 0.0  # no variable takes ``value``: the term is 0
    return t


def reference_eliminate(unary, any1, any0, max_width: int = 12) -> list[int] | None:
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


def _random_terms(rng: random.Random, n: int, ties: bool, wide: int, nan: bool = False):
    def cost(hi):
        if nan and rng.random() < 0.05:
            return float("nan")
        if ties == "decimal":  # sums whose rounding depends on their order (0.1 + 0.2 != 0.3)
            return rng.choice((0.1, 0.2, 0.3, 0.6, 0.7, 1.0))
        return float(rng.randint(0, 3)) if ties else rng.uniform(0, hi)

    unary = [[cost(5), cost(5)] for _ in range(n)]
    any1, any0 = [], []
    for _ in range(rng.randint(0, 3 * n)):
        k = rng.randint(2, min(wide, n)) if n >= 2 else 1
        vs = tuple(sorted(rng.sample(range(n), k)))
        (any1 if rng.random() < 0.5 else any0).append((cost(10), vs))
    return unary, any1, any0


@pytest.mark.parametrize("ties", [False, True, "decimal"])
@pytest.mark.parametrize("wide", [3, 7])
def test_same_assignment_as_the_numpy_version(ties, wide):
    rng = random.Random(f"{ties}-{wide}")
    compared = 0
    for _ in range(300):
        n = rng.randint(1, 24)
        unary, any1, any0 = _random_terms(rng, n, ties, wide)
        for max_width in (2, 12):
            want = reference_eliminate(unary, any1, any0, max_width)
            got = elimination.eliminate(unary, any1, any0, max_width)
            assert got == want
            compared += want is not None
    assert compared > 200


def test_same_assignment_on_wide_steps(monkeypatch):
    """Dense energies: steps over 6 to 12 variables (the numpy path) and too wide ones (None)."""
    rng = random.Random(11)
    wide_steps = []
    real = elimination._sum_and_min_numpy

    def counted(*args):
        wide_steps.append(args[4])
        return real(*args)

    monkeypatch.setattr(elimination, "_sum_and_min_numpy", counted)
    outcomes = set()
    for _ in range(40):
        n = rng.randint(8, 16)
        unary, any1, any0 = _random_terms(rng, n, rng.random() < 0.5, 4)
        for max_width in (12, 7):
            want = reference_eliminate(unary, any1, any0, max_width)
            assert elimination.eliminate(unary, any1, any0, max_width) == want
            outcomes.add(want is None)
    assert outcomes == {True, False}
    assert max(wide_steps) >= 10 and min(wide_steps) == elimination._NUMPY_FROM


def test_same_assignment_with_nan_and_zero_costs():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(2, 20)
        unary, any1, any0 = _random_terms(rng, n, True, 6, nan=True)
        unary[0] = [0.0, 0.0]
        assert elimination.eliminate(unary, any1, any0) == reference_eliminate(unary, any1, any0)


def test_numpy_float_costs_are_taken_as_their_values():
    rng = random.Random(9)
    unary, any1, any0 = _random_terms(rng, 30, False, 5)
    as_np = [[np.float64(a), np.float64(b)] for a, b in unary]
    assert elimination.eliminate(as_np, any1, any0) == reference_eliminate(unary, any1, any0)


@pytest.mark.parametrize("name", ["resnet18.torchscript.onnx", "mobilenet_v3_small.dynamo.onnx",
                                  "efficientnet_b0.torchscript.onnx", "shufflenet_v2.dynamo.onnx",
                                  "lraspp_mobilenet_v3.dynamo.onnx"])
def test_same_assignment_on_real_layout_energies(name):
    """The whole layout energy of a real CNN (batch fixed to 1), every component in one call."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "exporters" / name
    graph = gp.load(path, dims={"batch": 1}).graph
    cm = create("ascend910a")
    energy = LayoutPlan(graph, cm.format_oracle(graph)).energy
    assert energy.n >= 25 and energy.any1 and energy.any0
    want = reference_eliminate(energy.unary, energy.any1, energy.any0, solver.MAX_WIDTH)
    assert want is not None
    assert elimination.eliminate(energy.unary, energy.any1, energy.any0, solver.MAX_WIDTH) == want
