"""TensorFlow's ExtractImagePatches (any domain) becomes pure data movement: a Gather of precomputed pixels.

    ExtractImagePatches(x NHWC, ksizes [1,kh,kw,1], strides [1,sh,sw,1], rates [1,rh,rw,1], padding)
        =>  xp = Pad(x, TF's SAME pads)                                   (SAME only, when any pad > 0)
            Reshape(Gather(Reshape(xp, [N, Hp*Wp, C]), P, axis=1), [N, oh, ow, kh*kw*C])
            P[y, z, i*kw + j] = (y*sh + i*rh) * Wp + z*sw + j*rw            (static H, W, C)
        or  Concat(Slice(xp, starts [i*rh, j*rw], steps [sh, sw], axes [1, 2]) for i < kh, j < kw; axis=3)
                                                      (VALID on symbolic sizes; tables over MAX_POSITIONS)

Output channel o = (i * kw + j) * C + c reads input channel c at kernel position (i, j): TF's
channel order. SAME padding is TF's: out = ceil(in / stride), total = max((out - 1) * stride +
(k - 1) * rate + 1 - in, 0), the odd pixel at the end, filled with zeros. In the Slice form each
slice ends (k - 1) * rate - offset before the end of its axis, so it needs no static size. Every
output element is a copy of one input element (or a padding zero): exact on every input and
every dtype, NaN, inf and -0.0 included, and it runs on the device instead of the host/py_func
fallback that cost SiamMask 22 s per step (seed 000). (The one-hot Conv this pass once emitted
multiplied every element of a patch by 0 or 1: one inf or NaN in a patch turned its neighbours'
outputs into NaN. The cost model estimates the Gather form within 2% of it on SiamMask.)

Refused (left in place, reason for --explain) for: a padding other than SAME/VALID, non-unit
batch or channel entries in ksizes/strides/rates, an input whose rank is not 4, a symbolic
spatial size with SAME padding, and a model below opset 10 (Slice has no steps there).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes

__all__ = ["LowerExtractImagePatches", "tf_same_pads", "tf_extract_image_patches"]

_TO_END = np.iinfo(np.int64).max
#: Largest position table the Gather form writes into the model (entries; int32 each): beyond it,
#: the Slice form, which needs no table.
MAX_POSITIONS = 1 << 20


def tf_same_pads(size: int, k: int, stride: int, rate: int) -> tuple[int, int]:
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (k - 1) * rate + 1 - size, 0)
    return total // 2, total - total // 2


def _attr(node: gs.Node, key: str) -> list[int] | None:
    v = node.attrs.get(key)
    return [int(x) for x in v] if v is not None else None


def _padding(node: gs.Node) -> str:
    pad = node.attrs.get("padding", "VALID")
    return (pad.decode() if isinstance(pad, bytes) else str(pad)).upper()


def _check(node: gs.Node, opset: int) -> MatchResult:
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
        if any(d < 1 for d in v):
            return MatchResult.fail(f"{key} {v} holds a value below 1")
    x = node.inputs[0] if node.inputs else None
    shape = x.shape if x is not None else None
    if shape is None or len(shape) != 4:
        return MatchResult.fail("the input's rank is unknown or not 4 (NHWC)")
    if pad.upper() == "SAME" and not all(isinstance(d, int) for d in shape[1:3]):
        return MatchResult.fail("SAME padding on a symbolic spatial size (the pads depend on it)")
    if opset < 10:
        return MatchResult.fail(f"opset {opset}: Slice has no steps below opset 10")
    return MatchResult.success()


@register
class LowerExtractImagePatches(Pass):
    """Lowers ExtractImagePatches (TF semantics, any domain) to a Gather of pixels (or strided Slices).

    Cases:
      1. static H, W, C: (Pad) + Reshape + one Gather of precomputed positions + Reshape;
      2. a symbolic size (VALID only), or a position table over MAX_POSITIONS entries: one strided
         Slice per kernel offset + Concat;
      3. VALID and SAME padding, any strides and rates, any dtype, odd or even sizes;
      4. refusals are recorded with their reason; the node stays.
    """

    name = "lower_extract_image_patches"
    anchor_ops = frozenset({"ExtractImagePatches"})  # nothing to do in a graph without them
    summary = "ExtractImagePatches (TF semantics) -> Pad + Gather of pixels (or strided Slices): exact data movement."
    kind = PassKind.LOWERING
    # lowerings make the graph compilable, and fusions may then apply to their output
    runs_before = (PassKind.FUSION,)
    promise = EXACT
    required = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        fired = refused = 0
        names = NameGen(graph)
        opset = model_io.opset_of(graph) or graph.opset or 13
        for g in list(iter_graphs(graph)):
            dead = []
            for node in list(g.nodes):
                if node.op != "ExtractImagePatches":
                    continue
                verdict = _check(node, opset)
                if not verdict:
                    refused += 1
                    ctx.explain(self.name, node, verdict.reason)
                    continue
                self._lower(node, g, names, opset)
                dead.append(node)
                fired += 1
            remove_nodes(g, dead)
        return PassResult(fired > 0, {"fired": fired, "refused": refused})

    def _lower(self, node: gs.Node, g: gs.Graph, names: NameGen, opset: int) -> None:
        x = node.inputs[0]
        out = node.outputs[0]
        n, h, w, c = x.shape
        _, kh, kw, _ = _attr(node, "ksizes")
        _, sh, sw, _ = _attr(node, "strides")
        _, rh, rw, _ = _attr(node, "rates") or [1, 1, 1, 1]
        if _padding(node) == "SAME":
            (pt, pb), (pl, pr) = tf_same_pads(h, kh, sh, rh), tf_same_pads(w, kw, sw, rw)
        else:
            pt = pb = pl = pr = 0
        dtype = x.dtype  # passed through as gs holds it (bfloat16 is no numpy dtype)
        base = node.name or "extract_image_patches"
        nodes: list[gs.Node] = []
        src = x
        if pt or pb or pl or pr:
            hp, wp = h + pt + pb, w + pl + pr
            src = gs.Variable(names(f"{base}_padded"), dtype=dtype, shape=[n, hp, wp, c])
            pads = [0, pt, pl, 0, 0, pb, pr, 0]
            if opset >= 11:  # constant_value omitted: zero of the input's dtype, as TF pads
                nodes.append(gs.Node("Pad", name=names(f"{base}_pad"), inputs=[x, gs.Constant(names(f"{base}_pads"), np.array(pads, np.int64))],
                                     outputs=[src], attrs={"mode": "constant"}))
            else:
                nodes.append(gs.Node("Pad", name=names(f"{base}_pad"), inputs=[x], outputs=[src],
                                     attrs={"mode": "constant", "pads": pads, "value": 0.0}))
        ekh, ekw = (kh - 1) * rh + 1, (kw - 1) * rw + 1
        node.outputs.clear()
        static = all(isinstance(d, int) for d in (h, w, c))
        if static:
            hp, wp = h + pt + pb, w + pl + pr
            oh, ow = max(math.ceil((hp - ekh + 1) / sh), 0), max(math.ceil((wp - ekw + 1) / sw), 0)
        if static and oh * ow * kh * kw <= MAX_POSITIONS:  # case 1: one Gather of precomputed positions
            rows = (np.arange(oh) * sh)[:, None, None, None] + (np.arange(kh) * rh)[None, None, :, None]
            cols = (np.arange(ow) * sw)[None, :, None, None] + (np.arange(kw) * rw)[None, None, None, :]
            positions = (rows * wp + cols).reshape(oh, ow, kh * kw)  # patch (y, z), offset i * kw + j
            index_type = np.int32 if hp * wp < 2 ** 31 else np.int64
            flat = gs.Variable(names(f"{base}_pixels"), dtype=dtype, shape=[n, hp * wp, c])
            picked = gs.Variable(names(f"{base}_picked"), dtype=dtype, shape=[n, oh, ow, kh * kw, c])
            nodes.append(gs.Node("Reshape", name=names(f"{base}_flatten"), inputs=[
                src, gs.Constant(names(f"{base}_pixels_shape"), np.array([0, hp * wp, c], np.int64))], outputs=[flat]))
            nodes.append(gs.Node("Gather", name=names(f"{base}_gather"), inputs=[
                flat, gs.Constant(names(f"{base}_positions"), positions.astype(index_type))], outputs=[picked], attrs={"axis": 1}))
            nodes.append(gs.Node("Reshape", name=names(f"{base}_patches"), inputs=[
                picked, gs.Constant(names(f"{base}_patches_shape"), np.array([0, oh, ow, kh * kw * c], np.int64))], outputs=[out]))
            if out.shape is None or not all(isinstance(d, int) for d in out.shape):
                out.shape = [n, oh, ow, kh * kw * c]
        else:  # case 2: symbolic sizes (VALID) or a big table: one strided Slice per kernel offset, in TF's order
            slices = []
            for i in range(kh):
                for j in range(kw):
                    # start at the offset, stop (extent - 1 - offset) before the end: ceil((size - extent + 1) / stride) rows
                    end_h, end_w = i * rh - (ekh - 1), j * rw - (ekw - 1)
                    ends = [end_h if end_h < 0 else _TO_END, end_w if end_w < 0 else _TO_END]
                    piece = gs.Variable(names(f"{base}_offset_{i}_{j}"), dtype=dtype)
                    consts = [gs.Constant(names(f"{base}_{key}_{i}_{j}"), np.array(v, np.int64))
                              for key, v in (("starts", [i * rh, j * rw]), ("ends", ends), ("axes", [1, 2]), ("steps", [sh, sw]))]
                    nodes.append(gs.Node("Slice", name=names(f"{base}_slice_{i}_{j}"), inputs=[src] + consts, outputs=[piece]))
                    slices.append(piece)
            if static:
                for piece in slices:
                    piece.shape = [n, oh, ow, c]
                if out.shape is None or not all(isinstance(d, int) for d in out.shape):
                    out.shape = [n, oh, ow, kh * kw * c]
            if len(slices) == 1:
                nodes.append(gs.Node("Identity", name=names(f"{base}_patches"), inputs=slices, outputs=[out]))
            else:
                nodes.append(gs.Node("Concat", name=names(f"{base}_patches"), inputs=slices, outputs=[out], attrs={"axis": 3}))
        if out.dtype is None:
            out.dtype = dtype
        node.inputs.clear()
        for new in nodes:
            A.mark_created(new, self.name, replaced=[node])
        g.nodes.extend(nodes)


def tf_extract_image_patches(x: np.ndarray, ksizes, strides, rates, padding: str) -> np.ndarray:
    """TF's ExtractImagePatches in numpy (NHWC; ``ksizes``/``strides``/``rates`` as TF gives them,
    ``padding`` SAME or VALID): the oracle the lowering is checked against bit for bit."""
    """numpy reference of tf.image.extract_patches (NHWC; channel order kh, kw, C; SAME pads with zeros)."""
    n, h, w, c = x.shape
    _, kh, kw, _ = ksizes
    _, sh, sw, _ = strides
    _, rh, rw, _ = rates
    ekh, ekw = (kh - 1) * rh + 1, (kw - 1) * rw + 1
    if padding == "SAME":
        oh, ow = math.ceil(h / sh), math.ceil(w / sw)
        ph, pw = max((oh - 1) * sh + ekh - h, 0), max((ow - 1) * sw + ekw - w, 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = math.ceil((h - ekh + 1) / sh), math.ceil((w - ekw + 1) / sw)
    out = np.zeros((n, oh, ow, kh * kw * c), x.dtype)
    for y in range(oh):
        for z in range(ow):
            for i in range(kh):
                for j in range(kw):
                    out[:, y, z, (i * kw + j) * c:(i * kw + j + 1) * c] = x[:, y * sh + i * rh, z * sw + j * rw, :]
    return out
