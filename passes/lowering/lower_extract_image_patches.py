"""TensorFlow's ExtractImagePatches (any domain) becomes a Conv with a one-hot filter.

    ExtractImagePatches(x NHWC, ksizes [1,kh,kw,1], strides [1,sh,sw,1], rates [1,rh,rw,1], padding)
        =>  Transpose(0,3,1,2) -> Conv(W one-hot [kh*kw*C, C, kh, kw], strides, dilations=rates, pads)
            -> Transpose(0,2,3,1)

Output channel o = (i * kw + j) * C + c reads input channel c at kernel position (i, j): TF's
channel order. SAME padding is TF's: out = ceil(in / stride), total = max((out - 1) * stride +
(k - 1) * rate + 1 - in, 0), the odd pixel at the end. The Conv runs on the Cube instead of the
host/py_func fallback that cost SiamMask 22 s per step (seed 000). Exact for finite inputs (each
output is one input times 1.0 plus zeros).

Refused (left in place, reason for --explain) for: a padding other than SAME/VALID, non-unit
batch or channel entries in ksizes/strides/rates, an input whose rank is not 4 or whose channel
count is unknown, a symbolic spatial size with SAME padding, and a non-float input.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.infra import MatchResult, PassContext, PassKind, PassResult, register
from graphpass.infra.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes

__all__ = ["LowerExtractImagePatches", "one_hot_filter", "tf_same_pads"]


def one_hot_filter(kh: int, kw: int, c: int, dtype=np.float32) -> np.ndarray:
    w = np.zeros((kh * kw * c, c, kh, kw), dtype)
    for i in range(kh):
        for j in range(kw):
            for ch in range(c):
                w[(i * kw + j) * c + ch, ch, i, j] = 1
    return w


def tf_same_pads(size: int, k: int, stride: int, rate: int) -> tuple[int, int]:
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (k - 1) * rate + 1 - size, 0)
    return total // 2, total - total // 2


def _attr(node: gs.Node, key: str) -> list[int] | None:
    v = node.attrs.get(key)
    return [int(x) for x in v] if v is not None else None


def _check(node: gs.Node) -> MatchResult:
    pad = node.attrs.get("padding", "VALID")
    pad = pad.decode() if isinstance(pad, bytes) else str(pad)
    if pad.upper() not in ("SAME", "VALID"):
        return MatchResult.fail(f"padding '{pad}' is neither SAME nor VALID")
    for key in ("ksizes", "strides", "rates"):
        v = _attr(node, key) or ([1, 1, 1, 1] if key == "rates" else None)
        if v is None or len(v) != 4:
            return MatchResult.fail(f"{key} {v} is not a 4-element list")
        if v[0] != 1 or v[3] != 1:
            return MatchResult.fail(f"{key} {v} is not 1 on the batch and channel axes")
    x = node.inputs[0] if node.inputs else None
    shape = x.shape if x is not None else None
    if shape is None or len(shape) != 4:
        return MatchResult.fail("the input's rank is unknown or not 4 (NHWC)")
    if not isinstance(shape[3], int):
        return MatchResult.fail("the input's channel count is unknown")
    if pad.upper() == "SAME" and not all(isinstance(d, int) for d in shape[1:3]):
        return MatchResult.fail("SAME padding on a symbolic spatial size (the pads depend on it)")
    if x.dtype is not None and np.dtype(x.dtype) not in (np.float32, np.float16, np.float64):
        return MatchResult.fail(f"input dtype {np.dtype(x.dtype)}: a Conv needs floats")
    return MatchResult.success()


@register
class LowerExtractImagePatches(Pass):
    """Lowers ExtractImagePatches (TF semantics, any domain) to a one-hot Conv.

    Cases:
      1. VALID and SAME padding, any strides and rates;
      2. any channel count (aligned to 16 or not) and spatial size (odd or even);
      3. refusals are recorded with their reason; the node stays.
    """

    name = "lower_extract_image_patches"
    summary = "ExtractImagePatches (TF semantics) -> Transpose + one-hot Conv + Transpose on the Cube."
    kind = PassKind.LOWERING
    promise = EXACT
    required = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        fired = refused = 0
        names = NameGen(graph)
        for g in list(iter_graphs(graph)):
            dead = []
            for node in list(g.nodes):
                if node.op != "ExtractImagePatches":
                    continue
                verdict = _check(node)
                if not verdict:
                    refused += 1
                    ctx.explain(self.name, node, verdict.reason)
                    continue
                self._lower(node, g, names)
                dead.append(node)
                fired += 1
            remove_nodes(g, dead)
        return PassResult(fired > 0, {"fired": fired, "refused": refused})

    def _lower(self, node: gs.Node, g: gs.Graph, names: NameGen) -> None:
        x = node.inputs[0]
        out = node.outputs[0]
        n, h, w, c = x.shape
        _, kh, kw, _ = _attr(node, "ksizes")
        _, sh, sw, _ = _attr(node, "strides")
        _, rh, rw, _ = _attr(node, "rates") or [1, 1, 1, 1]
        pad = node.attrs.get("padding", "VALID")
        pad = (pad.decode() if isinstance(pad, bytes) else str(pad)).upper()
        if pad == "SAME":
            (pt, pb), (pl, pr) = tf_same_pads(h, kh, sh, rh), tf_same_pads(w, kw, sw, rw)
        else:
            pt = pb = pl = pr = 0
        dtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
        base = node.name or "extract_image_patches"
        x_nchw = gs.Variable(names(f"{base}_nchw"), dtype=dtype, shape=[n, c, h, w])
        conv_out = gs.Variable(names(f"{base}_patches_nchw"), dtype=dtype)
        weight = gs.Constant(names(f"{base}_one_hot"), one_hot_filter(kh, kw, c, dtype))
        nodes = [
            gs.Node("Transpose", name=names(f"{base}_to_nchw"), inputs=[x], outputs=[x_nchw], attrs={"perm": [0, 3, 1, 2]}),
            gs.Node("Conv", name=names(f"{base}_conv"), inputs=[x_nchw, weight], outputs=[conv_out],
                    attrs={"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [rh, rw], "pads": [pt, pl, pb, pr]}),
        ]
        node.outputs.clear()
        nodes.append(gs.Node("Transpose", name=names(f"{base}_to_nhwc"), inputs=[conv_out], outputs=[out], attrs={"perm": [0, 2, 3, 1]}))
        node.inputs.clear()
        for new in nodes:
            A.mark_created(new, self.name, replaced=[node])
        g.nodes.extend(nodes)
