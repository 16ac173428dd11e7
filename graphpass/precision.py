"""fp16 range analysis: which tensors overflow or underflow fp16, and what to keep in fp32.

onnxruntime runs the model in fp32 with every intermediate exposed (seed 000: DB_ResNet's values
after log(1+x) fell below fp16's range and were flushed to zero; seed 003: find the first
NaN/Inf). Per float32 tensor: max |x|, how many values overflow fp16 (> 65504), and the share of
nonzero values below fp16's smallest normal (6.1e-5, precision loss) and below half its smallest
subnormal (2^-25 ~ 3e-8, flushed to zero). A tensor is risky when anything overflows or more
than ``underflow_share`` of its nonzero values would flush to zero. The recommendation keeps
the producer of a risky tensor and its consumers in fp32 (``mixed_precision --keep-fp32 auto``)
and, for training, names the power-of-two loss scale that would lift the small values into
fp16's normal range without overflowing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
import onnx

from graphpass import verify as V

__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "FP16_FLUSH", "TensorRange", "PrecisionReport", "analyze"]

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14  # 6.1e-5
FP16_FLUSH = 2.0 ** -25  # below half the smallest subnormal (2^-24) a value rounds to 0


@dataclasses.dataclass
class TensorRange:
    name: str
    producer: str
    op: str
    max_abs: float
    overflow: int
    subnormal_share: float
    flush_share: float
    risky: bool
    advice: str = ""


@dataclasses.dataclass
class PrecisionReport:
    tensors: list[TensorRange]
    keep_fp32: list[str]
    loss_scale: float | None

    @property
    def risky(self) -> list[TensorRange]:
        return [t for t in self.tensors if t.risky]

    def to_dict(self) -> dict:
        return {"schema": "graphpass.precision_report/1", "keep_fp32": self.keep_fp32, "loss_scale": self.loss_scale,
                "risky": [dataclasses.asdict(t) for t in self.risky], "tensors": len(self.tensors)}


def _range(name: str, producer: str, op: str, v: np.ndarray, underflow_share: float) -> TensorRange:
    a = np.abs(v.astype(np.float64)).ravel()
    finite = a[np.isfinite(a)]
    nz = finite[finite > 0]
    overflow = int(np.count_nonzero(finite > FP16_MAX)) + int(np.count_nonzero(~np.isfinite(a)))
    sub = float(np.mean(nz < FP16_MIN_NORMAL)) if nz.size else 0.0
    flush = float(np.mean(nz < FP16_FLUSH)) if nz.size else 0.0
    risky = overflow > 0 or flush > underflow_share or sub > 0.5
    advice = ""
    if overflow:
        advice = f"{overflow} values exceed fp16's 65504: keep {op} '{producer}' and its consumers in fp32"
    elif flush > underflow_share:
        advice = f"{100 * flush:.0f}% of nonzero values flush to zero in fp16: keep {op} '{producer}' and its consumers in fp32"
    elif sub > 0.5:
        advice = (f"{100 * sub:.0f}% of nonzero values are fp16 subnormals (lost in sums like 1 + x): "
                  f"keep {op} '{producer}' and its consumers in fp32")
    return TensorRange(name, producer, op, float(finite.max()) if finite.size else float("inf"), overflow, sub, flush, risky, advice)


def analyze(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0,
            input_shapes: Mapping[str, Sequence[int]] | None = None, underflow_share: float = 0.01) -> PrecisionReport:
    """Run ``model`` in fp32 with every intermediate exposed and judge each float32 tensor."""
    exposed, order = V._expose_all(model)
    sess = V.session(exposed)
    if feeds is None:
        feeds = V.random_inputs(V.session(model), seed=seed, input_shapes=input_shapes)
    values = V.run(sess, feeds)
    producers = {o: (n.name or o, n.op_type) for n in model.graph.node for o in n.output}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name or (n.output[0] if n.output else "?"))
    tensors: list[TensorRange] = []
    keep: dict[str, None] = {}
    smallest, largest = math.inf, 0.0
    for name in order:
        v = values.get(name)
        if v is None or np.asarray(v).dtype != np.float32:
            continue
        producer, op = producers.get(name, (name, "?"))
        r = _range(name, producer, op, np.asarray(v), underflow_share)
        tensors.append(r)
        if r.risky:
            keep.setdefault(producer, None)
            for c in consumers.get(name, []):
                keep.setdefault(c, None)
        a = np.abs(np.asarray(v, np.float64))
        nz = a[(a > 0) & np.isfinite(a)]
        if nz.size:
            smallest = min(smallest, float(np.percentile(nz, 1)))
            largest = max(largest, float(nz.max()))
    scale = None
    if any(t.flush_share > underflow_share for t in tensors) and smallest < FP16_MIN_NORMAL:
        s = 2.0 ** math.ceil(math.log2(FP16_MIN_NORMAL / smallest))
        if largest * s < FP16_MAX:
            scale = s
    return PrecisionReport(tensors, list(keep), scale)
