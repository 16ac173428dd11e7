"""The shapes an estimate may rely on: proven on a copy, as ATC proves them when it compiles.

ATC compiles a graph for static shapes: it fixes every input dim, folds the exporter's shape
arithmetic (``Shape -> Gather -> Div -> Concat -> Reshape``) into constants and sizes every
tensor before any kernel is chosen. The cost model prices the graph it is given, so a graph
whose shapes are not all resolved (a symbolic batch, an ``unk__N`` dim onnx's inference could not
size) would be priced with every unknown dim taken as 1 *and* its shape arithmetic as runtime
work on the AI CPU with host crossings: 11.3 ms for ShuffleNetV2 from TorchScript against
0.9 ms for the same graph at batch 1 (issue 21).

:func:`prove_shapes` is the analysis-only step the estimating verbs run first (``graphpass
cost``, ``diff``'s cost columns, the calibration benchmark): on a copy of the graph, every input
dim the user left open is *assumed* (1, and said so), then ``specialize_shapes``,
``fold_constants`` (bounded to shape-sized values: weights are never evaluated) and
``simplify_shapes`` run, and the copy is what gets estimated. The model itself is never changed.
A graph whose inputs are all fixed and whose every shape is resolved needs none of it: it is
estimated as it is (:attr:`ShapeProof.proven` False), so the proof never changes what such a
graph costs.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir.shapes import count_unresolved, forget_given, given_shapes, record_given

__all__ = ["PROOF_PASSES", "ASSUMED_DIM", "SHAPE_FOLD_LIMIT", "ShapeProof", "prove_shapes", "annotate"]

log = logging.getLogger(__name__)

#: the passes of the proof, in their pipeline order
PROOF_PASSES = ("specialize_shapes", "fold_constants", "simplify_shapes")
#: the value an input dim the user left open is assumed to take (the estimate says so)
ASSUMED_DIM = 1
#: fold_constants' size_limit in the proof: values of this many bytes at most are computed (shape
#: vectors, scalars; an intermediate up to 64x), so a weight is never read or evaluated
SHAPE_FOLD_LIMIT = 1024


@dataclasses.dataclass
class ShapeProof:
    """What :func:`prove_shapes` gives the estimate.

    Attributes:
        graph: the graph to estimate: the one given when it needed no proof, else a proven copy.
        assumed: input dims the user left open and the proof took a value for (name -> value;
            an unnamed dim as ``input[k]``).
        proven: whether a copy was proven (False: the graph was already static and resolved).
        note: one line for the estimate's assumptions (empty when nothing was proven).
    """

    graph: gs.Graph
    assumed: dict[str, int] = dataclasses.field(default_factory=dict)
    proven: bool = False
    note: str = ""


def _open_dims(graph: gs.Graph) -> tuple[dict[str, int], dict[str, list[int]], dict[str, int]]:
    """(dims: symbol -> assumed value, input_shapes: input -> shape with -1 kept, assumed: what
    the report lists) for every input dim the user left open."""
    dims = {d: ASSUMED_DIM for t in graph.inputs for d in (t.shape or ()) if isinstance(d, str) and d}
    shapes: dict[str, list[int]] = {}
    assumed = dict(dims)
    for t in graph.inputs:
        if t.shape is None:
            continue  # an unknown rank cannot be specialized; the estimate says what it assumed
        unnamed = [k for k, d in enumerate(t.shape) if not (isinstance(d, (int, np.integer)) and d >= 0)
                   and not (isinstance(d, str) and d)]
        if unnamed:
            shapes[t.name] = [ASSUMED_DIM if k in unnamed else -1 for k in range(len(t.shape))]
            assumed.update({f"{t.name}[{k}]": ASSUMED_DIM for k in unnamed})
    return dims, shapes, assumed


def needs_proof(graph: gs.Graph) -> bool:
    """Whether some input dim is open or some tensor's shape is unresolved (linear, no export)."""
    open_inputs = any(t.shape is None or any(not (isinstance(d, (int, np.integer)) and d >= 0) for d in t.shape)
                      for t in graph.inputs)
    return open_inputs or count_unresolved(graph) > 0


def prove_shapes(graph: Any) -> ShapeProof:
    """The graph an estimate should price (see the module docstring); ``graph`` (a gs.Graph or
    anything :func:`graphpass.ir.model.as_model` takes) is not changed."""
    if not isinstance(graph, gs.Graph):
        from graphpass.ir.model import as_model

        graph = as_model(graph).graph
    if not needs_proof(graph):
        return ShapeProof(graph)
    from graphpass.ir.serialize import restore, snapshot
    from graphpass.passes.cleanup.fold_constants import FoldConstants
    from graphpass.passes.framework import PassContext, PassManager, get_pass

    dims, shapes, assumed = _open_dims(graph)
    given = given_shapes(graph)
    try:
        copy = restore(snapshot(graph))
        record_given(copy, given["inputs"], given["dims"])
        passes = [get_pass(n)() if n != "fold_constants" else FoldConstants(size_limit=SHAPE_FOLD_LIMIT)
                  for n in PROOF_PASSES]
        PassManager(passes, max_rounds=2)(copy, PassContext(input_shapes=shapes, dims=dims))
    except Exception as e:  # noqa: BLE001 - the proof is an analysis: the plain estimate still stands
        log.info("shape proof failed (%s: %s); estimating the graph as it is", type(e).__name__, e)
        return ShapeProof(graph, note=f"shapes could not be proven ({type(e).__name__}); estimated as loaded")
    forget_given(copy)  # the messages speak of what the user fixed; the assumed dims are listed apart
    record_given(copy, given["inputs"], given["dims"])
    how = ", ".join(f"{k}={v}" for k, v in assumed.items())
    note = ("shapes proven on a copy as ATC does for static shapes (" + " + ".join(PROOF_PASSES) + ")"
            + (f" with the open input dims assumed: {how}" if how else ""))
    return ShapeProof(copy, assumed, True, note)


def annotate(report: Any, proof: ShapeProof) -> Any:
    """``report`` (a CostReport of ``proof.graph``) with the proof's assumed dims first in its
    ``assumed_dims`` and its note and one line per assumed dim in its assumptions."""
    if not (proof.proven or proof.note) or getattr(report, "total_us", None) is None:
        return report
    report.assumed_dims = {**proof.assumed, **report.assumed_dims}
    lines = [f"symbolic dim '{k}' taken as {v} (fix it with --dim {k}=VALUE or --input-shape)" if "[" not in k
             else f"unknown dim {k} taken as {v} (fix it with --input-shape)" for k, v in proof.assumed.items()]
    report.assumptions = [*lines, proof.note, *report.assumptions]
    return report
