"""Numeric verification with onnxruntime (graph optimizations off, so ORT does not redo our work).

This module is the base that ``graphpass verify``/``bisect`` build on; the pass manager uses it
for ``--verify-each``. Inputs are generated per input dtype and shape from a seed; dynamic dims
take the value given in ``input_shapes`` or 1.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import onnx

from graphpass.errors import BadModelError

__all__ = ["OutputComparison", "session", "random_inputs", "run", "compare", "all_match"]


@dataclasses.dataclass
class OutputComparison:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    note: str = ""


def session(model: onnx.ModelProto | bytes | str):
    """An onnxruntime CPU session with every graph optimization disabled."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # errors come back as exceptions; no log spam on stderr
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(f"onnxruntime cannot run the model: {first}") from e


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


def random_inputs(
    sess, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Seeded inputs for every input of ``sess``: normal floats, small non-negative ints, bools."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in sess.get_inputs():
        given = (input_shapes or {}).get(inp.name)
        shape = list(given) if given is not None else [d if isinstance(d, int) and d >= 0 else 1 for d in inp.shape]
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise BadModelError(f"input '{inp.name}' has type {inp.type}, which graphpass cannot generate")
        if np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            arr = rng.integers(0, 4, size=shape).astype(dtype)
        feeds[inp.name] = arr
    return feeds


def run(sess, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(f"onnxruntime failed to run the model: {first}") from e
    return dict(zip(names, values))


def _compare_one(name: str, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    ref = np.asarray(ref)
    got = np.asarray(got)
    if ref.shape != got.shape:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"shape {got.shape} != {ref.shape}")
    if ref.dtype != got.dtype:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"dtype {got.dtype} != {ref.dtype}")
    if ref.size == 0:
        return OutputComparison(name, 0.0, 0.0, 1.0, True)
    if ref.dtype == object or not np.issubdtype(ref.dtype, np.number) and ref.dtype != np.bool_:
        same = bool(np.array_equal(ref, got))
        return OutputComparison(name, 0.0 if same else float("inf"), 0.0, 1.0 if same else 0.0, same)
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    if not np.array_equal(nan_r, nan_g):
        return OutputComparison(name, float("nan"), float("nan"), 0.0, False, "NaN positions differ")
    r = np.where(nan_r, 0.0, r)
    g = np.where(nan_g, 0.0, g)
    inf_same = np.array_equal(np.isinf(r), np.isinf(g)) and np.array_equal(r[np.isinf(r)], g[np.isinf(g)])
    finite = np.isfinite(r) & np.isfinite(g)
    diff = np.abs(r[finite] - g[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite]).max()) if diff.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    nr, ng = np.linalg.norm(r[finite]), np.linalg.norm(g[finite])
    cosine = float(np.dot(r[finite].ravel(), g[finite].ravel()) / (nr * ng)) if nr > 0 and ng > 0 else (1.0 if nr == ng else 0.0)
    ok = bool(inf_same and max_abs <= atol + rtol * scale)
    return OutputComparison(name, max_abs, max_rel, cosine, ok, "" if inf_same else "Inf positions differ")


def compare(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> list[OutputComparison]:
    """Per output of ``ref``: errors and whether ``max_abs <= atol + rtol * max|ref|``."""
    out = []
    for name, r in ref.items():
        if name not in got:
            out.append(OutputComparison(name, float("inf"), float("inf"), 0.0, False, "missing output"))
        else:
            out.append(_compare_one(name, r, got[name], rtol, atol))
    return out


def all_match(comparisons: Sequence[OutputComparison]) -> bool:
    return all(c.ok for c in comparisons)
