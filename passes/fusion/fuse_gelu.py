"""The erf form of GELU, as exporters write it, becomes one op.

    Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)        (or x * 0.5 first, or x * (1/sqrt 2))
        =>  Gelu(x)                          opset 20+
        =>  graphpass.ascend::Gelu(x)        before opset 20, defined by its ONNX function body

Every intermediate must have no other reader. The constants match only when equal to sqrt 2,
1/sqrt 2, 1 and 0.5 exactly as x's type holds them (no near miss), have x's type, and do not
broadcast x to a higher rank. float32 and float64 only: a float16/bfloat16 decomposition rounds
at every step, and one Gelu kernel differs from it by more than the promised tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, Promise
from graphpass.passes.framework.rewrite import single_reader
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function, gelu_function
from graphpass.ir.graph import NameGen
from graphpass.passes.fusion._match import is_const, operands, producer_of, replace_matches, fused_kernel_refusal

__all__ = ["FuseGelu"]


def _erf_term(t: gs.Tensor, g: gs.Graph, local: set[int]) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """t = 1 + erf(x / sqrt 2): returns (x, nodes)."""
    add = producer_of(t, "Add", local)
    if add is None or not single_reader(t, g):
        return None
    for e, one in operands(add):
        erf = producer_of(e, "Erf", local)
        if erf is None or not is_const(one, 1.0, e) or not single_reader(e, g):
            continue
        scaled = erf.inputs[0]
        div = producer_of(scaled, "Div", local)
        if div is not None and is_const(div.inputs[1], math.sqrt(2.0), div.inputs[0]) and single_reader(scaled, g):
            return div.inputs[0], [div, erf, add]
        mul = producer_of(scaled, "Mul", local)
        if mul is not None and single_reader(scaled, g):
            for x, c in operands(mul):
                if is_const(c, 1 / math.sqrt(2.0), x):
                    return x, [mul, erf, add]
    return None


@dataclasses.dataclass
class _Hit:
    x: gs.Tensor
    nodes: list[gs.Node]


#: The types one Gelu kernel computes within the promised tolerance of the decomposition.


def _match(anchor: gs.Node, g: gs.Graph, local: set[int]) -> _Hit | None:
    if anchor.op != "Mul" or anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
        return None
    for p, q in operands(anchor):
        inner = producer_of(p, "Mul", local)
        if inner is None or not single_reader(p, g):
            continue
        if is_const(q, 0.5, p):  # (x * (1 + erf)) * 0.5
            for x, t in operands(inner):
                hit = _erf_term(t, g, local)
                if hit is not None and hit[0] is x:
                    return _Hit(x, hit[1] + [inner, anchor])
        for x, half in operands(inner):  # (x * 0.5) * (1 + erf)
            if is_const(half, 0.5, x):
                hit = _erf_term(q, g, local)
                if hit is not None and hit[0] is x:
                    return _Hit(x, hit[1] + [inner, anchor])
    return None


@register
class FuseGelu(Pass):
    """Recognizes the erf-form GELU subgraph.

    Cases:
      1. x / sqrt 2 or x * (1/sqrt 2) inside the erf;
      2. the 0.5 applied last or to x first; Add and Mul operands in either order;
      3. Gelu op from opset 20, a graphpass.ascend::Gelu device op (with its body, constants
         typed as x) before;
      4. float32 and float64; constants equal to GELU's exactly as that type holds them.
    """

    name = "fuse_gelu"
    summary = "Erf-form GELU subgraph -> Gelu (opset 20+) or a graphpass.ascend::Gelu device op."
    kind = PassKind.FUSION
    promise = Promise.tolerance("fused-kernel", rtol=1e-5, atol=1e-6, reason="one Gelu kernel instead of its erf decomposition: the same formula, rounded once per kernel")

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        opset = model_io.opset_of(graph) or graph.opset or 13
        names = NameGen(graph)

        def match(node, g, local):
            hit = _match(node, g, local)
            if hit is None:
                return None
            reason = fused_kernel_refusal(graph, "GELU", "Gelu", elem_type(hit.x.dtype), opset, standard_since=20)
            if reason:
                ctx.explain(self.name, node, reason)
                return None
            return hit

        def build(hit, out):
            if opset >= 20:
                return gs.Node("Gelu", name=names("gelu"), inputs=[hit.x], outputs=[out])
            ensure_function(graph, gelu_function(opset, elem_type(hit.x.dtype)))
            return gs.Node("Gelu", name=names("gelu"), domain=DOMAIN, inputs=[hit.x], outputs=[out])

        fired = replace_matches(graph, match, build, self.name, names)
        return PassResult(fired > 0, {"fired": fired})
