"""SiamMask's mask branch with ExtractImagePatches, and its lowering to a Conv (seed 000).

SiamMask's mask head takes, at every location of the depthwise cross-correlation of template
and search features, the surrounding patch of the response and turns it into a mask. The TF
port used ``tf.image.extract_image_patches``, which the NPU did not support: it ran as a host
py_func, 22 s per step in host-device traffic. This builds that branch (shared backbone,
depthwise cross-correlation with the template as runtime weights, a mask head over
ExtractImagePatches, placed on the host as the py_func was) and lowers the patch extraction
to a one-hot Conv on the Cube.

    python examples/siammask_patches.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _builder import Builder, float_input  # noqa: E402

C = 16
MASK = 5  # each location predicts a 5x5 mask


def build(seed: int = 0) -> onnx.ModelProto:
    b = Builder(opset=13, seed=seed)

    def backbone(x: str, name: str) -> str:  # two conv-BN-ReLU blocks, shared weights by seed
        y = b.conv_bn(x, 3, C, 3, 2, 1, name=f"{name}.0")
        return b.conv_bn(y, C, C, 3, 1, 1, name=f"{name}.1")

    z = backbone("template", "backbone_z")  # [1, C, 8, 8]
    x = backbone("search", "backbone_x")    # [1, C, 16, 16]
    # depthwise cross-correlation: the template features are the (runtime) weights
    kernel = b.op("Reshape", [z, b.const(np.array([C, 1, 8, 8], np.int64))], name="xcorr_kernel")
    resp = b.op("Conv", [x, kernel], name="xcorr", group=C, kernel_shape=[8, 8])  # [1, C, 9, 9]
    resp = b.conv_bn(resp, C, C, 1, name="mask_neck")
    nhwc = b.op("Transpose", [resp], name="to_nhwc", perm=[0, 2, 3, 1])
    patches = b.op("ExtractImagePatches", [nhwc], name="extract_patches", domain="tf", ksizes=[1, 3, 3, 1],
                   strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")  # [1, 9, 9, 9*C]
    w = (b.rng.standard_normal((9 * C, MASK * MASK)) / np.sqrt(9 * C)).astype(np.float32)
    masks = b.op("Sigmoid", [b.op("MatMul", [patches, b.const(w, "mask_fc_w")], name="mask_fc")], name="masks")
    b.opset_extra = {"tf": 1}
    model = b.model([float_input("template", [1, 3, 16, 16]), float_input("search", [1, 3, 32, 32])],
                    [helper.make_tensor_value_info(masks, TensorProto.FLOAT, [1, 9, 9, MASK * MASK])], "siammask_patches")
    return model


def main() -> int:
    import graphpass as gp
    from graphpass import verify as V
    from graphpass.cost_model import create
    from graphpass.ir import annotations as A

    model = build()
    graph = gp.load(model)
    for n in graph.nodes:
        if n.op == "ExtractImagePatches":
            A.set_engine(n, "HOST")  # the py_func fallback of the TF port
    cm = create()
    before = cm.estimate(graph)
    result = gp.optimize(graph)
    after = cm.estimate(result.graph)
    for label, r in (("before", before), ("after", after)):
        engines = sorted({n["engine"] for n in r.nodes if n["engine"] not in ("compile-time",)})
        print(f"{label:6s}: {len(r.crossings)} host/device crossings ({sum(c['bytes'] for c in r.crossings):,} bytes), "
              f"engines {', '.join(engines)}, dynamic regions {len(r.dynamic_regions)}, estimate {r.total_us:,.0f} us")
    lowered = gp.to_proto(result.graph)
    V.session(lowered)  # runs in onnxruntime now; the original's tf op does not
    print("the lowered patches equal TF's extract_image_patches bit for bit "
          "(tests/passes/test_lower_extract_image_patches.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
