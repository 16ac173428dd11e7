"""The erf and tanh forms of GELU, as exporters write them, become one op.

    Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)        (or x * 0.5 first, or 0.5 * (1 + erf) first,
        =>  Gelu(x)                          opset 20+       or x * (1/sqrt 2))
        =>  graphpass.ascend::Gelu(x)        before opset 20, defined by its ONNX function body
    0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        =>  Gelu(x, approximate="tanh")      opset 20+
        =>  graphpass.ascend::GeluTanh(x)    before opset 20 (graphpass/ir/device_ops_tf.py)

Every intermediate must have no other reader. The constants match only when equal to sqrt 2,
1/sqrt 2, sqrt(2/pi), 0.044715, 3, 1 and 0.5 exactly as x's type holds them (no near miss), have
x's type, and do not broadcast x to a higher rank. float32 and float64 only: a float16/bfloat16 decomposition rounds
at every step, and one Gelu kernel differs from it by more than the promised tolerance.
"""

from __future__ import annotations

import dataclasses
import math

import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import Promise
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, single_reader
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function, gelu_function
from graphpass.ir.device_ops_tf import gelu_tanh_function
from graphpass.passes.fusion._match import is_const, operands, producer_of, fused_kernel_refusal

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
    tanh: bool = False  # the tanh approximation (GPT-2's gelu_new)


#: The types one Gelu kernel computes within the promised tolerance of the decomposition.


def _cube(t: gs.Tensor, x: gs.Tensor, g: gs.Graph, local: set[int]) -> list[gs.Node] | None:
    """t = Pow(x, 3) or (x * x) * x: the nodes."""
    p = producer_of(t, "Pow", local)
    if p is not None and p.inputs[0] is x and is_const(p.inputs[1], 3.0, x):
        return [p]
    m = producer_of(t, "Mul", local)
    if m is not None:
        for sq, xx in operands(m):
            m2 = producer_of(sq, "Mul", local)
            if xx is x and m2 is not None and m2.inputs[0] is x and m2.inputs[1] is x and single_reader(sq, g):
                return [m2, m]
    return None


def _tanh_term(t: gs.Tensor, g: gs.Graph, local: set[int]) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """t = 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)): returns (x, nodes)."""
    add = producer_of(t, "Add", local)
    if add is None or not single_reader(t, g):
        return None
    for e, one in operands(add):
        th = producer_of(e, "Tanh", local)
        if th is None or not is_const(one, 1.0, e) or not single_reader(e, g):
            continue
        u = th.inputs[0]
        mu = producer_of(u, "Mul", local)
        if mu is None or not single_reader(u, g):
            continue
        for inner, c in operands(mu):
            ia = producer_of(inner, "Add", local)
            if ia is None or not is_const(c, math.sqrt(2.0 / math.pi), inner) or not single_reader(inner, g):
                continue
            for x, kx3 in operands(ia):
                mk = producer_of(kx3, "Mul", local)
                if mk is None or not single_reader(kx3, g):
                    continue
                for x3, k in operands(mk):
                    if not is_const(k, 0.044715, x3) or not single_reader(x3, g):
                        continue
                    cube = _cube(x3, x, g, local)
                    if cube is not None:
                        return x, cube + [mk, ia, mu, th, add]
    return None


def _match(anchor: gs.Node, g: gs.Graph, local: set[int]) -> _Hit | None:
    if anchor.op != "Mul" or anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
        return None
    for term, tanh in ((_erf_term, False), (_tanh_term, True)):
        for p, q in operands(anchor):
            inner = producer_of(p, "Mul", local)
            if inner is None or not single_reader(p, g):
                continue
            if is_const(q, 0.5, p):  # (x * (1 + erf)) * 0.5
                for x, t in operands(inner):
                    hit = term(t, g, local)
                    if hit is not None and hit[0] is x:
                        return _Hit(x, hit[1] + [inner, anchor], tanh)
            for x, half in operands(inner):  # (x * 0.5) * (1 + erf)
                if is_const(half, 0.5, x):
                    hit = term(q, g, local)
                    if hit is not None and hit[0] is x:
                        return _Hit(x, hit[1] + [inner, anchor], tanh)
            for t, half in operands(inner):  # x * (0.5 * (1 + erf))   (the dynamo exporter's order)
                if is_const(half, 0.5, t):
                    hit = term(t, g, local)
                    if hit is not None and hit[0] is q:
                        return _Hit(q, hit[1] + [inner, anchor], tanh)
    return None


class _Gelu(Rule):
    """The DAG above, anchored at the last Mul."""

    name = "gelu"

    def anchors(self) -> frozenset[str]:
        return frozenset({"Mul"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        hit = _match(anchor, scope.graph, scope.local)
        if hit is None:
            return None
        m = scope.match(hit.nodes)
        m.x, m.tanh = hit.x, hit.tanh
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        reason = fused_kernel_refusal(m.root, "GELU", "GeluTanh" if m.tanh else "Gelu", elem_type(m.x.dtype), m.opset,
                                      standard_since=20)
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        if m.opset >= 20:
            return m.op("Gelu", [m.x], {"approximate": "tanh"} if m.tanh else None, name=m.names("gelu"))
        if m.tanh:
            ensure_function(m.root, gelu_tanh_function(m.opset, elem_type(m.x.dtype)))
            return m.op("GeluTanh", [m.x], domain=DOMAIN, name=m.names("gelu_tanh"))
        ensure_function(m.root, gelu_function(m.opset, elem_type(m.x.dtype)))
        return m.op("Gelu", [m.x], domain=DOMAIN, name=m.names("gelu"))


@register
class FuseGelu(RulePass):
    """Recognizes the erf-form GELU subgraph.

    Cases:
      1. x / sqrt 2 or x * (1/sqrt 2) inside the erf;
      2. the 0.5 applied last, to x first, or to the erf term (x * (0.5 * (1 + erf)), the dynamo
         exporter's order); Add and Mul operands in either order;
      3. Gelu op from opset 20, a graphpass.ascend::Gelu device op (with its body, constants
         typed as x) before;
      4. float32 and float64; constants equal to GELU's exactly as that type holds them;
      5. the tanh form (GPT-2's gelu_new): 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
         x^3 as Pow(x, 3) or x * x * x, the 0.5 placed as in 2 -> Gelu(approximate="tanh")
         (opset 20+) or a graphpass.ascend::GeluTanh device op before.
    """

    name = "fuse_gelu"
    summary = "Erf- and tanh-form GELU subgraphs -> Gelu (opset 20+) or a graphpass.ascend::Gelu / GeluTanh device op."
    kind = PassKind.FUSION
    promise = Promise.tolerance("fused-kernel", rtol=1e-5, atol=1e-6, reason="one Gelu kernel instead of its erf decomposition: the same formula, rounded once per kernel")

    rules = (_Gelu(),)
