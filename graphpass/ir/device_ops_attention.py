"""The attention device ops of the ``graphpass.ascend`` domain, with the ONNX bodies that define
them (see :mod:`graphpass.ir.device_ops`): CANN's PromptFlashAttention (IncreFlashAttention for a
one-token query) in its BNSD and BSH layouts.

``Attention(Q, K, V, Mask)`` -- layout BNSD: Q ``[B, N, Sq, D]``, K ``[B, Nkv, Skv, D]``, V
``[B, Nkv, Skv, Dv]``, output ``[B, N, Sq, Dv]``::

    Kr, Vr = repeat_kv(K), repeat_kv(V)            each KV head read by N / Nkv query heads
    S = MatMul(Q * scale_q, Transpose(Kr * scale_k, [0, 1, 3, 2]))
    P = Softmax(Cast((Cast(S, scores_type) * scale_mul) / scale_div + Mask, softmax_type), axis=-1)
    P = Where(IsNaN(P) and nan_to_zero, 0, P)      torch's guard of a fully masked row
    Y = MatMul(Cast(P, output_type), Cast(Vr, output_type))

``scores_type``, ``softmax_type`` and ``output_type`` (TensorProto types) say where a float16
export computes in float32: torch's SDPA export in TorchScript upcasts the scores after the
MatMul and V for the second one (a float32 result); HF's eager attention upcasts the masked
scores for the softmax and casts the probabilities back. Where they are Q's type (every float32
export) the Casts copy.

``AttentionBSH(Q, K, V, Mask)`` -- layout BSH: Q ``[B, Sq, N*D]``, K and V ``[B, Skv, Nkv*D]``;
the head split ``Transpose(Reshape(x, [B, S, heads, -1]), [0, 2, 1, 3])`` of each (heads: the
``num_heads`` / ``num_key_value_heads`` attributes), the body above, and the head merge
``Reshape(Transpose(Y, [0, 2, 1, 3]), [B, Sq, N*Dv])``. Every Reshape target is spelled out
(allowzero 1), so an empty batch or sequence stays empty where a -1 could not be inferred. In BNSD the body reads N from Q as it
runs (``num_heads`` only describes the op).

Exactness: exporters place the softmax scale in several ways (torch's SDPA export multiplies Q
and K^T by sqrt(scale) each; HF's eager attention divides the scores by sqrt(d); Whisper scales
Q before the head split). The body has a slot for each: a slot the export does not use holds
1.0, and ``x * 1`` and ``x / 1`` are ``x`` bit for bit (NaN, inf and -0.0 included), so the body
computes exactly the export's ops. An absent mask is a ``-0.0`` constant, the exact identity of
addition (``+0.0 + -0.0`` is ``+0.0``). ``repeat_kv`` (Unsqueeze, Expand, Reshape) and the head
split and merge only copy elements. The two MatMuls see the very operands (values and shapes)
the export's MatMuls see.

Attributes the body does not read describe the op for CANN: ``scale`` (scaleValue: the product
of the slots), ``input_layout``, ``mask_kind`` (none / additive: pseShift / boolean: the additive
form of a boolean mask, CANN's attenMask) and ``num_key_value_heads``.

The bodies are polymorphic (the slots are float attributes cast like Q, which is exact for a
value of Q's type: the fusion refuses one that float32 does not hold), and need opset 15
(CastLike, Shape's start/end).
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto, helper

__all__ = ["OPS", "MIN_OPSET", "SCALE_SLOTS", "attention_function", "bodies", "expand"]

DOMAIN = "graphpass.ascend"

#: layout -> device op name
OPS = {"BNSD": "Attention", "BSH": "AttentionBSH"}

MIN_OPSET = 15

#: the float slots of the body, in the order they apply
SCALE_SLOTS = ("scale_q", "scale_k", "scale_mul", "scale_div")

_ATTRS = ("num_heads", "num_key_value_heads", *SCALE_SLOTS, "nan_to_zero", "input_type", "scores_type", "softmax_type",
          "output_type", "head_dim", "scale",
          "input_layout", "mask_kind")


def _ref(out: str, field: str, attr: str, kind: int) -> onnx.NodeProto:
    node = helper.make_node("Constant", [], [out])
    ref = helper.make_attribute_ref(field, kind)
    ref.ref_attr_name = attr
    node.attribute.append(ref)
    return node


def _i64(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))


def _heads(attr: str, out: str) -> list[onnx.NodeProto]:
    """``out`` = [the int attribute ``attr``] (a 1-D int64 of one element)."""
    return [_ref(f"{out}_s", "value_int", attr, AttributeProto.INT), helper.make_node("Reshape", [f"{out}_s", "one"], [out])]


def _split_heads(x: str, heads: str, out: str) -> list[onnx.NodeProto]:
    """``[B, S, heads*D] -> [B, heads, S, D]``: the exporters' view + transpose (copies only). The
    target is spelled out (D = H / heads, allowzero): a -1 cannot be inferred from an empty B or S."""
    return [helper.make_node("Shape", [x], [f"{x}_bs"], start=0, end=2),
            helper.make_node("Shape", [x], [f"{x}_h"], start=2, end=3),
            helper.make_node("Div", [f"{x}_h", heads], [f"{x}_d"]),
            helper.make_node("Concat", [f"{x}_bs", heads, f"{x}_d"], [f"{x}_4d"], axis=0),
            helper.make_node("Reshape", [x, f"{x}_4d"], [f"{x}_bsnd"], allowzero=1),
            helper.make_node("Transpose", [f"{x}_bsnd"], [out], perm=[0, 2, 1, 3])]


def _repeat_kv(x: str, out: str) -> list[onnx.NodeProto]:
    """``[B, Nkv, S, D] -> [B, N, S, D]``, head h reading KV head h // (N / Nkv): HF's repeat_kv
    (``x[:, :, None].expand(B, Nkv, rep, S, D).reshape(B, N, S, D)``); with N = Nkv it copies."""
    return [helper.make_node("Shape", [x], [f"{x}_b"], start=0, end=1),
            helper.make_node("Shape", [x], [f"{x}_n"], start=1, end=2),
            helper.make_node("Shape", [x], [f"{x}_sd"], start=2),
            helper.make_node("Div", ["nh", f"{x}_n"], [f"{x}_rep"]),
            helper.make_node("Concat", [f"{x}_b", f"{x}_n", f"{x}_rep", f"{x}_sd"], [f"{x}_5d"], axis=0),
            helper.make_node("Concat", [f"{x}_b", "nh", f"{x}_sd"], [f"{x}_4d"], axis=0),
            helper.make_node("Unsqueeze", [x, "two"], [f"{x}_u"]),
            helper.make_node("Expand", [f"{x}_u", f"{x}_5d"], [f"{x}_e"]),
            helper.make_node("Reshape", [f"{x}_e", f"{x}_4d"], [out], allowzero=1)]  # an empty S or B stays empty


def _cast_to(x: str, attr: str, out: str) -> list[onnx.NodeProto]:
    """``out = Cast(x, to=<the int attribute attr>)`` (a Cast to x's own type copies it)."""
    node = helper.make_node("Cast", [x], [out])
    ref = helper.make_attribute_ref("to", AttributeProto.INT)
    ref.ref_attr_name = attr
    node.attribute.append(ref)
    return [node]


def _core(q: str, k: str, v: str, y: str) -> list[onnx.NodeProto]:
    nodes = [_ref(f"c_{s}", "value_float", s, AttributeProto.FLOAT) for s in SCALE_SLOTS]
    nodes += [helper.make_node("CastLike", [f"c_{s}", q], [f"{s}_q"]) for s in SCALE_SLOTS]
    nodes.append(helper.make_node("Shape", [q], ["nh"], start=1, end=2))  # the query's heads, as it runs
    nodes += _repeat_kv(k, "kr") + _repeat_kv(v, "vr0")
    nodes += [helper.make_node("Mul", [q, "scale_q_q"], ["qs"]),
              helper.make_node("Mul", ["kr", "scale_k_q"], ["ks"]),
              helper.make_node("Transpose", ["ks"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qs", "kt"], ["s00"])]
    # the scores in their type (torch's float16 SDPA export upcasts them after the MatMul)
    nodes += _cast_to("s00", "scores_type", "s0")
    nodes += [helper.make_node("CastLike", ["c_scale_mul", "s0"], ["scale_mul"]),
              helper.make_node("CastLike", ["c_scale_div", "s0"], ["scale_div"]),
              helper.make_node("Mul", ["s0", "scale_mul"], ["s1"]),
              helper.make_node("Div", ["s1", "scale_div"], ["s2"]),
              helper.make_node("Add", ["s2", "Mask"], ["s30"])]
    # the softmax's type (HF's eager attention upcasts the masked scores of a float16 model)
    nodes += _cast_to("s30", "softmax_type", "s3")
    nodes += [helper.make_node("Softmax", ["s3"], ["p0"], axis=-1),
              _ref("guard_i", "value_int", "nan_to_zero", AttributeProto.INT),
              helper.make_node("Cast", ["guard_i"], ["guard"], to=TensorProto.BOOL),
              helper.make_node("IsNaN", ["p0"], ["nan"]),
              helper.make_node("And", ["nan", "guard"], ["zap"]),
              helper.make_node("Constant", [], ["zero_f"], value=helper.make_tensor("zero_f", TensorProto.FLOAT, [], [0.0])),
              helper.make_node("CastLike", ["zero_f", "p0"], ["zero"]),
              helper.make_node("Where", ["zap", "zero", "p0"], ["pg"])]
    # the probabilities and V in the type of the second MatMul
    nodes += _cast_to("pg", "output_type", "p") + _cast_to("vr0", "output_type", "vr")
    nodes.append(helper.make_node("MatMul", ["p", "vr"], [y]))
    return nodes


def attention_function(opset: int, layout: str = "BNSD") -> onnx.FunctionProto:
    """The body of ``Attention`` (layout ``BNSD``) or ``AttentionBSH`` (``BSH``) at ``opset`` (15+)."""
    nodes = [_i64("one", [1]), _i64("two", [2])]
    if layout == "BSH":
        nodes += _heads("num_heads", "nq") + _heads("num_key_value_heads", "nkv")
        nodes += _split_heads("Q", "nq", "qh") + _split_heads("K", "nkv", "kh") + _split_heads("V", "nkv", "vh")
        nodes += _core("qh", "kh", "vh", "yh")
        nodes += [helper.make_node("Transpose", ["yh"], ["y_bsnd"], perm=[0, 2, 1, 3]),
                  helper.make_node("Shape", ["y_bsnd"], ["y_bs"], start=0, end=2),
                  helper.make_node("Shape", ["y_bsnd"], ["y_n"], start=2, end=3),
                  helper.make_node("Shape", ["y_bsnd"], ["y_d"], start=3, end=4),
                  helper.make_node("Mul", ["y_n", "y_d"], ["y_h"]),
                  helper.make_node("Concat", ["y_bs", "y_h"], ["y_3d"], axis=0),
                  helper.make_node("Reshape", ["y_bsnd", "y_3d"], ["Y"], allowzero=1)]
    else:
        nodes += _core("Q", "K", "V", "Y")
    return helper.make_function(DOMAIN, OPS[layout], ["Q", "K", "V", "Mask"], ["Y"], nodes,
                                [helper.make_opsetid("", opset)], attributes=list(_ATTRS))


def bodies(name: str, opset: int) -> list[onnx.FunctionProto]:
    """The body graphpass writes for the device op ``name`` at ``opset`` (none for another op)."""
    return [attention_function(opset, layout) for layout, op in OPS.items() if op == name and opset >= MIN_OPSET]


def expand(node: onnx.NodeProto, graph: onnx.GraphProto, taken: "set[str] | None" = None) -> list[onnx.NodeProto]:
    """``node`` (an Attention / AttentionBSH call) as the plain ONNX ops it stands for, for the
    portable output: the body above without what is an identity for this call (a scale slot of
    1.0, a Cast to the type a tensor has, the -0.0 of an absent mask, the guard when off,
    repeat_kv when K has the query's heads): the export's own decomposition. Bit for bit the body
    (each op left out is exact identity there). Constants go to ``graph``'s initializers."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    s = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    layout, mask_kind = s(a.get("input_layout", "BNSD")), s(a.get("mask_kind", "additive"))
    in_t = int(a["input_type"])
    sc_t, sm_t, out_t = int(a["scores_type"]), int(a["softmax_type"]), int(a["output_type"])
    heads, kv = int(a["num_heads"]), int(a["num_key_value_heads"])
    base = node.output[0]
    out: list[onnx.NodeProto] = []
    count = [0]

    taken = set() if taken is None else taken  # every name of the model: new ones must not clash

    def name(tag: str) -> str:
        while True:
            count[0] += 1
            n = f"{base}__{tag}{count[0]}"
            if n not in taken:
                taken.add(n)
                return n

    def op(op_type: str, inputs: list[str], **attrs) -> str:
        o = name(op_type.lower())
        out.append(helper.make_node(op_type, inputs, [o], name=f"{node.name or base}/{len(out)}_{op_type}", **attrs))
        return o

    def const(value, elem: int, dims=()) -> str:
        c = name("c")
        graph.initializer.append(helper.make_tensor(c, elem, list(dims), [value] if not dims else value))
        return c

    q, k, v, mask = node.input[:4]
    if layout == "BSH":
        d = int(a["head_dim"])

        def split(x: str, n: int) -> str:
            return op("Transpose", [op("Reshape", [x, const([0, 0, n, d], TensorProto.INT64, [4])])], perm=[0, 2, 1, 3])

        q, k, v = split(q, heads), split(k, kv), split(v, kv)
    if kv != heads:  # repeat_kv: [B, kv, S, D] -> [B, heads, S, D], as the body does it
        known = _static_shapes(graph)
        e5 = const([1, 1, heads // kv, 1, 1], TensorProto.INT64, [5])  # Expand broadcasts the new axis only
        axis = const([2], TensorProto.INT64, [1])
        r4 = {}

        def repeat(x: str, original: str) -> str:
            shape = known.get(original)
            if shape is not None and layout == "BSH":  # [B, S, kv*D] -> its heads' [B, kv, S, D]
                shape = [shape[0], kv, shape[1], shape[2] // kv] if len(shape) == 3 else None
            if shape is not None and len(shape) == 4:  # K and V of static shape: the export's constant target
                key = (shape[0], shape[2], shape[3])
                if key not in r4:
                    r4[key] = const([shape[0], heads, shape[2], shape[3]], TensorProto.INT64, [4])
            else:  # read off the tensor as it runs (each its own: a V batch may broadcast over K's)
                key = ("dynamic", x)
                if key not in r4:
                    r4[key] = op("Concat", [op("Shape", [x], start=0, end=1), const([heads], TensorProto.INT64, [1]),
                                            op("Shape", [x], start=2)], axis=0)
            return op("Reshape", [op("Expand", [op("Unsqueeze", [x, axis]), e5]), r4[key]], allowzero=1)

        k, v = repeat(k, node.input[1]), repeat(v, node.input[2])
    if float(a["scale_q"]) != 1.0:
        q = op("Mul", [q, const(float(a["scale_q"]), in_t)])
    kt = op("Transpose", [k], perm=[0, 1, 3, 2])
    if float(a["scale_k"]) != 1.0:  # on K^T, as torch's SDPA export writes it (the same bits as on K)
        kt = op("Mul", [kt, const(float(a["scale_k"]), in_t)])
    sc = op("MatMul", [q, kt])
    if sc_t != in_t:
        sc = op("Cast", [sc], to=sc_t)
    if float(a["scale_mul"]) != 1.0:
        sc = op("Mul", [sc, const(float(a["scale_mul"]), sc_t)])
    if float(a["scale_div"]) != 1.0:
        sc = op("Div", [sc, const(float(a["scale_div"]), sc_t)])
    if mask_kind != "none":
        sc = op("Add", [sc, mask])
    if sm_t != sc_t:
        sc = op("Cast", [sc], to=sm_t)
    p = op("Softmax", [sc], axis=-1)
    if int(a.get("nan_to_zero", 0)):
        p = op("Where", [op("IsNaN", [p]), const(0.0, sm_t), p])
    if out_t != sm_t:
        p = op("Cast", [p], to=out_t)
    if out_t != in_t:
        v = op("Cast", [v], to=out_t)
    y = op("MatMul", [p, v])
    if layout == "BSH":
        y = op("Reshape", [op("Transpose", [y], perm=[0, 2, 1, 3]), const([0, 0, heads * d], TensorProto.INT64, [3])])
    out[-1].output[0] = node.output[0]
    return out


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Fully static shapes the graph declares (value_info, inputs, outputs), by tensor name."""
    out = {}
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out
