"""LayerNorm over the last axis, as exporters write it before opset 17, becomes one op.

    mu = ReduceMean(x, [-1]); d = x - mu; var = ReduceMean(d ** 2, [-1])    (d ** 2 as Pow or d * d)
    y = d / Sqrt(var + eps) * scale + bias
        =>  LayerNormalization(x, scale, bias, axis=-1, epsilon=eps)   opset 17+
        =>  graphpass.ascend::LayerNorm(x, scale, bias, epsilon)       before, with its ONNX body

Refused silently when the reductions are not over the last axis only, or an intermediate has
another reader. A missing scale or bias becomes ones or zeros of the normalized size. The
exponent must be exactly 2; eps is taken from the graph exactly (a one-element constant of x's
type that the float ``epsilon`` attribute holds without rounding; else refused); scale and bias
must be constants of x's type that broadcast along the last axis only ([W], [1, W], a scalar,
... of rank <= x's), passed on as [W]. float32 and float64 only: a float16/bfloat16 decomposition
rounds at every step, and one kernel differs from it by more than the promised tolerance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import Promise
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, single_reader
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function, layer_norm_function
from graphpass.ir.shapes import static_shape
from graphpass.passes.fusion._match import const_value, is_const, no_broadcast, operands, producer_of, fused_kernel_refusal

__all__ = ["FuseLayerNorm"]


def _last_axis_mean(node: gs.Node | None, rank: int) -> bool:
    if node is None or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Constant):
        axes = [int(a) for a in np.asarray(node.inputs[1].values).ravel()]
    return axes is not None and [int(a) % rank for a in axes] == [rank - 1]


#: The types one LayerNormalization kernel computes within the promised tolerance.


def _last_axis_param(p: gs.Tensor | None, x: gs.Tensor, width: int) -> np.ndarray | None | bool:
    """A scale/bias constant as [W] values (None: absent); False when it does not broadcast along
    the last axis of ``x`` only, or has another type."""
    if p is None:
        return None
    if not isinstance(p, gs.Constant) or elem_type(p.dtype) != elem_type(x.dtype) or p.shape is None:
        return False
    shape = list(p.shape)
    if len(shape) > len(x.shape) or any(d != 1 for d in shape[:-1]) or (shape and shape[-1] not in (1, width)):
        return False
    return np.broadcast_to(np.asarray(p.values).reshape(-1), (width,)).copy()


@dataclasses.dataclass
class _Hit:
    x: gs.Tensor
    scale: np.ndarray | None
    bias: np.ndarray | None
    eps: float
    nodes: list[gs.Node]
    width: int


def _match(anchor: gs.Node, g: gs.Graph, local: set[int]) -> _Hit | None:
    """The matched LayerNorm, anchor being the final Add (or Mul, or Div)."""
    std = anchor.domain in (None, "", "ai.onnx")
    if not std:
        return None
    bias = scale = None
    nodes: list[gs.Node] = []
    t = anchor
    if t.op == "Add":
        for p, b in operands(t):
            mul = producer_of(p, "Mul", local)
            if mul is not None and isinstance(b, gs.Constant) and single_reader(p, g):
                bias, t, nodes = b, mul, [t]
                break
        else:
            return None
    if t.op == "Mul":
        for p, s in operands(t):
            div = producer_of(p, "Div", local)
            if div is not None and isinstance(s, gs.Constant) and single_reader(p, g):
                scale, nodes, t = s, nodes + [t], div
                break
        else:
            return None
    if t.op != "Div":
        return None
    d, sd = t.inputs
    sqrt = producer_of(sd, "Sqrt", local)
    sub = producer_of(d, "Sub", local)
    if sqrt is None or sub is None or not single_reader(sd, g):
        return None
    add = producer_of(sqrt.inputs[0], "Add", local)
    if add is None or not single_reader(sqrt.inputs[0], g):
        return None
    var_t, eps_t = next(((a, b) for a, b in operands(add) if const_value(b) is not None), (None, None))
    if var_t is None or elem_type(eps_t.dtype) != elem_type(var_t.dtype) or not no_broadcast(eps_t, var_t):
        return None
    eps = const_value(eps_t)
    if float(np.float32(eps)) != eps:
        return None  # the epsilon attribute is a float: it would round this eps
    var = producer_of(var_t, "ReduceMean", local)
    if var is None or not single_reader(var_t, g):
        return None
    pow_ = producer_of(var.inputs[0], "Pow", local)
    square = producer_of(var.inputs[0], "Mul", local)  # d * d: the other spelling of d ** 2
    if square is not None and square.inputs[0] is d and square.inputs[1] is d and single_reader(var.inputs[0], g):
        pow_ = square
    elif pow_ is None or pow_.inputs[0] is not d or not is_const(pow_.inputs[1], 2.0) \
            or not no_broadcast(pow_.inputs[1], d) or not single_reader(var.inputs[0], g):
        return None
    x, mu_t = sub.inputs
    mean = producer_of(mu_t, "ReduceMean", local)
    # d is read by the square (once as Pow, twice as Mul(d, d)) and the Div
    if mean is None or mean.inputs[0] is not x or not single_reader(mu_t, g) \
            or {id(n) for n in d.outputs} != {id(pow_), id(t)}:
        return None
    shape = static_shape(x)
    if shape is None or not shape:
        return None
    if not _last_axis_mean(mean, len(shape)) or not _last_axis_mean(var, len(shape)):
        return None
    scale_v, bias_v = _last_axis_param(scale, x, shape[-1]), _last_axis_param(bias, x, shape[-1])
    if scale_v is False or bias_v is False:
        return None
    return _Hit(x, scale_v, bias_v, eps, nodes + [t, sqrt, add, var, pow_, sub, mean], shape[-1])


class _LayerNorm(Rule):
    """The DAG above, anchored at the final Add (with bias), Mul (scale only) or Div (bare)."""

    name = "layer_norm"

    def anchors(self) -> frozenset[str]:
        return frozenset({"Add", "Mul", "Div"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        hit = _match(anchor, scope.graph, scope.local)
        if hit is None:
            return None
        m = scope.match(list(reversed(hit.nodes)))  # anchor last
        m.hit = hit
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        # the body takes epsilon by Constant(value_float): opset 12+
        reason = fused_kernel_refusal(m.root, "LayerNorm", "LayerNorm", elem_type(m.hit.x.dtype), m.opset,
                                      standard_since=17, body_since=12)
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        hit, names = m.hit, m.names
        dtype = np.dtype(hit.x.dtype)
        # a missing bias is -0.0: the additive identity (+0.0 would turn -0.0 into +0.0)
        scale = gs.Constant(names("ln_scale"), hit.scale if hit.scale is not None else np.ones(hit.width, dtype))
        bias = gs.Constant(names("ln_bias"), hit.bias if hit.bias is not None else np.full(hit.width, -0.0, dtype))
        if m.opset >= 17:
            return m.op("LayerNormalization", [hit.x, scale, bias], {"axis": -1, "epsilon": float(hit.eps)},
                        name=names("layer_norm"))
        ensure_function(m.root, layer_norm_function(m.opset, elem_type(hit.x.dtype)))
        return m.op("LayerNorm", [hit.x, scale, bias], {"epsilon": float(hit.eps)}, domain=DOMAIN,
                    name=names("layer_norm"))


@register
class FuseLayerNorm(RulePass):
    """Recognizes the exported LayerNorm subgraph over the last axis.

    Cases:
      1. with scale and bias, with scale only, or bare (ones / zeros supplied);
      2. ReduceMean axes as an attribute or an input (opset 18); d ** 2 as Pow(d, 2) or Mul(d, d);
      3. LayerNormalization from opset 17, a graphpass.ascend::LayerNorm device op before;
      4. float32 and float64, eps exact, scale/bias along the last axis only (passed as [W]).
    """

    name = "fuse_layer_norm"
    summary = "LayerNorm subgraph over the last axis -> LayerNormalization (opset 17+) or a device op."
    kind = PassKind.FUSION
    promise = Promise.tolerance("fused-kernel", rtol=1e-5, atol=1e-6, reason="one LayerNormalization kernel instead of its decomposition: mean/variance summed in another order")

    # consumers first: the largest match (with bias) wins over the bare Div inside it
    reverse = True
    rules = (_LayerNorm(),)
