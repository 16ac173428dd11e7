"""The SwiGLU and GeGLU gated MLPs, as exporters write them, become one ``graphpass.ascend::SwiGlu``
(CANN SwiGlu over the last axis) or ``GeGlu`` / ``GeGluTanh`` (CANN GeGluV2) device op.

    A, B = the halves of one tensor X on its last axis (Split into two equal parts, or
           Slice [0, D/2) and [D/2, D))                  (Phi-3's gate_up_proj, chunk(2))
    Y = (A * Sigmoid(A)) * B                             =>  SwiGlu(X)                     exact
    A = MatMul(H, Wg), B = MatMul(H, Wu), Wg and Wu constants of one shape [K, I]   (LLaMA)
    Y = (A * Sigmoid(A)) * B                             =>  SwiGlu(MatMul(H, [Wg | Wu]))  tolerance

The first form is exact (the body computes the same Slice, Sigmoid and Muls). The second packs
the two projections into one MatMul over the concatenated weights ([K, 2I], one Cube kernel and
one read of H), which the promise covers as a tolerance: a MatMul kernel may sum a column's K
products in another order for another N. float32/float64 only for the packing (in float16 the
order would show in the rounding beyond the tolerance): a float16/bfloat16 pair, or weights that
are not constants of one shape, keep their two MatMuls and feed SwiGlu through a Concat (exact).
GeGLU is ``Gelu(A) * B`` with the Gelu that fuse_gelu formed (it runs first): the standard op
(opset 20+) or the ``graphpass.ascend::Gelu`` / ``GeluTanh`` device op, whose ops the GeGlu body
computes (exact against the graph fuse_gelu left). Not formed (the report says why): halves that are not equal halves of the last axis, a SiLU of
another tensor than the gate, an intermediate read elsewhere, and a target without the kernel or
the dtype (cost_model/data/transformer_ops.toml).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphpass.cost_model.transformer_ops import refusal as target_refusal
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function, function_type_conflict
from graphpass.ir.device_ops_tf import MIN_OPSET, geglu_function, swiglu_function
from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import Promise
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, single_reader
from graphpass.passes.fusion._match import operands, producer_of
from graphpass.passes.fusion._match import dtype_name as _dtype_name
from graphpass.passes.fusion.fuse_rotary_embedding import _ints, _slice_of

__all__ = ["FuseSwiGlu"]


def _silu(t: gs.Tensor, g: gs.Graph, local: set[int]) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """t = A * Sigmoid(A) (either order): (A, nodes)."""
    mul = producer_of(t, "Mul", local)
    if mul is None or not single_reader(t, g):
        return None
    for a, s in operands(mul):
        sig = producer_of(s, "Sigmoid", local)
        if sig is not None and sig.inputs[0] is a and single_reader(s, g):
            return a, [sig, mul]
    return None


def _gelu(t: gs.Tensor, g: gs.Graph) -> tuple[gs.Tensor, list[gs.Node], str] | None:
    """t = Gelu(A) as fuse_gelu leaves it (the standard op, or the graphpass.ascend::Gelu /
    GeluTanh device op): (A, nodes, the GeGLU device op's name)."""
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None or not single_reader(t, g) or len(node.inputs) != 1:
        return None
    if node.op == "Gelu" and node.domain in (None, "", "ai.onnx"):
        kind = "GeGluTanh" if node.attrs.get("approximate", "none") == "tanh" else "GeGlu"
    elif node.domain == DOMAIN and node.op in ("Gelu", "GeluTanh"):
        kind = "GeGluTanh" if node.op == "GeluTanh" else "GeGlu"
    else:
        return None
    return node.inputs[0], [node], kind


def _halves(a: gs.Tensor, b: gs.Tensor, g: gs.Graph, local: set[int],
            readers: int = 2) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """a, b the first and second half of one X on its last axis, a read by ``readers`` nodes (the
    activation's): (X, nodes)."""
    sa, sb = producer_of(a, "Split", local), producer_of(b, "Split", local)
    if sa is not None and sa is sb and len(sa.outputs) == 2 and sa.outputs[0] is a and sa.outputs[1] is b:
        x = sa.inputs[0]
        if x.shape is None or not x.shape or not isinstance(x.shape[-1], (int, np.integer)) or x.shape[-1] % 2:
            return None
        rank, d = len(x.shape), int(x.shape[-1])
        if int(sa.attrs.get("axis", 0)) % rank != rank - 1:
            return None
        sizes = _ints(sa.inputs[1]) if len(sa.inputs) > 1 and sa.inputs[1].name else sa.attrs.get("split")
        if sizes is not None and list(sizes) != [d // 2, d // 2]:
            return None
        if len(a.outputs) != readers or len(b.outputs) != 1:  # a: the activation's nodes; b: the gate Mul
            return None
        return x, [sa]
    la, lb = _slice_of(a, local), _slice_of(b, local)
    if la is None or lb is None or la[0] is not lb[0]:
        return None
    x = la[0]
    if x.shape is None or not x.shape or not isinstance(x.shape[-1], (int, np.integer)):
        return None
    rank, d = len(x.shape), int(x.shape[-1])
    h = d // 2
    if d % 2 or la[3] % rank != rank - 1 or lb[3] % rank != rank - 1:
        return None
    if la[1] not in (0, -d) or la[2] not in (h, -h) or lb[1] not in (h, -h) or lb[2] < d:
        return None
    if len(a.outputs) != readers or len(b.outputs) != 1:
        return None
    return x, [a.inputs[0], b.inputs[0]]


class _SwiGlu(Rule):
    """Anchored at the gating Mul."""

    name = "swiglu"

    def anchors(self) -> frozenset[str]:
        return frozenset({"Mul"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
            return None
        g, local = scope.graph, scope.local
        for s, up in operands(anchor):
            got = _silu(s, g, local)
            kind = "SwiGlu"
            if got is None:
                gelu = _gelu(s, g)
                if gelu is None:
                    continue
                got, kind = gelu[:2], gelu[2]
            a, silu_nodes = got
            readers = 2 if kind == "SwiGlu" else 1
            halves = _halves(a, up, g, local, readers)
            if halves is not None:
                x, nodes = halves
                m = scope.match(nodes + silu_nodes + [anchor])
                m.x, m.packed, m.kind = x, None, kind
                return m
            mg, mu = producer_of(a, "MatMul", local), producer_of(up, "MatMul", local)
            if mg is None or mu is None or mg is mu or mg.inputs[0] is not mu.inputs[0]:
                continue
            if len(a.outputs) != readers or not single_reader(up, g) or scope.is_output(a):
                continue
            m = scope.match([mg, mu] + silu_nodes + [anchor])
            m.x, m.packed, m.kind = None, (mg, mu), kind
            return m
        return None

    def check(self, m: Match, ctx) -> MatchResult:
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        if m.opset < MIN_OPSET[m.kind]:
            return MatchResult.fail(f"opset {m.opset}: the {m.kind} body needs opset {MIN_OPSET[m.kind]}+")
        m.weights = None
        if m.packed is not None:
            mg, mu = m.packed
            gate, up = mg.outputs[0], mu.outputs[0]
            elem = elem_type(gate.dtype)
            if elem != elem_type(up.dtype) or gate.shape is None or up.shape is None or not gate.shape \
                    or list(gate.shape) != list(up.shape) or not isinstance(gate.shape[-1], (int, np.integer)):
                return MatchResult.fail("SwiGLU of two MatMuls: the gate and up projections are not known to have one "
                                        "shape and type")
            wg, wu = mg.inputs[1], mu.inputs[1]
            packable = elem in (TensorProto.FLOAT, TensorProto.DOUBLE)
            if isinstance(wg, gs.Constant) and isinstance(wu, gs.Constant) and packable:
                vg, vu = np.asarray(wg.values), np.asarray(wu.values)
                if vg.ndim == 2 and vg.shape == vu.shape and vg.dtype == vu.dtype:
                    m.weights = np.concatenate([vg, vu], axis=1)  # one MatMul of [Wg | Wu]
            # else (float16/bfloat16, where one packed MatMul could round differently, or weights
            # that are not constants of one shape): the two projections stay, concatenated
            dtype, width = _dtype_name(elem), 2 * int(gate.shape[-1])
        else:
            dtype, width = _dtype_name(elem_type(m.x.dtype)), int(m.x.shape[-1])
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(dtype or "", 4)
        m.elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
                  "float64": TensorProto.DOUBLE}.get(dtype or "", TensorProto.FLOAT)
        row = "SwiGlu" if m.kind == "SwiGlu" else "GeGlu"
        reason = target_refusal(ctx.target, row, dtype, split_dim=width, itemsize=itemsize)
        if not reason and m.kind != "SwiGlu":  # one GeGLU body per model and type (its Gelu's constants)
            reason = function_type_conflict(m.root, m.kind, m.elem)
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        if m.kind == "SwiGlu":
            ensure_function(m.root, swiglu_function(m.opset))
        else:
            ensure_function(m.root, geglu_function(m.opset, m.elem, m.kind == "GeGluTanh"))
        x = m.x
        if m.packed is not None and m.weights is not None:
            mg, mu = m.packed
            w = gs.Constant(m.names(f"{mg.inputs[1].name}_gate_up"), m.weights)
            x = m.op("MatMul", [mg.inputs[0], w], name=m.names(f"{mg.name or 'matmul'}_gate_up"), dtype=m.weights.dtype)
            m.count("packed_matmuls")
        elif m.packed is not None:
            mg, mu = m.packed
            x = m.op("Concat", [mg.outputs[0], mu.outputs[0]], {"axis": -1}, name=m.names("gate_up_concat"),
                     dtype=mg.outputs[0].dtype)
            m.count("concatenated_projections")
        return m.op(m.kind, [x], domain=DOMAIN, name=m.names(m.kind.lower()))


@register
class FuseSwiGlu(RulePass):
    """Recognizes the SwiGLU gated MLP.

    Cases:
      1. one tensor split in halves on the last axis (Split, or two Slices): exact;
      2. two MatMuls of one input with constant weights of one shape: packed into one MatMul of
         the concatenated weights (float32/float64); else the two outputs concatenated;
      3. SiLU as A * Sigmoid(A), operands in either order;
      4. GeGLU: Gelu(A) * B with the Gelu fuse_gelu formed (the standard op, or the
         graphpass.ascend::Gelu / GeluTanh device op) -> graphpass.ascend::GeGlu / GeGluTanh
         (CANN GeGluV2), its body computing that Gelu's ops.
    """

    name = "fuse_swiglu"
    summary = ("SwiGLU / GeGLU gated MLPs (Split or two MatMuls, SiLU or Gelu, Mul) -> graphpass.ascend::SwiGlu / "
               "GeGlu (CANN SwiGlu, GeGluV2).")
    kind = PassKind.FUSION
    promise = Promise.tolerance("packed-matmul", rtol=1e-5, atol=1e-6,
                                reason="the gate and up projections as one MatMul of the concatenated weights: a "
                                       "column's K products may be summed in another order")
    rules = (_SwiGlu(),)
