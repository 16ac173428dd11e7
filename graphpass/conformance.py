"""Running ONNX node conformance cases through the optimizer (tests and benchmarks/conformance.py).

For each case: run the original model in onnxruntime and compare with the expected outputs;
only if onnxruntime reproduces them does the case count. Then optimize (the default pipeline)
and run again: the optimized model must reproduce them too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

import graphpass as gp
from graphpass import verify as V
from graphpass.errors import BadModelError, GraphpassError

__all__ = ["CaseOutcome", "run_case"]


@dataclasses.dataclass
class CaseOutcome:
    name: str
    op: str
    status: str  # pass | fail | crash | ort-cannot-load | ort-fails-original | rejected
    detail: str = ""


def _matches(expected, got, rtol: float, atol: float) -> str:
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, (list, tuple)) or isinstance(g, (list, tuple)):  # sequence outputs
            if not isinstance(e, (list, tuple)) or not isinstance(g, (list, tuple)) or len(e) != len(g):
                return f"output {i}: sequence length differs"
            inner = _matches(list(e), list(g), rtol, atol)
            if inner:
                return f"output {i}: {inner}"
            continue
        if e is None or g is None:  # optional outputs
            if (e is None) != (g is None):
                return f"output {i}: optional presence differs"
            continue
        e, g = np.asarray(e), np.asarray(g)
        if e.dtype == object or g.dtype == object:
            if not np.array_equal(e, g):
                return f"output {i} differs"
            continue
        if e.shape != g.shape:
            return f"output {i}: shape {g.shape} != {e.shape}"
        try:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError:
            return f"output {i} differs"
        except TypeError:
            if not np.array_equal(e, g):
                return f"output {i} differs"
    return ""


def _run(model: onnx.ModelProto, inputs):
    sess = V.session(model)
    names = [i.name for i in sess.get_inputs()]
    feeds = {n: v for n, v in zip(names, inputs)}
    return sess.run(None, feeds)


def run_case(case, pipeline: str | None = None, rtol: float | None = None, atol: float | None = None) -> CaseOutcome:
    model = case.model
    op = model.graph.node[0].op_type if model.graph.node else "?"
    rtol = case.rtol if rtol is None else rtol
    atol = case.atol if atol is None else atol
    if model.ir_version > 10:
        model.ir_version = 10  # onnxruntime refuses newer IR versions; the op semantics are unchanged
    for inputs, expected in case.data_sets or []:
        try:
            got = _run(model, inputs)
        except BadModelError as e:
            return CaseOutcome(case.name, op, "ort-cannot-load", str(e))
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "ort-fails-original", str(e).splitlines()[0] if str(e) else "")
        if _matches(expected, got, rtol, atol):
            return CaseOutcome(case.name, op, "ort-fails-original", "onnxruntime does not reproduce the expected outputs")
        try:
            result = gp.optimize(model, pipeline=pipeline)
            optimized = gp.to_proto(result.graph)
        except BadModelError as e:
            return CaseOutcome(case.name, op, "rejected", str(e))
        except GraphpassError as e:
            return CaseOutcome(case.name, op, "crash", str(e))
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "crash", f"{type(e).__name__}: {e}")
        try:
            got2 = _run(optimized, inputs)
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "fail", f"optimized model does not run: {str(e).splitlines()[0]}")
        diff = _matches(expected, got2, rtol, atol)
        if diff:
            return CaseOutcome(case.name, op, "fail", diff)
        return CaseOutcome(case.name, op, "pass")
    return CaseOutcome(case.name, op, "pass", "no data sets")
