"""The calibration table (data/calibration.toml) and the fit of the cost model against it.

Each row of the table is a published throughput (fps) of one network at one batch size on one
chip, with its source. :func:`evaluate` estimates every row with the cost model (batch fixed,
ATC's precision mode of the row, the row's chip) and gives estimated / published per row, in two
forms: NPU-only (the device time of one inference, what the published ``ais_bench`` throughput
measures) and end-to-end (plus the step's launch, copies and synchronisation).

The graphs are the stripped exports in ``benchmarks/data/calibration/`` (weights reduced to
their headers; the cost model reads a weight's shape, never its values), built by
``benchmarks/calibration_models.py``; a folder of full exports can be given instead.
"""

from __future__ import annotations

import dataclasses
import gzip
import statistics
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterable

import onnx
import onnx_graphsurgeon as gs

from graphpass.cost_model.profiles import DATA_DIR

__all__ = ["TABLE", "STRIPPED_DIR", "Row", "Result", "load_table", "kept_out", "load_graph", "evaluate", "fit", "summary",
           "excluded"]

TABLE = DATA_DIR / "calibration.toml"
STRIPPED_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "calibration"


@dataclasses.dataclass(frozen=True)
class Row:
    network: str
    kind: str
    input: tuple[int, ...]
    batch: int
    chip: str
    precision: str
    fps: float
    source: str  # repository:path@commit
    #: why the row is reported apart from the summaries and the fit (a documented anomaly of the
    #: published figure, with its evidence in the data file); "" for a judged row
    excluded: str = ""


@dataclasses.dataclass(frozen=True)
class Result:
    row: Row
    npu_us: float  # device time of one batch (NPU-only)
    e2e_us: float  # plus the step term (launch, copies, sync)
    kept_out: bool
    #: the kernels' (launch, cube, vector, memory) us and the rest of the NPU time, for :func:`fit`
    parts: tuple = ()
    #: symbolic dims the estimate had to assume (none once the shapes are proven)
    assumed_dims: tuple = ()

    @property
    def est_fps(self) -> float:
        return self.row.batch * 1e6 / self.npu_us

    @property
    def est_fps_e2e(self) -> float:
        return self.row.batch * 1e6 / self.e2e_us

    @property
    def ratio(self) -> float:
        """estimated / published fps, NPU-only against the published NPU-only figure."""
        return self.est_fps / self.row.fps


def _table(path: Path | None = None) -> dict[str, Any]:
    return tomllib.loads((path or TABLE).read_text(encoding="utf-8"))


def load_table(path: Path | None = None) -> list[Row]:
    data = _table(path)
    return [Row(r["network"], r["kind"], tuple(r["input"]), r["batch"], r["chip"], r["precision"], float(r["fps"]),
                f"{r['repository']}:{r['path']}@{r['commit']}", str(r.get("excluded", ""))) for r in data["row"]]


def kept_out(path: Path | None = None) -> frozenset[str]:
    """The networks kept out of every fit (a fixed third of the table, listed in its [meta])."""
    return frozenset(_table(path)["meta"]["kept_out"])


def load_graph(network: str, shape: Iterable[int], models: Path | None = None) -> gs.Graph:
    """The network's graph with its input fixed to ``shape`` and shapes inferred."""
    from graphpass.ir.inference import _copy_value_info, apply_input_shapes, infer_shapes

    if models is not None and (models / f"{network}.onnx").is_file():
        proto = onnx.load(str(models / f"{network}.onnx"))
    else:
        proto = onnx.load_from_string(gzip.decompress((STRIPPED_DIR / f"{network}.onnx.gz").read_bytes()))
    apply_input_shapes(proto, {proto.graph.input[0].name: list(shape)})
    for o in proto.graph.output:  # the declared batch dim of the output is stale once the input is fixed
        o.type.tensor_type.ClearField("shape")
    del proto.graph.value_info[:]  # so is the exporter's value_info, traced at another batch: infer anew
    _copy_value_info(infer_shapes(proto).graph, proto.graph)  # the inferred copy lists weights as inputs
    return gs.import_onnx(proto)


def evaluate(target: Any = "ascend310p3", rows: list[Row] | None = None, models: Path | None = None,
             prepare: Callable[[gs.Graph], gs.Graph] | None = None, **estimate_options: Any) -> list[Result]:
    """Estimate every row of the table whose chip is ``target``'s.

    ``prepare``: what turns the loaded graph into the graph estimated; the benchmark and the
    tests give ``graphpass.passes.shape_proof``'s proof (the shapes ATC proves when it compiles:
    the exporter's shape arithmetic folded, every ``unk__N`` dim sized), as ``graphpass cost`` does.
    It lives in the passes layer, above this one, hence a parameter."""
    from graphpass.cost_model.target import get_target

    tgt = get_target(target)
    rows = load_table() if rows is None else rows
    out = kept_out()
    results = []
    for row in rows:
        if row.chip != tgt.name:
            continue
        if models is None and not (STRIPPED_DIR / f"{row.network}.onnx.gz").is_file():
            continue  # not built (benchmarks/calibration_models.py)
        graph = load_graph(row.network, row.input, models)
        if prepare is not None:
            graph = prepare(graph)
        report = tgt.estimate(graph, precision_mode=row.precision, **estimate_options)
        step = report.breakdown_us.get("step", 0.0)
        npu = report.total_us - step
        kernels = [(n["launch_us"], n["cube_us"], n["vector_us"], n["memory_us"]) for n in report.nodes
                   if n.get("engine") == "AICORE" and n.get("us", 0.0) > 0.0 and n.get("bound") in ("cube", "vector", "memory", "launch")]
        rest = npu - sum(max(c, v, m) + lu for lu, c, v, m in kernels)
        results.append(Result(row, npu, report.total_us, row.network in out, (tuple(kernels), rest),
                              tuple(report.assumed_dims)))
    return results


def fit(results: list[Result], efficiencies=None, launches=None) -> tuple[float, float, float]:
    """(cube_efficiency, kernel_launch_us, score) that minimise the mean squared log ratio over
    the CNN rows of the networks *not* kept out, re-pricing each kernel as
    launch + max(cube * e0 / e, vector, memory) (e0: the efficiency the results were made with)."""
    import math

    rows = [r for r in results if not r.kept_out and r.row.kind == "cnn" and not r.row.excluded]
    from graphpass.cost_model.target import get_target

    e0 = get_target(rows[0].row.chip).cost_model.pv.cube_efficiency if rows else 1.0
    best = (e0, 0.0, float("inf"))
    for e in efficiencies or [x / 100 for x in range(30, 101, 5)]:
        for lu in launches or [x / 2 for x in range(2, 41)]:
            score = 0.0
            for r in rows:
                kernels, rest = r.parts
                t = rest + sum(lu + max(c * e0 / e, v, m) for _, c, v, m in kernels)
                score += math.log(r.row.batch * 1e6 / t / r.row.fps) ** 2
            score /= max(1, len(rows))
            if score < best[2]:
                best = (e, lu, score)
    return best


def excluded(results: list[Result]) -> list[Result]:
    """The rows the data file marks ``excluded`` (a documented anomaly of the published figure):
    estimated and printed, never in a summary or the fit."""
    return [r for r in results if r.row.excluded]


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def summary(results: list[Result]) -> dict[str, Any]:
    """median, interquartile range, worst ratio (farthest from 1, either way) and rows off by 2x+,
    over the rows not ``excluded`` (those are reported apart, see :func:`excluded`)."""
    results = [r for r in results if not r.row.excluded]
    if not results:
        return {"rows": 0}
    ratios = [r.ratio for r in results]
    lo, med, hi = _quartiles(ratios)
    worst = max(results, key=lambda r: max(r.ratio, 1 / r.ratio))
    return {"rows": len(results), "networks": len({r.row.network for r in results}), "median": med,
            "q1": lo, "q3": hi, "worst": worst.ratio, "worst_row": f"{worst.row.network} b{worst.row.batch}",
            "off_2x": sum(1 for x in ratios if x > 2 or x < 0.5), "min": min(ratios), "max": max(ratios)}
