"""Conv followed by its activation becomes one device op with an ONNX function body.

    Conv(x, W[, b]) -> Relu                    =>  graphpass.ascend::FusedConvRelu(x, W, b)
    Conv -> Clip(0, 6)                         =>  FusedConvRelu6
    Conv -> LeakyRelu(alpha)                   =>  FusedConvLeakyRelu(alpha)
    Conv -> HardSwish                          =>  FusedConvHardSwish
    Conv -> Sigmoid -> Mul(conv, sigmoid)      =>  FusedConvSiLU

On Ascend the activation runs in the Conv kernel's epilogue (UB fusion, TbeConv2DReluv2Pass),
saving a kernel launch and a GM round trip of the Conv output. Each fused op carries the Conv's
attributes and is defined by a model-local function (Conv then the activation), so the model
still runs in onnxruntime; ``--emit portable`` inlines it back to standard ONNX. Run after
fold_batchnorm so Conv+BN+Relu fuses too. A missing Conv bias becomes a bias of -0.0 (x + -0.0
is x bit for bit, -0.0 included; +0.0 would turn a -0.0 sum into +0.0). Conv of float32, float16,
bfloat16 or float64; Relu6's body holds its Clip bounds typed as the Conv (one body per model and
type: a second type of Relu6 Conv in the same model is refused with the reason).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope
from graphpass.ir import model_io
from graphpass.ir.device_ops import (CONV_ATTRS, DOMAIN, FLOAT_TYPES, FUSED_CONV, elem_type, ensure_function,
                                     function_type_conflict, fused_conv_function)

__all__ = ["FuseConvActivation"]


def _opset(graph: gs.Graph) -> int:
    return model_io.opset_of(graph) or graph.opset or 13


def _conv_type(conv: gs.Node) -> int | None:
    """The Conv's element type: its output's, else its input's or weight's."""
    for t in (conv.outputs[0], conv.inputs[0], conv.inputs[1]):
        elem = elem_type(t.dtype)
        if elem is not None:
            return elem
    return None


#: (element type, channels) -> the -0.0 bias array as onnx makes it (make_tensor then to_array:
#: ~40 us a call, once per fusion without a bias); each fusion gets its own copy
_ZERO_BIAS: dict[tuple[int, int], np.ndarray] = {}


def _zero_bias(elem: int, cout: int) -> np.ndarray:
    key = (elem, cout)
    arr = _ZERO_BIAS.get(key)
    if arr is None:
        if len(_ZERO_BIAS) >= 256:
            _ZERO_BIAS.clear()
        arr = _ZERO_BIAS[key] = onnx.numpy_helper.to_array(onnx.helper.make_tensor("b", elem, [cout], [-0.0] * cout))
    return arr.copy()


class _ConvAct(Rule):
    activation: str

    def __init__(self, act_op: str, activation: str):
        self.pattern = ("Conv", act_op)
        self.activation = activation
        self.name = f"conv_{activation.lower()}"

    def check(self, m: Match, ctx) -> MatchResult:
        conv = m.nodes[0]
        need = FUSED_CONV[self.activation][2]
        opset = _opset(m.root or m.graph)
        if opset < need:
            return MatchResult.fail(f"the model's opset {opset} is below {need}, which the fused body needs")
        elem = _conv_type(conv)
        if elem not in FLOAT_TYPES:
            return MatchResult.fail(f"Conv of dtype {conv.outputs[0].dtype} (float types only)")
        conflict = function_type_conflict(m.root or m.graph, FUSED_CONV[self.activation][0], elem)
        if conflict:
            return MatchResult.fail(conflict)
        return self.check_activation(m)

    def check_activation(self, m: Match) -> MatchResult:
        return MatchResult.success()

    def activation_attrs(self, act: gs.Node) -> dict:
        return {}

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        conv, act = m.nodes[0], m.nodes[-1]
        op, _, _ = FUSED_CONV[self.activation]
        top = m.root or m.graph  # functions live on the model's top graph
        elem = _conv_type(conv)
        if not any(f.domain == DOMAIN and f.name == op for f in top.functions):  # built once, not per match
            ensure_function(top, fused_conv_function(self.activation, _opset(top), elem))
        bias = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2].name else None
        if bias is None:
            cout = conv.inputs[1].shape[0] if conv.inputs[1].shape else None
            if cout is None or not isinstance(cout, int):
                raise AssertionError("checked: weight shape known")
            # -0.0: the additive identity (+0.0 would turn a -0.0 Conv output into +0.0)
            bias = gs.Constant(m.names(f"{conv.name or 'conv'}_zero_bias"), _zero_bias(elem, cout))
        attrs = {k: v for k, v in conv.attrs.items() if k in CONV_ATTRS}
        attrs.update(self.activation_attrs(act))
        # the Conv edited into the fused op when nothing else reads it (the same graph, no new node)
        return m.op(op, [conv.inputs[0], conv.inputs[1], bias], attrs, domain=DOMAIN,
                    name=m.names(f"{conv.name or 'conv'}_fused"), reuse=conv)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is not None and not (m.nodes[0].inputs[1].shape and isinstance(m.nodes[0].inputs[1].shape[0], int)):
            return None  # weight shape unknown: nothing to fuse against
        return m


class _Relu6(_ConvAct):
    def __init__(self):
        super().__init__("Clip", "Relu6")

    def check_activation(self, m: Match) -> MatchResult:
        clip = m.nodes[-1]
        if "min" in clip.attrs or "max" in clip.attrs:
            lo, hi = clip.attrs.get("min"), clip.attrs.get("max")
        else:
            bounds = [clip.inputs[i] if len(clip.inputs) > i and clip.inputs[i].name else None for i in (1, 2)]
            if any(b is not None and not isinstance(b, gs.Constant) for b in bounds):
                return MatchResult.fail("Clip bounds are not constants")
            lo, hi = (float(np.asarray(b.values)) if b is not None else None for b in bounds)
        if lo != 0.0 or hi != 6.0:
            return MatchResult.fail(f"Clip({lo}, {hi}) is not Relu6 (only Clip(0, 6) has a fused kernel)")
        if np.signbit(lo):
            return MatchResult.fail("Clip(-0.0, 6) gives -0.0 for negative inputs; Relu6's bound is +0.0")
        return MatchResult.success()


class _Leaky(_ConvAct):
    def __init__(self):
        super().__init__("LeakyRelu", "LeakyRelu")

    def activation_attrs(self, act: gs.Node) -> dict:
        return {"alpha": float(act.attrs.get("alpha", 0.01))}


class _SiLU(_ConvAct):
    """Conv -> Sigmoid -> Mul(conv, sigmoid): the Conv output has exactly those two readers."""

    def __init__(self):
        super().__init__("Mul", "SiLU")
        self.pattern = ("Conv", "Sigmoid", "Mul")

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if anchor.op != "Mul" or anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
            return None
        for sig_in, other in ((anchor.inputs[0], anchor.inputs[1]), (anchor.inputs[1], anchor.inputs[0])):
            sig = scope.producer(sig_in, "Sigmoid")
            if sig is None or not scope.single_reader(sig_in):
                continue
            conv = scope.producer(other, "Conv")
            if conv is None or sig.inputs[0] is not other or len(other.outputs) != 2 or scope.is_output(other):
                continue
            if not (conv.inputs[1].shape and isinstance(conv.inputs[1].shape[0], int)):
                return None
            return scope.match([conv, sig, anchor])
        return None


@register
class FuseConvActivation(RulePass):
    """Fuses a Conv with the activation after it into one graphpass.ascend device op.

    Cases:
      1. Relu, LeakyRelu(alpha), HardSwish directly after the Conv;
      2. Clip(0, 6) (Relu6), with bounds as inputs (opset 11+) or attributes;
      3. SiLU written as Sigmoid and Mul;
      4. a Conv without bias gets a bias of -0.0 (one signature per fused op);
      5. Conv of float32, float16, bfloat16 or float64 (Relu6's bounds typed as the Conv).
    """

    name = "fuse_conv_activation"
    summary = "Conv + Relu/Relu6/LeakyRelu/HardSwish/SiLU -> one graphpass.ascend FusedConv op."
    kind = PassKind.FUSION
    promise = EXACT
    ascend_name = "TbeConv2DReluv2Pass"
    rules = (_ConvAct("Relu", "Relu"), _Relu6(), _Leaky(), _ConvAct("HardSwish", "HardSwish"), _SiLU())
