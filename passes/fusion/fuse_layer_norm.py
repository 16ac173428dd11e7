"""LayerNorm over the last axis, as exporters write it before opset 17, becomes one op.

    mu = ReduceMean(x, [-1]); d = x - mu; var = ReduceMean(d ** 2, [-1])
    y = d / Sqrt(var + eps) * scale + bias
        =>  LayerNormalization(x, scale, bias, axis=-1, epsilon=eps)   opset 17+
        =>  graphpass.ascend::LayerNorm(x, scale, bias, epsilon)       before, with its ONNX body

Refused silently when the reductions are not over the last axis only, or an intermediate has
another reader. A missing scale or bias becomes ones or zeros of the normalized size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.infra import PassKind, PassResult, register
from graphpass.infra.pass_base import Pass, Promise
from graphpass.infra.rewrite import single_reader
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, ensure_function, layer_norm_function
from graphpass.ir.graph import NameGen
from graphpass.ir.shapes import static_shape
from graphpass.passes.fusion._match import const_value, is_const, operands, producer_of, replace_matches

__all__ = ["FuseLayerNorm"]


def _last_axis_mean(node: gs.Node | None, rank: int) -> bool:
    if node is None or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Constant):
        axes = [int(a) for a in np.asarray(node.inputs[1].values).ravel()]
    return axes is not None and [int(a) % rank for a in axes] == [rank - 1]


@dataclasses.dataclass
class _Hit:
    x: gs.Tensor
    scale: gs.Tensor | None
    bias: gs.Tensor | None
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
    if var_t is None:
        return None
    var = producer_of(var_t, "ReduceMean", local)
    if var is None or not single_reader(var_t, g):
        return None
    pow_ = producer_of(var.inputs[0], "Pow", local)
    if pow_ is None or pow_.inputs[0] is not d or not is_const(pow_.inputs[1], 2.0) or not single_reader(var.inputs[0], g):
        return None
    x, mu_t = sub.inputs
    mean = producer_of(mu_t, "ReduceMean", local)
    if mean is None or mean.inputs[0] is not x or not single_reader(mu_t, g) or len(d.outputs) != 2:
        return None
    shape = static_shape(x)
    if shape is None or not _last_axis_mean(mean, len(shape)) or not _last_axis_mean(var, len(shape)):
        return None
    return _Hit(x, scale, bias, const_value(eps_t), nodes + [t, sqrt, add, var, pow_, sub, mean], shape[-1])


@register
class FuseLayerNorm(Pass):
    """Recognizes the exported LayerNorm subgraph over the last axis.

    Cases:
      1. with scale and bias, with scale only, or bare (ones / zeros supplied);
      2. ReduceMean axes as an attribute or an input (opset 18);
      3. LayerNormalization from opset 17, a graphpass.ascend::LayerNorm device op before.
    """

    name = "fuse_layer_norm"
    summary = "LayerNorm subgraph over the last axis -> LayerNormalization (opset 17+) or a device op."
    kind = PassKind.FUSION
    promise = Promise.tolerance("fused-kernel", rtol=1e-5, atol=1e-6, reason="one LayerNormalization kernel instead of its decomposition: mean/variance summed in another order")

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        opset = model_io.opset_of(graph) or graph.opset or 13
        names = NameGen(graph)

        def build(hit, out):
            dtype = np.dtype(hit.x.dtype) if hit.x.dtype is not None else np.float32
            scale = hit.scale if hit.scale is not None else gs.Constant(names("ln_scale"), np.ones(hit.width, dtype))
            bias = hit.bias if hit.bias is not None else gs.Constant(names("ln_bias"), np.zeros(hit.width, dtype))
            if opset >= 17:
                return gs.Node("LayerNormalization", name=names("layer_norm"), inputs=[hit.x, scale, bias], outputs=[out],
                               attrs={"axis": -1, "epsilon": float(hit.eps)})
            ensure_function(graph, layer_norm_function(opset))
            return gs.Node("LayerNorm", name=names("layer_norm"), domain=DOMAIN, inputs=[hit.x, scale, bias],
                           outputs=[out], attrs={"epsilon": float(hit.eps)})

        def match(node, g, local):
            return _match(node, g, local) if node.op in ("Add", "Mul", "Div") else None

        # consumers first: the largest match (with bias) wins over the bare Div inside it
        fired = replace_matches(graph, match, build, self.name, names, anchors_last_first=True)
        return PassResult(fired > 0, {"fired": fired})
