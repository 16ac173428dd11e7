"""DBNet's training graph head + loss, with the OHEM top-k the way the DB reference writes it (seed 000).

DB_ResNet on Ascend: the balanced BCE loss keeps the 3k hardest negatives with ``topk`` where
k = min(#negatives, 3 * #positives) is computed from the batch, a data-dependent shape the NPU
could not compile; the fix was sort + mask. This builds a DB head (probability and threshold
maps from a small backbone, upsampled by deconvolutions, and the differentiable binarization
1 / (1 + exp(-50 (P - T)))) with the three DB losses (balanced BCE with OHEM on P, masked L1 on
T, dice on the binary map), then lowers the runtime-k TopK and compares: it exits 1 if the loss moves beyond float rounding.

    python examples/dbnet_loss.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _builder import Builder, float_input  # noqa: E402

SIZE = 32
RTOL, ATOL = 1e-5, 1e-6  # lower_dynamic_topk and the BN folds: float rounding from the summation order only


def build(seed: int = 0) -> onnx.ModelProto:
    b = Builder(opset=13, seed=seed)
    c = lambda v: b.const(np.array(v, np.float32))  # noqa: E731
    f = b.conv_bn("image", 3, 16, 3, 2, 1, name="backbone.0")
    f = b.conv_bn(f, 16, 32, 3, 2, 1, name="backbone.1")  # stride 4

    def head(name: str) -> str:  # conv3x3-BN-ReLU, deconv x2 (-> input size), sigmoid
        h = b.conv_bn(f, 32, 8, 3, 1, 1, name=f"{name}.conv")
        w1 = (b.rng.standard_normal((8, 8, 2, 2)) * 0.3).astype(np.float32)
        h = b.op("ConvTranspose", [h, b.const(w1, f"{name}.up1_w")], name=f"{name}.up1", strides=[2, 2])
        h = b.op("Relu", [h], name=f"{name}.up1_relu")
        w2 = (b.rng.standard_normal((8, 1, 2, 2)) * 0.3).astype(np.float32)
        h = b.op("ConvTranspose", [h, b.const(w2, f"{name}.up2_w")], name=f"{name}.up2", strides=[2, 2])
        return b.op("Sigmoid", [h], name=f"{name}.sigmoid")

    prob, thresh = head("prob"), head("thresh")
    binary = b.op("Reciprocal", [b.op("Add", [c(1.0), b.op("Exp", [b.op("Mul", [c(-50.0), b.op("Sub", [prob, thresh])])])])],
                  name="binarize")

    # balanced BCE with OHEM (DB reference: BalanceCrossEntropyLoss, negative_ratio = 3)
    positive = b.op("Mul", ["gt", "mask"], name="positive")
    negative = b.op("Mul", [b.op("Sub", [c(1.0), "gt"]), "mask"], name="negative")
    pos_count = b.op("ReduceSum", [positive], name="positive_count", keepdims=0)
    neg_all = b.op("ReduceSum", [negative], name="negative_all", keepdims=0)
    neg_count = b.op("Min", [neg_all, b.op("Mul", [pos_count, c(3.0)])], name="negative_count")
    eps = c(1e-6)
    bce = b.op("Neg", [b.op("Add", [b.op("Mul", ["gt", b.op("Log", [b.op("Add", [prob, eps])])]),
                                    b.op("Mul", [b.op("Sub", [c(1.0), "gt"]),
                                                 b.op("Log", [b.op("Add", [b.op("Sub", [c(1.0), prob]), eps])])])])], name="bce")
    positive_loss = b.op("Mul", [bce, positive], name="positive_loss")
    negative_loss = b.op("Reshape", [b.op("Mul", [bce, negative]), b.const(np.array([-1], np.int64))], name="negative_flat")
    k = b.op("Reshape", [b.op("Cast", [neg_count], to=TensorProto.INT64), b.const(np.array([1], np.int64))], name="k")
    hardest, _ = b.op("TopK", [negative_loss, k], n_out=2, name="ohem_topk")
    balance = b.op("Div", [b.op("Add", [b.op("ReduceSum", [positive_loss], keepdims=0), b.op("ReduceSum", [hardest], keepdims=0)]),
                           b.op("Add", [b.op("Add", [pos_count, neg_count]), eps])], name="bce_loss")
    # L1 on the threshold map inside its mask, dice on the binary map
    l1 = b.op("Div", [b.op("ReduceSum", [b.op("Mul", [b.op("Abs", [b.op("Sub", [thresh, "thresh_map"])]), "thresh_mask"])], keepdims=0),
                      b.op("Add", [b.op("ReduceSum", ["thresh_mask"], keepdims=0), eps])], name="l1_loss")
    inter = b.op("ReduceSum", [b.op("Mul", [b.op("Mul", [binary, "gt"]), "mask"])], keepdims=0, name="dice_inter")
    union = b.op("Add", [b.op("Add", [b.op("ReduceSum", [b.op("Mul", [binary, "mask"])], keepdims=0),
                                      b.op("ReduceSum", [b.op("Mul", ["gt", "mask"])], keepdims=0)]), eps], name="dice_union")
    dice = b.op("Sub", [c(1.0), b.op("Div", [b.op("Mul", [c(2.0), inter]), union])], name="dice_loss")
    loss = b.op("Add", [b.op("Add", [balance, b.op("Mul", [c(10.0), l1])]), dice], name="loss")
    maps = [float_input(n, [1, 1, SIZE, SIZE]) for n in ("gt", "mask", "thresh_map", "thresh_mask")]
    return b.model([float_input("image", [1, 3, SIZE, SIZE])] + maps,
                   [helper.make_tensor_value_info(loss, TensorProto.FLOAT, [])], "dbnet_loss")


def batches(n: int = 20, seed: int = 0):
    """Inputs with every kind of positive count: none, all, and random shares."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        share = 0.0 if i == 0 else 1.0 if i == 1 else rng.uniform(0.01, 0.6)
        gt = (rng.uniform(size=(1, 1, SIZE, SIZE)) < share).astype(np.float32)
        yield {"image": rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32), "gt": gt,
               "mask": (rng.uniform(size=(1, 1, SIZE, SIZE)) < 0.95).astype(np.float32),
               "thresh_map": rng.uniform(0.3, 0.7, (1, 1, SIZE, SIZE)).astype(np.float32),
               "thresh_mask": (rng.uniform(size=(1, 1, SIZE, SIZE)) < 0.5).astype(np.float32)}


def main() -> int:
    import graphpass as gp
    from graphpass.check import verify as V
    from graphpass.cost_model import create

    model = build()
    cm = create()
    before = cm.estimate(gp.load(model))
    result = gp.optimize(model)
    after = cm.estimate(result.graph)
    print(f"dynamic regions: {len(before.dynamic_regions)} before ({', '.join(r['reason'] for r in before.dynamic_regions)}), "
          f"{len(after.dynamic_regions)} after")
    print(f"estimate (cost model): {before.total_us:,.0f} us -> {after.total_us:,.0f} us")
    sa, sb = V.session(model), V.session(gp.to_proto(result.graph))
    worst, failures = 0.0, []
    for i, feeds in enumerate(batches()):
        a, b2 = V.run(sa, feeds), V.run(sb, feeds)
        for c in V.compare(a, b2, rtol=RTOL, atol=ATOL):
            worst = max(worst, c.max_rel)
            if not c.ok:
                failures.append(f"batch {i}, {c.name}: {c.note or f'relative difference {c.max_rel:.2g}'}")
    print(f"loss before vs after on 20 batches (0 positives, all positives, random): worst relative difference {worst:.2g}"
          f" (allowed: rtol {RTOL:g}, atol {ATOL:g}, the summation-order tolerance)")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
