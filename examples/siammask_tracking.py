"""SiamMask tracking over frames as an ONNX Loop: hoisting, lowering and loop sinking (seed 000).

A naive port recomputes the template (exemplar) branch in every iteration: a Resize of the fixed
crop (SiamMask's resize_bilinear, slow on AI CPU in the seed's port; ATC's ONNX Resize runs nearest
and linear on AI Core, op_info.toml) and the template backbone. Each
frame then runs the search backbone, the depthwise cross-correlation and the mask head with
ExtractImagePatches. With the host work in the body, the loop cannot sink: every iteration
costs a graph launch and a host sync (the seed's big/small-loop story, iterations_per_loop).
graphpass hoists the invariant template branch out of the loop, lowers the patch extraction
to a Gather of pixels (exact data movement), and marks the loop sunk.

    python examples/siammask_tracking.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _builder import Builder  # noqa: E402

C, FRAMES = 8, 6


def build(seed: int = 0) -> onnx.ModelProto:
    b = Builder(opset=13, seed=seed)
    # -- the loop body: one frame -------------------------------------------------------------
    crop = b.op("Resize", ["template", "", b.const(np.array([1, 1, 2, 2], np.float32), "zoom")], name="template_resize",
                mode="nearest")  # the fixed exemplar crop, resized every frame (invariant)
    z = b.conv_bn(crop, 3, C, 3, 2, 1, name="backbone_z")                    # [1, C, 8, 8]
    kernel = b.op("Reshape", [z, b.const(np.array([C, 1, 8, 8], np.int64))], name="xcorr_kernel")
    frame = b.op("Gather", ["frames", "i"], name="frame", axis=0)            # [3, 32, 32]
    x = b.op("Unsqueeze", [frame, b.const(np.array([0], np.int64))], name="frame_batch")
    x = b.conv_bn(x, 3, C, 3, 2, 1, name="backbone_x")                       # [1, C, 16, 16]
    resp = b.op("Conv", [x, kernel], name="xcorr", group=C, kernel_shape=[8, 8])   # [1, C, 9, 9]
    nhwc = b.op("Transpose", [resp], name="to_nhwc", perm=[0, 2, 3, 1])
    patches = b.op("ExtractImagePatches", [nhwc], name="extract_patches", domain="tf", ksizes=[1, 3, 3, 1],
                   strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")  # [1, 9, 9, 9C]
    w = (b.rng.standard_normal((9 * C, 1)) / np.sqrt(9 * C)).astype(np.float32)
    score = b.op("ReduceMax", [b.op("MatMul", [patches, b.const(w, "score_w")], name="score_map")], name="best", keepdims=0)
    state = b.op("Add", ["state_in", b.op("Reshape", [score, b.const(np.array([1], np.int64))], name="score1")],
                 name="state_update")
    body = helper.make_graph(
        b.nodes + [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", [state], ["state_out"])],
        "frame", [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                  helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1])],
        initializer=b.inits)
    # -- the tracking loop ---------------------------------------------------------------------
    loop = helper.make_node("Loop", ["n_frames", "", "state0"], ["track_score"], body=body, name="track")
    graph = helper.make_graph(
        [loop], "siammask_tracking",
        [helper.make_tensor_value_info("template", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("frames", TensorProto.FLOAT, [FRAMES, 3, 32, 32]),
         helper.make_tensor_value_info("state0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("track_score", TensorProto.FLOAT, [1])],
        initializer=[onnx.numpy_helper.from_array(np.array(FRAMES, np.int64), "n_frames")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("tf", 1)], ir_version=8,
                             producer_name="graphpass-examples")


def main() -> int:
    import graphpass as gp
    from graphpass.cost_model import create
    from graphpass.ir import annotations as A

    model = build()
    graph = gp.load(model).graph
    for g in gp.ir.iter_graphs(graph):
        for n in g.nodes:
            if n.op == "ExtractImagePatches":
                A.set_engine(n, "HOST")  # the py_func fallback
    cm = create()
    before = cm.estimate(graph)
    result = gp.optimize(graph)
    loop = next(n for n in result.graph.nodes if n.op == "Loop")
    after = cm.estimate(result.graph)
    hoisted = sum(r.stats.get("hoisted", 0) for r in result.report.passes)
    print(f"hoisted out of the loop: {hoisted} nodes ({', '.join(sorted({n.op for n in result.graph.nodes if n.op != 'Loop'}))})")
    print(f"loop sunk: {A.get(loop, A.SINK) == 'device'}")
    print(f"estimate (cost model): {before.total_us:,.0f} us -> {after.total_us:,.0f} us; "
          f"crossings {len(before.crossings)} -> {len(after.crossings)}")
    for n, us in result.report.iterations_per_loop.items():
        print(f"  iterations_per_loop={n}: {us:,.0f} us per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
