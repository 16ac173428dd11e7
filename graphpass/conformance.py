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


def _expected(model: onnx.ModelProto, expected) -> dict:
    """A case's expected outputs by output name, in the form :func:`graphpass.verify.compare_arrays`
    takes; float8 values as their raw bytes (onnxruntime hands float8 outputs back as uint8)."""
    def form(e):
        e = ort_value(e)
        if isinstance(e, list):
            return [form(x) for x in e]
        if isinstance(e, np.ndarray) and e.dtype.type.__module__.startswith("ml_dtypes") and e.dtype.itemsize == 1:
            return e.view(np.uint8)
        return e

    return {o.name: form(e) for o, e in zip(model.graph.output, expected)}


def _matches(model: onnx.ModelProto, expected, got, feeds, rtol: float, atol: float) -> str:
    """'' when ``got`` (outputs, or a model to run on ``feeds``) reproduces the expected outputs of
    ``model``'s case, else what differs: :func:`graphpass.verify.check_outputs`, expected values
    as the reference (``|got - expected| <= atol + rtol * |expected|``, NaN/inf positions exact)."""
    if len(expected) != len(model.graph.output):
        return f"{len(model.graph.output)} outputs, expected {len(expected)}"
    checked = V.check_outputs(_expected(model, expected), got, feeds, V.Tolerance(rtol, atol, "the case's"),
                              fp16_emulate=False)
    bad = checked.failures
    return "" if not bad else f"output {bad[0].name} differs: {bad[0].note}"


def _run(model: onnx.ModelProto, inputs) -> tuple[dict, dict]:
    """(feeds, outputs by name) of ``model`` on a case's positional inputs."""
    sess = V.session(model)
    names = [i.name for i in sess.get_inputs()]
    feeds = {n: ort_value(v) for n, v in zip(names, inputs)}
    outs = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(outs, sess.run(None, feeds)))


def run_case(case, pipeline: str | None = None, rtol: float | None = None, atol: float | None = None) -> CaseOutcome:
    model = case.model
    op = model.graph.node[0].op_type if model.graph.node else "?"
    rtol = case.rtol if rtol is None else rtol
    atol = case.atol if atol is None else atol
    if model.ir_version > 10:
        model.ir_version = 10  # onnxruntime refuses newer IR versions; the op semantics are unchanged
    for inputs, expected in case.data_sets or []:
        try:
            feeds, got = _run(model, inputs)
        except BadModelError as e:
            return CaseOutcome(case.name, op, "ort-cannot-load", str(e))
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "ort-fails-original", str(e).splitlines()[0] if str(e) else "")
        if _matches(model, expected, got, feeds, rtol, atol):
            return CaseOutcome(case.name, op, "ort-mismatch", "onnxruntime does not reproduce the expected outputs")
        try:
            result = gp.optimize(model, pipeline=pipeline)
            optimized = gp.to_proto(result.graph, emit="device")
        except BadModelError as e:
            return CaseOutcome(case.name, op, "rejected", str(e))
        except GraphpassError as e:
            return CaseOutcome(case.name, op, "crash", str(e))
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "crash", f"{type(e).__name__}: {e}")
        try:
            diff = _matches(model, expected, optimized, feeds, rtol, atol)
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(case.name, op, "fail", f"optimized model does not run: {str(e).splitlines()[0]}")
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
        feeds, got = _run(model, inputs)
    except Exception as e:  # noqa: BLE001
        return CaseOutcome(name, "model", "ort-fails-original", str(e).splitlines()[0] if str(e) else "")
    if _matches(model, expected, got, feeds, rtol, atol):
        return CaseOutcome(name, "model", "ort-mismatch", "onnxruntime does not reproduce the expected outputs")
    try:
        result = gp.optimize(model, pipeline=pipeline)
        forms = [gp.to_proto(result.graph, emit="device"), gp.to_proto(result.graph, emit="portable")]
    except GraphpassError as e:
        return CaseOutcome(name, "model", "crash", str(e))
    except Exception as e:  # noqa: BLE001
        return CaseOutcome(name, "model", "crash", f"{type(e).__name__}: {e}")
    for form, optimized in zip(("device", "portable"), forms):
        try:
            diff = _matches(model, expected, optimized, feeds, rtol, atol)
        except Exception as e:  # noqa: BLE001
            return CaseOutcome(name, "model", "fail", f"{form} form does not run: {str(e).splitlines()[0]}")
        if diff:
            return CaseOutcome(name, "model", "fail", f"{form} form: {diff}")
    return CaseOutcome(name, "model", "pass")
