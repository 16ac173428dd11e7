"""Transformer device ops of the ``graphpass.ascend`` domain: RmsNorm, AddRmsNorm, RotaryEmbedding
and SwiGlu, each with the ONNX function body that defines it (see :mod:`graphpass.ir.device_ops`).

Each body computes the ops the exporters write, in their order, so a fusion that only gathers
them into one call changes no bit (the passes in ``passes/fusion`` say which spellings they take):

- ``RmsNorm(X, Gamma)``, attribute ``epsilon``:
  ``Gamma * (x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2), [-1]) + eps)))`` with ``x = X``; for a
  float16/bfloat16 ``X`` the exporters' upcast: ``x = Cast(X, float)`` and the normalized value
  cast back to X's type before the weight (what ``LlamaRMSNorm`` writes). CANN RmsNorm.
- ``AddRmsNorm(X1, X2, Gamma) -> (Y, XOut)``: ``XOut = X1 + X2`` and ``Y = RmsNorm(XOut, Gamma)``
  (the residual add before the norm, both results read). CANN AddRmsNorm.
- ``RotaryEmbedding(X, Cos, Sin)``, rotate-half form (GPT-NeoX / LLaMA):
  ``X * Cos + Concat(-X[..., D/2:], X[..., :D/2]) * Sin``. CANN RotaryPositionEmbedding mode 0.
- ``RotaryEmbeddingInterleaved(X, Cos, Sin)``, GPT-J's form: the rotation of (even, odd) pairs,
  ``Reshape(Concat(Unsqueeze(-X[..., 1::2]), Unsqueeze(X[..., ::2]), -1), Shape(X))``. CANN
  RotaryPositionEmbedding mode 1.
- ``SwiGlu(X)``, attribute-free, halves on the last axis: ``A, B = Split(X); (A * Sigmoid(A)) * B``.
  CANN SwiGlu (dim -1).

The bodies holding float constants (2, eps) are typed for one float type (one body per model and
op, as Gelu's and LayerNorm's are); RotaryEmbedding and SwiGlu are polymorphic.
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto, helper

__all__ = ["TYPED_OPS", "OPS", "compute_type", "rms_norm_function", "add_rms_norm_function", "rotary_function",
           "swiglu_function", "gelu_tanh_function", "rotary_interleaved_function", "geglu_function", "bodies"]

DOMAIN = "graphpass.ascend"

#: the device ops of this module whose bodies hold typed constants
TYPED_OPS = ("RmsNorm", "AddRmsNorm", "GeluTanh", "GeGlu", "GeGluTanh")
#: every device op of this module
OPS = ("RmsNorm", "AddRmsNorm", "RotaryEmbedding", "RotaryEmbeddingInterleaved", "SwiGlu", "GeluTanh", "GeGlu",
       "GeGluTanh")

_LOW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def compute_type(elem: int) -> int:
    """The type an RmsNorm on ``elem`` computes in: float for float16/bfloat16 (the exporters'
    upcast), else ``elem`` itself."""
    return TensorProto.FLOAT if elem in _LOW else elem


def _typed(fn: onnx.FunctionProto, elem: int) -> onnx.FunctionProto:
    from graphpass.ir.device_ops import _TYPED

    fn.doc_string = _TYPED + TensorProto.DataType.Name(elem)
    return fn


def _axes_last(opset: int) -> tuple[list[onnx.NodeProto], dict]:
    """ReduceMean over the last axis: the axes input from opset 18, else the attribute."""
    if opset >= 18:
        return [helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TensorProto.INT64, [1], [-1]))], {}
    return [], {"axes": [-1]}


def _rms_body(x: str, gamma: str, y: str, opset: int, elem: int) -> list[onnx.NodeProto]:
    comp = compute_type(elem)
    nodes: list[onnx.NodeProto] = []
    if comp != elem:
        nodes.append(helper.make_node("Cast", [x], ["xc"], to=comp))
        x = "xc"
    eps_f = helper.make_node("Constant", [], ["eps" if comp == TensorProto.FLOAT else "eps_f"])
    ref = helper.make_attribute_ref("value_float", AttributeProto.FLOAT)
    ref.ref_attr_name = "epsilon"
    eps_f.attribute.append(ref)
    nodes.append(eps_f)
    if comp != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["eps_f"], ["eps"], to=comp))
    axes_nodes, axes_attr = _axes_last(opset)
    nodes += axes_nodes
    nodes += [helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", comp, [], [2.0])),
              helper.make_node("Pow", [x, "two"], ["sq"]),
              helper.make_node("ReduceMean", ["sq"] + (["ax"] if opset >= 18 else []), ["ms"], keepdims=1, **axes_attr),
              helper.make_node("Add", ["ms", "eps"], ["mse"]),
              helper.make_node("Sqrt", ["mse"], ["rms"]),
              helper.make_node("Reciprocal", ["rms"], ["rstd"]),
              helper.make_node("Mul", [x, "rstd"], ["nc"])]
    if comp != elem:
        nodes.append(helper.make_node("Cast", ["nc"], ["n"], to=elem))
    else:
        nodes[-1].output[0] = "n"
    nodes.append(helper.make_node("Mul", [gamma, "n"], [y]))
    return nodes


def rms_norm_function(opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """``RmsNorm(X, Gamma)`` over the last axis, attribute ``epsilon``; typed for ``elem``."""
    fn = helper.make_function(DOMAIN, "RmsNorm", ["X", "Gamma"], ["Y"], _rms_body("X", "Gamma", "Y", opset, elem),
                              [helper.make_opsetid("", opset)], attributes=["epsilon"])
    return _typed(fn, elem)


def add_rms_norm_function(opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """``AddRmsNorm(X1, X2, Gamma) -> (Y, XOut)``: ``XOut = X1 + X2``, ``Y = RmsNorm(XOut)``."""
    body = [helper.make_node("Add", ["X1", "X2"], ["XOut"])] + _rms_body("XOut", "Gamma", "Y", opset, elem)
    fn = helper.make_function(DOMAIN, "AddRmsNorm", ["X1", "X2", "Gamma"], ["Y", "XOut"], body,
                              [helper.make_opsetid("", opset)], attributes=["epsilon"])
    return _typed(fn, elem)


def _i64(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))


def rotary_function(opset: int) -> onnx.FunctionProto:
    """``RotaryEmbedding(X, Cos, Sin)``, rotate-half: ``X*Cos + Concat(-X2, X1)*Sin`` (halves of
    the last axis). Needs opset 15 (Shape's start attribute)."""
    body = [helper.make_node("Shape", ["X"], ["d"], start=-1),
            _i64("zero", [0]), _i64("two", [2]), _i64("axis", [-1]),
            helper.make_node("Div", ["d", "two"], ["h"]),
            helper.make_node("Mul", ["X", "Cos"], ["xc"]),
            helper.make_node("Slice", ["X", "zero", "h", "axis"], ["x1"]),
            helper.make_node("Slice", ["X", "h", "d", "axis"], ["x2"]),
            helper.make_node("Neg", ["x2"], ["nx2"]),
            helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
            helper.make_node("Mul", ["rot", "Sin"], ["rs"]),
            helper.make_node("Add", ["xc", "rs"], ["Y"])]
    return helper.make_function(DOMAIN, "RotaryEmbedding", ["X", "Cos", "Sin"], ["Y"], body,
                                [helper.make_opsetid("", opset)])


def rotary_interleaved_function(opset: int) -> onnx.FunctionProto:
    """``RotaryEmbeddingInterleaved(X, Cos, Sin)`` (GPT-J's rotate_every_two):
    ``X*Cos + Reshape(Concat(Unsqueeze(-X[..., 1::2]), Unsqueeze(X[..., ::2]), -1), Shape(X))*Sin``.
    Opset 13+ (Unsqueeze's axes input)."""
    body = [_i64("zero", [0]), _i64("one", [1]), _i64("end", [2 ** 62]), _i64("axis", [-1]), _i64("two", [2]),
            helper.make_node("Mul", ["X", "Cos"], ["xc"]),
            helper.make_node("Slice", ["X", "zero", "end", "axis", "two"], ["xe"]),
            helper.make_node("Slice", ["X", "one", "end", "axis", "two"], ["xo"]),
            helper.make_node("Neg", ["xo"], ["nxo"]),
            helper.make_node("Unsqueeze", ["nxo", "axis"], ["a"]),
            helper.make_node("Unsqueeze", ["xe", "axis"], ["b"]),
            helper.make_node("Concat", ["a", "b"], ["st"], axis=-1),
            helper.make_node("Shape", ["X"], ["shp"]),
            helper.make_node("Reshape", ["st", "shp"], ["rot"]),
            helper.make_node("Mul", ["rot", "Sin"], ["rs"]),
            helper.make_node("Add", ["xc", "rs"], ["Y"])]
    return helper.make_function(DOMAIN, "RotaryEmbeddingInterleaved", ["X", "Cos", "Sin"], ["Y"], body,
                                [helper.make_opsetid("", opset)])


def swiglu_function(opset: int) -> onnx.FunctionProto:
    """``SwiGlu(X)``: the halves A, B of the last axis; ``(A * Sigmoid(A)) * B``. Opset 13+ (Slice
    by inputs, as the rotary body)."""
    body = [helper.make_node("Shape", ["X"], ["d"], start=-1),
            _i64("zero", [0]), _i64("two", [2]), _i64("axis", [-1]),
            helper.make_node("Div", ["d", "two"], ["h"]),
            helper.make_node("Slice", ["X", "zero", "h", "axis"], ["a"]),
            helper.make_node("Slice", ["X", "h", "d", "axis"], ["b"]),
            helper.make_node("Sigmoid", ["a"], ["s"]),
            helper.make_node("Mul", ["a", "s"], ["g"]),
            helper.make_node("Mul", ["g", "b"], ["Y"])]
    return helper.make_function(DOMAIN, "SwiGlu", ["X"], ["Y"], body, [helper.make_opsetid("", opset)])


def gelu_tanh_function(opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """``GeluTanh(X) = X * 0.5 * (1 + tanh(sqrt(2/pi) * (X + 0.044715 * X^3)))`` (GPT-2's gelu_new;
    ``Gelu(approximate="tanh")`` from opset 20), its constants of type ``elem``."""
    import math

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, elem, [], [v]))

    body = [const("three", 3.0), const("k", 0.044715), const("c", math.sqrt(2.0 / math.pi)), const("one", 1.0),
            const("half", 0.5),
            helper.make_node("Pow", ["X", "three"], ["x3"]), helper.make_node("Mul", ["x3", "k"], ["kx3"]),
            helper.make_node("Add", ["X", "kx3"], ["inner"]), helper.make_node("Mul", ["inner", "c"], ["u"]),
            helper.make_node("Tanh", ["u"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
            helper.make_node("Mul", ["X", "half"], ["xh"]), helper.make_node("Mul", ["xh", "t1"], ["Y"])]
    return _typed(helper.make_function(DOMAIN, "GeluTanh", ["X"], ["Y"], body, [helper.make_opsetid("", opset)]), elem)


def geglu_function(opset: int, elem: int = TensorProto.FLOAT, tanh: bool = False) -> onnx.FunctionProto:
    """``GeGlu(X)`` / ``GeGluTanh(X)``: the halves A, B of the last axis; ``Gelu(A) * B`` with the
    Gelu as graphpass writes it at ``opset``: the standard op from opset 20 (``approximate``
    "none" / "tanh"), else the body of the ``graphpass.ascend::Gelu`` / ``GeluTanh`` device op
    (constants of type ``elem``), inlined. Opset 15+ (Shape's start)."""
    from graphpass.ir.device_ops import gelu_function

    name = "GeGluTanh" if tanh else "GeGlu"
    body = [helper.make_node("Shape", ["X"], ["d"], start=-1),
            _i64("zero", [0]), _i64("two_i", [2]), _i64("axis", [-1]),
            helper.make_node("Div", ["d", "two_i"], ["h"]),
            helper.make_node("Slice", ["X", "zero", "h", "axis"], ["a"]),
            helper.make_node("Slice", ["X", "h", "d", "axis"], ["b"])]
    if opset >= 20:
        body.append(helper.make_node("Gelu", ["a"], ["g"], approximate="tanh" if tanh else "none"))
    else:
        inner = (gelu_tanh_function if tanh else gelu_function)(opset, elem)
        rename = {"X": "a", "Y": "g"}
        for n in inner.node:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.input[:] = [rename.get(i, "gelu_" + i) for i in c.input]
            c.output[:] = [rename.get(o, "gelu_" + o) for o in c.output]
            body.append(c)
    body.append(helper.make_node("Mul", ["g", "b"], ["Y"]))
    return _typed(helper.make_function(DOMAIN, name, ["X"], ["Y"], body, [helper.make_opsetid("", opset)]), elem)


#: the opset each body needs at least (Shape(start=) is opset 15)
MIN_OPSET = {"RmsNorm": 13, "AddRmsNorm": 13, "RotaryEmbedding": 15, "RotaryEmbeddingInterleaved": 13, "SwiGlu": 15,
             "GeGlu": 15, "GeGluTanh": 15}


def bodies(name: str, opset: int, float_types) -> list[onnx.FunctionProto]:
    """Every body this module writes for ``name`` at ``opset`` (one per float type where typed)."""
    if name == "RmsNorm":
        return [rms_norm_function(opset, e) for e in float_types]
    if name == "AddRmsNorm":
        return [add_rms_norm_function(opset, e) for e in float_types]
    if name == "RotaryEmbedding":
        return [rotary_function(opset)]
    if name == "SwiGlu":
        return [swiglu_function(opset)]
    if name == "RotaryEmbeddingInterleaved":
        return [rotary_interleaved_function(opset)]
    if name == "GeluTanh":
        return [gelu_tanh_function(opset, e) for e in float_types]
    if name in ("GeGlu", "GeGluTanh"):
        return [geglu_function(opset, e, name == "GeGluTanh") for e in float_types]
    return []
