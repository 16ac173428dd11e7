"""DB_ResNet's fp16 underflow (seed 000), rebuilt: log(1 + x) of small positive values.

A DB-style head turns features into a probability map; the balanced-BCE style loss computes
``log(1 + p * eps)`` of tiny values and scales them up again. In fp16 the tiny values fall below
the smallest normal (6.1e-5) and ``1 + tiny`` rounds to 1, so the log is 0 and the scaled
result is lost: the run does not converge (the seed's symptom). graphpass precision finds the
tensors and the absorption of ``1 + tiny``, confirms each under emulated fp16 and checks that its
keep-list fixes it; mixed precision with that keep-list stays within tolerance, force_fp16 does not.

    python examples/dbnet_precision.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _builder import Builder, float_input  # noqa: E402


def build(seed: int = 0) -> onnx.ModelProto:
    b = Builder(opset=13, seed=seed)
    x = b.conv_bn("image", 3, 16, 3, 1, 1, name="stem")
    x = b.conv_bn(x, 16, 16, 3, 1, 1, name="neck")
    prob = b.op("Sigmoid", [b.conv(x, 16, 1, 1, bias=True, name="prob_head")], name="prob")
    tiny = b.op("Mul", [prob, b.const(np.array(2e-6, np.float32), "eps")], name="tiny")     # ~1e-6: fp16 subnormal
    log1p = b.op("Log", [b.op("Add", [tiny, b.const(np.array(1.0, np.float32), "one")], name="one_plus")], name="log1p")
    scaled = b.op("Mul", [log1p, b.const(np.array(1e4, np.float32), "gain")], name="rescale")   # back to ~1e-2
    thresh = b.op("Sigmoid", [b.conv(x, 16, 1, 1, bias=True, name="thresh_head")], name="thresh")
    out = b.op("Add", [scaled, thresh], name="score")
    return b.model([float_input("image", [1, 3, 32, 32])],
                   [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 1, 32, 32])], "dbnet_precision")


def main() -> int:
    import graphpass as gp
    from graphpass.check import precision as P
    from graphpass.check import verify as V

    model = build()
    report = P.analyze(model)
    print(f"precision: {len(report.risky)} risky of {len(report.tensors)} float32 tensors, {len(report.findings)} findings")
    for f in report.findings:
        print(f"  {f.hazard} [{f.kind}] {f.tensor}: {f.detail}")
        print(f"    emulated fp16: {'confirmed' if f.confirmed else 'not confirmed'} ({f.evidence}); "
              f"keep-list applied: {'fixed' if f.fixed else 'NOT fixed'}")
    print(f"  keep in fp32: {', '.join(report.keep_fp32)}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, keep in (("force_fp16", []), ("force_fp16 + keep-fp32 auto", report.keep_fp32)):
            # emulate: round every fp16 value, since onnxruntime's CPU kernels keep fp16 chains in fp32
            opts = {"mixed_precision": {"mode": "force_fp16", "keep_fp32": keep, "emulate": True}}
            result = gp.optimize(model, enable=["mixed_precision"], options=opts)
            path = Path(tmp) / "m.onnx"
            gp.save(result.graph, path)
            verdict = V.verify_models(model, onnx.load(path))  # fp16 defaults: elementwise rtol 1e-2, atol 1e-2
            c = verdict.outputs[0]
            print(f"{label:30s} max abs error {c.max_abs:.3g}  cosine {c.cosine:.5f}  {'ok' if verdict.ok else 'FAIL'} "
                  f"({verdict.tolerance})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
