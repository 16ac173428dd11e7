"""ShuffleNetV2 (torchvision structure) as the TorchScript exporter writes it, then optimized.

The seed migration (seeds/002) ran this network on Ascend 910: channel_shuffle is
view -> transpose -> contiguous -> view, chunk is a Split, and with a dynamic batch the exporter
turns every ``x.size()`` into Shape -> Gather -> Unsqueeze -> Concat feeding the Reshape. Stage
widths for x1.0: 24 / 116 / 232 / 464 / 1024 (branch C = 58 / 116 / 232, not multiples of 16).

    python examples/shufflenet_v2.py                 # build x1.0, optimize, print the report
    python examples/shufflenet_v2.py --width 0.5 --classes 10 --save examples/models/shufflenet_v2_x0_5.onnx
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _builder import Builder, float_input  # noqa: E402

STAGE_OUT = {0.5: [24, 48, 96, 192, 1024], 1.0: [24, 116, 232, 464, 1024],
             1.5: [24, 176, 352, 704, 1024], 2.0: [24, 244, 488, 976, 2048]}
STAGE_REPEATS = [4, 8, 4]


def channel_shuffle(b: Builder, x: str, channels: int, groups: int = 2, name: str = "shuffle") -> str:
    """x.view(n, g, c/g, h, w).transpose(1, 2).contiguous().view(n, -1, h, w), dynamic batch."""
    shape = b.op("Shape", [x], name=f"{name}/shape")
    dims = {}
    for axis, label in ((0, "n"), (2, "h"), (3, "w")):
        g = b.op("Gather", [shape, b.const(axis, dtype="int64")], name=f"{name}/gather_{label}", axis=0)
        dims[label] = b.op("Unsqueeze", [g, b.const([0], dtype="int64")], name=f"{name}/unsqueeze_{label}")
    s1 = b.op("Concat", [dims["n"], b.const([groups], dtype="int64"), b.const([channels // groups], dtype="int64"),
                         dims["h"], dims["w"]], name=f"{name}/shape5", axis=0)
    y = b.op("Reshape", [x, s1], name=f"{name}/view")
    y = b.op("Transpose", [y], name=f"{name}/transpose", perm=[0, 2, 1, 3, 4])
    s2 = b.op("Concat", [dims["n"], b.const([-1], dtype="int64"), dims["h"], dims["w"]], name=f"{name}/shape4", axis=0)
    return b.op("Reshape", [y, s2], name=f"{name}/view2")


def inverted_residual(b: Builder, x: str, inp: int, oup: int, stride: int, name: str) -> str:
    bf = oup // 2
    if stride == 1:
        x1, x2 = b.op("Split", [x, b.const([bf, bf], dtype="int64")], n_out=2, name=f"{name}/chunk", axis=1)
        y = b.conv_bn(x2, bf, bf, 1, name=f"{name}/branch2.0")
        y = b.conv_bn(y, bf, bf, 3, 1, 1, groups=bf, relu=False, name=f"{name}/branch2.3")
        y = b.conv_bn(y, bf, bf, 1, name=f"{name}/branch2.5")
        out = b.op("Concat", [x1, y], name=f"{name}/cat", axis=1)
    else:
        y1 = b.conv_bn(x, inp, inp, 3, stride, 1, groups=inp, relu=False, name=f"{name}/branch1.0")
        y1 = b.conv_bn(y1, inp, bf, 1, name=f"{name}/branch1.2")
        y2 = b.conv_bn(x, inp, bf, 1, name=f"{name}/branch2.0")
        y2 = b.conv_bn(y2, bf, bf, 3, stride, 1, groups=bf, relu=False, name=f"{name}/branch2.3")
        y2 = b.conv_bn(y2, bf, bf, 1, name=f"{name}/branch2.5")
        out = b.op("Concat", [y1, y2], name=f"{name}/cat", axis=1)
    return channel_shuffle(b, out, oup, 2, name=f"{name}/shuffle")


def build(width: float = 1.0, num_classes: int = 1000, batch: str | int = "N", size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ShuffleNetV2 x``width`` with seeded weights; input 'input' [batch, 3, size, size]."""
    chans = STAGE_OUT[width]
    b = Builder(opset=13, seed=seed)
    x = b.conv_bn("input", 3, chans[0], 3, 2, 1, name="conv1")
    x = b.op("MaxPool", [x], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = chans[0]
    for s, (repeats, cout) in enumerate(zip(STAGE_REPEATS, chans[1:4]), start=2):
        for i in range(repeats):
            x = inverted_residual(b, x, cin, cout, 2 if i == 0 else 1, name=f"stage{s}.{i}")
            cin = cout
    x = b.conv_bn(x, cin, chans[4], 1, name="conv5")
    x = b.op("ReduceMean", [x], name="mean", axes=[2, 3], keepdims=0)
    logits = b.gemm(x, chans[4], num_classes, name="fc")
    out = b.op("Identity", [logits], name="logits")
    return b.model([float_input("input", [batch, 3, size, size])],
                   [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, num_classes])],
                   f"shufflenet_v2_x{str(width).replace('.', '_')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=float, default=1.0, choices=sorted(STAGE_OUT))
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--save", help="write the (unoptimized) model here and stop")
    args = ap.parse_args(argv)
    model = build(args.width, args.classes)
    if args.save:
        onnx.save(model, args.save)
        print(f"wrote {args.save} ({len(model.graph.node)} nodes)")
        return 0
    import graphpass as gp

    result = gp.optimize(model, input_shapes={"input": [1, 3, 224, 224]}, name=f"shufflenet_v2_x{args.width}")
    print(result.report.to_table(), end="")
    print()
    print(layout_comparison(model))
    return 0


def layout_comparison(model) -> str:
    """The same pipeline with GE's greedy first-input layout rule and with the optimal plan."""
    import graphpass as gp
    from graphpass.ir.device_ops import is_transdata

    rows = []
    for label, mode, disable in (("greedy (GE first-input rule)", "greedy", ["eliminate_transdata"]),
                                 ("greedy + eliminate_transdata", "greedy", []),
                                 ("optimal (min-cut)", "optimal", [])):
        r = gp.optimize(model, input_shapes={"input": [1, 3, 224, 224]}, options={"propagate_layout": {"mode": mode}},
                        disable=disable)
        cost = gp.cost_model.create(r.report.target).estimate(r.graph)
        n = sum(is_transdata(node) for node in r.graph.nodes)
        rows.append(f"| {label} | {n} | {cost.transdata['us']:,.1f} | {r.report.cost_after_us:,.1f} |")
    return "\n".join(["layout (estimates from the cost model, not measurements):",
                      "| layout | TransData | TransData est. us | total est. us |", "|---|---:|---:|---:|"] + rows)


if __name__ == "__main__":
    sys.exit(main())
