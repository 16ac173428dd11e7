"""RMSNorm, as exporters write it, becomes one ``graphpass.ascend::RmsNorm`` device op, and a
residual Add feeding it joins it as ``graphpass.ascend::AddRmsNorm``.

    x = X  (or Cast(X, float) for a float16/bfloat16 X: the upcast LlamaRMSNorm writes)
    n = x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2), [-1]) + eps))      (or 1 / Sqrt(...), Mul(x, x))
    Y = Gamma * n   (or Gamma * Cast(n, X's type))
        =>  RmsNorm(X, Gamma, epsilon)                       CANN RmsNorm
    S = X1 + X2 read by that RmsNorm (and by the next residual Add)
        =>  (Y, S) = AddRmsNorm(X1, X2, Gamma, epsilon)     CANN AddRmsNorm

Exact: the device op's body (graphpass/ir/device_ops_tf.py) computes these very ops in this order
(Pow(x, 2) and x * x are both the one rounding of x squared; Reciprocal(s) and 1 / s the one
rounding of 1/s; the operands of a Mul or Add swapped give the same bits). Not fused (and the
report says why): x / Sqrt(...) (another rounding than x * (1/Sqrt)), a float16/bfloat16 norm
computed in its own type (the body and CANN's kernel compute in float32), eps that the float
``epsilon`` attribute does not hold exactly, a weight that is not a constant of X's type along
the last axis, and a target without the kernel or the dtype (cost_model/data/transformer_ops.toml).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphpass.cost_model.transformer_ops import refusal as target_refusal
from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, elem_type, ensure_function, function_type_conflict
from graphpass.ir.device_ops_tf import MIN_OPSET, add_rms_norm_function, compute_type, rms_norm_function
from graphpass.ir.graph import iter_graphs
from graphpass.passes.framework import MatchResult, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, Rule, RulePass, Scope, single_reader
from graphpass.passes.fusion._match import const_value, dtype_name, is_const, no_broadcast, np_dtype, operands, producer_of

__all__ = ["FuseRmsNorm"]

_LOW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
_OK = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _last_axis(node: gs.Node, x: gs.Tensor) -> bool:
    if int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Constant):
        axes = [int(a) for a in np.asarray(node.inputs[1].values).ravel()]
    if axes is None or len(axes) != 1:
        return False
    if axes[0] == -1:
        return True
    return x.shape is not None and axes[0] == len(x.shape) - 1


@dataclasses.dataclass
class _Hit:
    x: gs.Tensor  # the op's input X (before the upcast)
    gamma: gs.Constant
    eps: float
    nodes: list[gs.Node]
    why_not: str = ""  # a refusal found while matching (the check reports it)
    #: (the export's Cast down, its weight Mul) of a float32 norm cast down before a float16
    #: weight: the op takes ones as its weight and these two stay after it
    mixed: tuple[gs.Node, gs.Node] | None = None
    #: (the upcast, the norm's nodes, the Cast down, the weight Mul) of the float16/bfloat16 form
    upcast: tuple | None = None
    #: no weight Mul follows: the op's weight is ones of x's type and width
    weightless: bool = False


def _rstd(r: gs.Tensor, local: set[int]) -> tuple[gs.Tensor, gs.Node] | None:
    """r = Reciprocal(s) or 1 / s: (s, node)."""
    rec = producer_of(r, "Reciprocal", local)
    if rec is not None:
        return rec.inputs[0], rec
    div = producer_of(r, "Div", local)
    if div is not None and is_const(div.inputs[0], 1.0, div.inputs[1]):
        return div.inputs[1], div
    return None


def _squares(sq: gs.Tensor, x: gs.Tensor, local: set[int]) -> gs.Node | None:
    p = producer_of(sq, "Pow", local)
    if p is not None and p.inputs[0] is x and is_const(p.inputs[1], 2.0) and no_broadcast(p.inputs[1], x) \
            and elem_type(p.inputs[1].dtype) == elem_type(x.dtype):
        return p
    m = producer_of(sq, "Mul", local)
    if m is not None and m.inputs[0] is x and m.inputs[1] is x:
        return m
    return None


def _norm(nc: gs.Tensor, g: gs.Graph, local: set[int], last: bool = False
          ) -> tuple[gs.Tensor, float, list[gs.Node], str] | None:
    """nc = x * rstd(x): (x, eps, nodes, why not). ``last``: nc is the norm's result (no weight
    follows), read by anything."""
    mul = producer_of(nc, "Mul", local)
    if mul is None or (not last and not single_reader(nc, g)):
        return None
    for x, r in operands(mul):
        got = _rstd(r, local)
        if got is None or not single_reader(r, g):
            continue
        s, rnode = got
        sqrt = producer_of(s, "Sqrt", local)
        if sqrt is None or not single_reader(s, g):
            continue
        add = producer_of(sqrt.inputs[0], "Add", local)
        if add is None or not single_reader(sqrt.inputs[0], g):
            continue
        ms, eps_t = next(((a, b) for a, b in operands(add) if const_value(b) is not None), (None, None))
        if ms is None or elem_type(eps_t.dtype) != elem_type(ms.dtype) or not no_broadcast(eps_t, ms):
            continue
        rm = producer_of(ms, "ReduceMean", local)
        if rm is None or not single_reader(ms, g) or not _last_axis(rm, x):
            continue
        sq = rm.inputs[0]
        p = _squares(sq, x, local)
        if p is None or not single_reader(sq, g):
            continue
        eps = const_value(eps_t)
        why = ""
        if float(np.float32(eps)) != eps:
            why = f"eps {eps!r} is not a float32 value: the epsilon attribute (a float) would round it"
        return x, eps, [p, rm, add, sqrt, rnode, mul], why
    return None


def _match(anchor: gs.Node, g: gs.Graph, local: set[int], outputs: set[int]) -> _Hit | None:
    if anchor.op != "Mul" or anchor.domain not in (None, "", "ai.onnx") or len(anchor.inputs) != 2:
        return None
    for n_t, gamma in operands(anchor):
        if not isinstance(gamma, gs.Constant):
            continue
        down = producer_of(n_t, "Cast", local)
        nc = down.inputs[0] if down is not None else n_t
        shared_down = down is not None and not single_reader(n_t, g)  # the Cast down read elsewhere too
        got = _norm(nc, g, local)
        if got is None:
            continue
        x, eps, nodes, why = got
        if down is not None:  # Gamma * Cast(n): x must be the upcast of an X of that type
            up = producer_of(x, "Cast", local)
            X = up.inputs[0] if up is not None else None
            to = int(down.attrs.get("to", 0))
            if elem_type(x.dtype) != TensorProto.FLOAT or to not in _LOW:
                continue
            if up is None or elem_type(X.dtype) != to:
                # a float32 x that is no upcast (the TorchScript export of a float16 LLaMA keeps the
                # residual stream in float32): the norm in float32 with a weight of ones (x * 1 is
                # x), then the export's own Cast and weight Mul, outside the op (so they may be
                # read elsewhere too)
                hit = _Hit(x, gamma, eps, nodes, why)
                hit.mixed = (down, anchor)
                return _checked(hit, x, gamma, None)
            if shared_down:
                continue
            # the upcast may be read elsewhere too (the torchscript export's residual Add reads
            # it): it then stays for those readers, and the op casts X itself, to the same values
            hit = _Hit(X, gamma, eps, [up] + nodes + [down, anchor], why)
            hit.upcast = (up, nodes, down, anchor)
            return _checked(hit, X, gamma, down)
        hit = _Hit(x, gamma, eps, nodes + [anchor], why)
        return _checked(hit, x, gamma, down)
    # no weight (torch.nn.RMSNorm(elementwise_affine=False), or a weight of ones that
    # eliminate_identity removed): the norm's own last Mul, the op's weight ones of x's type
    readers = anchor.outputs[0].outputs
    weighted = any(r.op == "Cast" or (r.op == "Mul" and any(isinstance(t, gs.Constant) for t in r.inputs))
                   for r in readers)  # the weighted forms above take those (or refuse them with the reason)
    if not weighted and not any(isinstance(t, gs.Constant) for t in anchor.inputs):
        got = _norm(anchor.outputs[0], g, local, last=True)
        if got is not None and got[2][-1] is anchor:
            x, eps, nodes, why = got
            elem = elem_type(x.dtype)
            ones = gs.Constant("", np.ones(1, dtype=np_dtype(elem))) if elem in _OK else None
            hit = _Hit(x, ones, eps, nodes, why)
            hit.weightless = True
            if ones is None:
                hit.why_not = f"type {TensorProto.DataType.Name(elem) if elem else 'unknown'} is not a float type"
                return hit
            return _checked(hit, x, ones, None)
    return None


def _checked(hit: "_Hit", x: gs.Tensor, gamma: gs.Constant, down: gs.Node | None) -> "_Hit":
    """``hit`` with ``why_not`` set where the body or the target cannot take it (the eps reason
    found while matching comes last)."""
    eps_why, hit.why_not = hit.why_not, ""
    elem = elem_type(x.dtype)
    if hit.mixed is not None or hit.weightless:  # the op's weight is ones of x's width
        width = x.shape[-1] if x.shape else None
        if not isinstance(width, (int, np.integer)) or width <= 0:
            hit.why_not = "the width of a float32 norm cast down before its weight is not static"
        elif gamma.shape is None or any(d != 1 for d in list(gamma.shape)[:-1]):
            hit.why_not = f"a weight shaped {gamma.shape} is not along the last axis only"
        elif hit.weightless and elem in _LOW:
            hit.why_not = (f"a {TensorProto.DataType.Name(elem).lower()} RMSNorm computed in its own type: the "
                           "RmsNorm body (and CANN's kernel) computes in float32")
    elif elem_type(gamma.dtype) != elem:
        hit.why_not = "the weight is not of the input's type"
    elif gamma.shape is None or (x.shape is not None and len(gamma.shape) > len(x.shape)) \
            or any(d != 1 for d in list(gamma.shape)[:-1]):
        hit.why_not = f"a weight shaped {gamma.shape} is not along the last axis only"
    elif down is None and elem in _LOW:
        hit.why_not = (f"a {TensorProto.DataType.Name(elem).lower()} RMSNorm computed in its own type: the "
                       "RmsNorm body (and CANN's kernel) computes in float32")
    elif elem not in _OK:
        hit.why_not = f"type {TensorProto.DataType.Name(elem) if elem else 'unknown'} is not a float type"
    hit.why_not = hit.why_not or eps_why
    return hit


class _RmsNorm(Rule):
    """The DAG above, anchored at the weight Mul."""

    name = "rms_norm"
    #: the model also has float32 norms cast down before a float16 weight: every norm takes the
    #: float32 body (one body per model), an upcast one on its upcast (set per run by the pass)
    float32_body = False

    def anchors(self) -> frozenset[str]:
        return frozenset({"Mul"})

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        hit = _match(anchor, scope.graph, scope.local, scope.outputs)
        if hit is None:
            return None
        m = scope.match(hit.nodes)  # a float32 norm cast down: anchored at its last op, the weight stays
        m.hit = hit
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        hit = m.hit
        if hit.why_not:
            return MatchResult.fail(f"RMSNorm not fused: {hit.why_not}")
        m.opset = model_io.opset_of(m.root) or m.root.opset or 13
        if m.opset < MIN_OPSET["RmsNorm"]:
            return MatchResult.fail(f"opset {m.opset}: the RmsNorm device op's body needs opset {MIN_OPSET['RmsNorm']}+")
        elem = elem_type(hit.x.dtype)
        conflict = function_type_conflict(m.root, "RmsNorm", elem)
        if (conflict or self.float32_body) and hit.upcast is not None \
                and not function_type_conflict(m.root, "RmsNorm", TensorProto.FLOAT):
            # the model's RmsNorm body is float32's (its other norms are float32 norms cast down):
            # this one too, on the upcast, with its Cast down and weight outside
            up, norm, down, anchor = hit.upcast
            hit.x, hit.mixed, hit.nodes = up.outputs[0], (down, anchor), list(norm)
            _checked(hit, hit.x, hit.gamma, None)
            if hit.why_not:
                return MatchResult.fail(f"RMSNorm not fused: {hit.why_not}")
            m.nodes = list(norm)
            elem, conflict = TensorProto.FLOAT, None
        reason = target_refusal(ctx.target, "RmsNorm", dtype_name(elem)) or conflict
        return MatchResult.fail(reason) if reason else MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        hit = m.hit
        ensure_function(m.root, rms_norm_function(m.opset, elem_type(hit.x.dtype)))
        if hit.mixed is not None or hit.weightless:  # the norm itself (a weight, if any, stays after it)
            ones = gs.Constant(m.names("rms_norm_ones"), np.ones(int(hit.x.shape[-1]), np_dtype(elem_type(hit.x.dtype))))
            m.count("weight_outside")
            return m.op("RmsNorm", [hit.x, ones], {"epsilon": float(hit.eps)}, domain=DOMAIN, name=m.names("rms_norm"))
        gamma = hit.gamma
        # CANN takes gamma shaped as x's last axis: a [1, W] or one-element weight becomes [W]
        # (the same values broadcast the same way: the Mul gives the same bits)
        width = hit.x.shape[-1] if hit.x.shape else None
        values = np.asarray(gamma.values)
        if isinstance(width, (int, np.integer)) and values.ndim != 1 and values.size in (1, int(width)):
            gamma = gs.Constant(m.names(f"{gamma.name}_w"), np.broadcast_to(values.reshape(-1), (int(width),)).copy())
        return m.op("RmsNorm", [hit.x, gamma], {"epsilon": float(hit.eps)}, domain=DOMAIN, name=m.names("rms_norm"))


def _has_mixed_norms(graph: gs.Graph) -> bool:
    """Whether a norm of the model is a float32 norm cast down before its weight (one walk over
    the weight Muls, before the rules run: the one body every norm of the model then takes)."""
    for g in iter_graphs(graph):
        local = None  # built at the first weight Mul (a graph without one is walked once)
        for n in g.nodes:
            if n.op == "Mul" and n.domain in (None, "", "ai.onnx") and len(n.inputs) == 2 and any(
                    isinstance(t, gs.Constant) for t in n.inputs):
                if local is None:
                    local = {id(n) for n in g.nodes}
                hit = _match(n, g, local, set())
                if hit is not None and hit.mixed is not None and not hit.why_not:
                    return True
    return False


def _same_shape(a: gs.Tensor, b: gs.Tensor) -> bool:
    """The operands have one shape as far as it is known: the same rank, the same static dims, and
    a symbolic dim (never 1 by itself) where the other has one. Shape inference renames a batch
    dim per tensor (``unk__12``): two symbolic dims of a residual Add are taken as equal (a
    broadcast of a symbolic dim of 1 there would be a model that no residual connection writes)."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    for da, db in zip(a.shape, b.shape):
        sa, sb = isinstance(da, (int, np.integer)), isinstance(db, (int, np.integer))
        if sa != sb or (sa and da != db) or (not sa and not (da and db)):
            return False
    return True


def _add_rms_norm(graph: gs.Graph, ctx, pass_name: str) -> int:
    """Each RmsNorm whose X is a residual Add of two same-shaped tensors: one AddRmsNorm, placed
    where the Add was (both of its inputs exist there; its readers all come after)."""
    fired = 0
    for g in iter_graphs(graph):
        norms = [n for n in g.nodes if n.op == "RmsNorm" and n.domain == DOMAIN]
        if not norms:  # no RmsNorm here (every CNN): no index of the graph's nodes
            continue
        index = {id(n): i for i, n in enumerate(g.nodes)}
        replace: dict[int, gs.Node] = {}
        dead: set[int] = set()
        for n in norms:
            if id(n) in dead:
                continue
            s = n.inputs[0]
            add = s.inputs[0] if len(s.inputs) == 1 else None
            if add is None or add.op != "Add" or add.domain not in (None, "", "ai.onnx") or id(add) not in index \
                    or id(add) in dead:
                continue
            x1, x2 = add.inputs
            if isinstance(x1, gs.Constant) or isinstance(x2, gs.Constant):
                continue
            if not _same_shape(x1, x2) or elem_type(x1.dtype) != elem_type(x2.dtype):
                ctx.explain(pass_name, add, "AddRmsNorm not formed: the residual Add's operands are not known to have "
                            "one shape (CANN AddRmsNorm takes x2 shaped as x1)")
                continue
            elem = elem_type(x1.dtype)
            why = target_refusal(ctx.target, "AddRmsNorm", dtype_name(elem)) or \
                function_type_conflict(graph, "AddRmsNorm", elem)
            if why:
                ctx.explain(pass_name, add, f"AddRmsNorm not formed: {why}")
                continue
            opset = model_io.opset_of(graph) or graph.opset or 13
            ensure_function(graph, add_rms_norm_function(opset, elem))
            y = n.outputs[0]
            # the Add and the RmsNorm give up their outputs to the new node (same tensors: names,
            # types and every reader stay)
            add.outputs.clear()
            n.outputs.clear()
            fused = gs.Node("AddRmsNorm", name=f"{n.name}_add" if n.name else None, domain=DOMAIN,
                            inputs=[x1, x2, n.inputs[1]], outputs=[y, s], attrs={"epsilon": n.attrs["epsilon"]})
            A.meta(fused).update(A.meta(n))
            A.mark_created(fused, pass_name, replaced=[add, n])
            add.inputs.clear()
            n.inputs.clear()
            replace[id(add)] = fused
            dead.update({id(add), id(n)})
            fired += 1
        if replace:
            g.nodes = [replace.get(id(n), n) for n in g.nodes if id(n) not in dead or id(n) in replace]
    return fired


@register
class FuseRmsNorm(RulePass):
    """Recognizes the exported RMSNorm (and the residual Add before it).

    Cases:
      1. Pow(x, 2) or Mul(x, x); Reciprocal(Sqrt) or Div(1, Sqrt); operands in either order;
      2. float32/float64 computed in place; float16/bfloat16 inside the exporters' Cast to
         float32 and back (the weight Mul in X's type, after the Cast back);
      3. ReduceMean axes as an attribute or an input (opset 18);
      4. a residual Add of two same-shaped tensors feeding it: AddRmsNorm (both outputs read).
    """

    name = "fuse_rms_norm"
    summary = "RMSNorm subgraph (and the residual Add before it) -> graphpass.ascend::RmsNorm / AddRmsNorm device ops."
    kind = PassKind.FUSION
    promise = EXACT
    reverse = True
    rules = (_RmsNorm(),)
    preserves_order = True

    def run(self, graph: gs.Graph, ctx) -> PassResult:
        rule = self.rules[0]
        rule.float32_body = _has_mixed_norms(graph)
        try:
            result = super().run(graph, ctx)
        finally:
            rule.float32_body = False
        added = _add_rms_norm(graph, ctx, self.name)
        stats = dict(result.stats)
        stats["add_rms_norm"] = added
        return PassResult(result.modified or added > 0, stats)
