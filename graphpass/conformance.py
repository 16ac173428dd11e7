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
from graphpass.check import verify as V
from graphpass.errors import BadModelError, GraphpassError

__all__ = ["CaseOutcome", "run_case", "run_light_model", "light_models"]


@dataclasses.dataclass
class CaseOutcome:
    name: str
    op: str
    #: pass | fail | crash | rejected, or (left out: onnxruntime cannot run the original model)
    #: ort-cannot-load | ort-fails-original | ort-mismatch
    status: str
    detail: str = ""


def ort_value(v):
    """A conformance case's input or expected output in the form onnxruntime's Python API takes:
    numpy scalars as 0-d arrays, TensorProtos as arrays, sequences as lists of arrays, None kept
    (an absent optional)."""
    if v is None:
        return None
    if isinstance(v, onnx.TensorProto):
        return onnx.numpy_helper.to_array(v)
    if isinstance(v, (list, tuple)):
        return [ort_value(x) for x in v]
    return np.asarray(v)


def _matches(expected, got, rtol: float, atol: float) -> str:
    expected = [ort_value(e) for e in expected]
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
        if e.dtype != g.dtype and e.dtype.itemsize == g.dtype.itemsize and g.dtype == np.uint8 \
                and e.dtype.type.__module__.startswith("ml_dtypes"):
            g = g.view(e.dtype)  # onnxruntime hands float8 outputs back as their raw bytes
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
    feeds = {n: ort_value(v) for n, v in zip(names, inputs)}
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
            return CaseOutcome(case.name, op, "ort-mismatch", "onnxruntime does not reproduce the expected outputs")
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


def light_models() -> list[str]:
    """Paths of the model-zoo architectures onnx ships (``onnx/backend/test/data/light``)."""
    from pathlib import Path

    folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return sorted(str(p) for p in folder.glob("light_*.onnx"))


def _dummy_input(vi: onnx.ValueInfoProto) -> np.ndarray:
    """The input onnx's backend test runner feeds a light model: arange(n) / n (runner.generate_dummy_data)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def run_light_model(path: str, pipeline: str | None = None, rtol: float = 1e-3, atol: float = 1e-5) -> CaseOutcome:
    """A light model against the expected output shipped beside it, before and after optimizing."""
    from pathlib import Path

    name = Path(path).stem
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    inputs = [_dummy_input(vi) for vi in model.graph.input if vi.name not in inits]
    expected = []
    for i in range(len(model.graph.output)):
        pb = Path(path).with_name(f"{name}_output_{i}.pb")
        if not pb.exists():
            return CaseOutcome(name, "model", "ort-fails-original", f"no expected output {pb.name}")
        t = onnx.TensorProto()
        t.ParseFromString(pb.read_bytes())
        expected.append(onnx.numpy_helper.to_array(t))
    try:
        got = _run(model, inputs)
    except Exception as e:  # noqa: BLE001
        return CaseOutcome(name, "model", "ort-fails-original", str(e).splitlines()[0] if str(e) else "")
    if _matches(expected, got, rtol, atol):
        return CaseOutcome(name, "model", "ort-mismatch", "onnxruntime does not reproduce the expected outputs")
    try:
        result = gp.optimize(model, pipeline=pipeline)
        forms = [gp.to_proto(result.graph), gp.to_proto(result.graph, emit="portable")]
    except GraphpassError as e:
        return CaseOutcome(name, "model", "crash", str(e))
    except Exception as e:  # noqa: BLE001
        return CaseOutcome(name, "model", "crash", f"{type(e).__name__}: {e}")
    for form, optimized in zip(("device", "portable"), forms):
        try:
            got2 = _run(optimized, inputs)
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(name, "model", "fail", f"{form} form does not run: {str(e).splitlines()[0]}")
        diff = _matches(expected, got2, rtol, atol)
        if diff:
            return CaseOutcome(name, "model", "fail", f"{form} form: {diff}")
    return CaseOutcome(name, "model", "pass")
