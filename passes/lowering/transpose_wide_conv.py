"""2-D Convs over inputs wider than the AI Core's Conv accepts, run along H instead, a region at a time.

    Conv(x (N,C,H,W), W (M,C/g,kh,kw), pads (t,l,b,r), strides (sh,sw), dilations (dh,dw))
        =>  Transpose(Conv(Transpose(x, (0,1,3,2)), W^T (M,C/g,kw,kh), pads (l,t,r,b),
                           strides (sw,sh), dilations (dw,dh)), (0,1,3,2))

CANN's Conv takes an input W of at most 4096 (``data/op_limits.toml``: Conv ``max_input_w``,
CANN's Conv page) and puts no such bound on H: a long 1-row signal (an audio front end such as
AASIST, auto_optimizer's knowledge_transpose_large_input_conv) runs on AI Core once H and W are
swapped. A region is swapped together: the wide convs and the elementwise ops that read only
swapped values and constants (AASIST's residual Add) live as (N,C,W,H); one Transpose enters per value read from outside (shared by its readers) and one
leaves per value read outside (its old tensor, name and shape kept). A constant operand of an
elementwise op is padded to rank 4 and has its last two axes swapped, so broadcasting is
unchanged. Only elementwise ops computed exactly per element join (``LAYOUT_EXACT``): onnxruntime
gives transcendental ones (Selu, Elu, Softplus) other bits for elements that a transpose moves
into or out of a SIMD tail, so a Selu between two convs stays in place between Transposes.

Exact where each kernel has a side of 1 (kh == 1 or kw == 1): every output is then the same
products summed in the same order (channel, then the one kernel axis longer than 1); with
both sides above 1 the swap would reorder the sum, so that Conv is refused. Fires only where the
target puts a Conv off AI Core by its input width and the swapped Conv fits (``needs_target``;
scored). Refused (for --explain) also for: a non-constant weight, a rank other than 4, auto_pad
SAME_* (kept simple).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs, peek_values
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, Pass
from graphpass.passes.framework.rewrite import LazyNameGen
from graphpass.passes.lowering._knowledge import off_ai_core, splice_region

__all__ = ["TransposeWideConv"]

_NAME = "transpose_wide_conv"
_PERM = [0, 1, 3, 2]

#: elementwise ops whose every element is one correctly rounded (or exact) operation, so that moving
#: an element to another memory position cannot change its bits. Transcendental ones are not in it:
#: onnxruntime computes the elements of a SIMD tail another way (Selu, Elu and Softplus on a
#: transposed (1,4,2,5001) tensor: 1, 3 and 14 elements differ by an ulp).
LAYOUT_EXACT = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Max", "Min", "Sum", "Sqrt", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Clip", "LeakyRelu", "PRelu", "Cast", "Identity", "Not", "And", "Or", "Xor", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf",
})


def _auto_pad(node: gs.Node) -> str:
    v = node.attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else str(v)


def _swap2(v):
    return [int(v[1]), int(v[0])]


def _swapped_shape(t: gs.Tensor):
    return None if t.shape is None or len(t.shape) != 4 else [*t.shape[:2], t.shape[3], t.shape[2]]


def _refusal(conv: gs.Node, ctx: PassContext) -> str | None:
    """Why ``conv`` is not swapped (None: it is)."""
    x = conv.inputs[0]
    if x.shape is None or len(x.shape) != 4:
        return "not a 2-D Conv with a known input rank"
    if len(conv.inputs) < 2 or not isinstance(conv.inputs[1], gs.Constant):
        return "the weight is not a constant"
    row = load_op_limits().get("Conv")
    n_h, n_w = x.shape[2], x.shape[3]
    if row is None or row.max_input_w is None or not isinstance(n_w, (int, np.integer)) or n_w <= row.max_input_w:
        return f"input W {n_w} is within the Conv's limit"
    if not isinstance(n_h, (int, np.integer)) or n_h > row.max_input_w:
        return f"input H {n_h} would be the new W, over the limit as well"
    kh, kw = tuple(conv.inputs[1].shape)[2:]  # the weight's shape, not decoded
    if kh > 1 and kw > 1:
        return f"kernel {kh}x{kw}: swapping H and W would reorder each output's sum (not exact)"
    if _auto_pad(conv) not in ("NOTSET", "VALID"):
        return f"auto_pad={_auto_pad(conv)}"
    if off_ai_core(ctx, conv, f"pass '{_NAME}'") is None:
        return f"the Conv runs on AI Core on {ctx.target.name}: nothing to gain"
    return None


@register
class TransposeWideConv(Pass):
    """Runs Convs over very wide inputs along H (Transpose in, swapped Convs, Transpose out).

    Cases:
      1. a 1-row kernel (1 x kw) or a 1-column one (kh x 1), any pads, strides, dilations, group, bias;
      2. a region: swapped convs and the exact elementwise ops between them (AASIST's Add) share one
         Transpose per value entering and leaving it; a value read by several swapped convs is
         transposed once.
    """

    name = _NAME
    summary = "Conv over an input wider than the AI Core's Conv takes (CANN: W <= 4096) -> Transposes around Convs along H."
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True
    needs_target = True
    runs_before = (PassKind.FUSION,)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        ctx.target.require(f"pass '{self.name}'")
        names = LazyNameGen(graph)  # nothing to rename on most graphs: no walk for the names
        stats = {"convs": 0, "elementwise": 0, "transposes": 0}
        for g in list(iter_graphs(graph)):
            self._run_graph(g, ctx, names, stats)
        return PassResult(stats["convs"] > 0, {"fired": stats["convs"], **stats})

    def _run_graph(self, g: gs.Graph, ctx: PassContext, names: NameGen | LazyNameGen, stats: dict) -> None:
        twin: dict[int, gs.Tensor] = {}  # id(tensor) -> its (N,C,W,H) twin
        region: list[gs.Node] = []
        for n in g.nodes:
            if n.domain not in (None, "", "ai.onnx") or len(n.outputs) != 1:
                continue
            if n.op == "Conv":
                why = _refusal(n, ctx)
                if why is not None:
                    ctx.explain(self.name, n, why)
                    continue
            elif n.op in LAYOUT_EXACT:
                if not twin:  # no conv swapped yet: nothing it reads can be a twin (most graphs)
                    continue
                variables = [t for t in n.inputs if t.name and not isinstance(t, gs.Constant)]
                out = n.outputs[0]
                if not variables or any(id(t) not in twin for t in variables):
                    continue
                if out.shape is None or len(out.shape) != 4 or any(
                        isinstance(t, gs.Constant) and len(t.shape) > 4 for t in n.inputs):
                    continue
            else:
                continue
            out = n.outputs[0]
            twin[id(out)] = gs.Variable(names(f"{out.name}_hw"), dtype=out.dtype, shape=_swapped_shape(out))
            region.append(n)
        if not any(n.op == "Conv" for n in region):
            return
        members = {id(n) for n in region}
        outputs = {id(t) for t in g.outputs}
        entering: dict[int, gs.Tensor] = {}
        constants: dict[int, gs.Constant] = {}
        before: dict[int, list[gs.Node]] = {}
        after: dict[int, list[gs.Node]] = {}
        new_nodes: dict[int, gs.Node] = {}

        def transpose(x: gs.Tensor, y: gs.Tensor, label: str) -> gs.Node:
            node = gs.Node("Transpose", names(label), attrs={"perm": list(_PERM)}, inputs=[x], outputs=[y])
            A.mark_created(node, self.name)
            stats["transposes"] += 1
            return node

        for n in region:
            pre = before.setdefault(id(n), [])
            inputs: list[gs.Tensor] = []
            if n.op == "Conv":
                x, wt = n.inputs[0], n.inputs[1]
                if id(x) in twin:
                    xt = twin[id(x)]
                elif id(x) in entering:
                    xt = entering[id(x)]
                else:
                    xt = entering[id(x)] = gs.Variable(names(f"{x.name}_hw"), dtype=x.dtype, shape=_swapped_shape(x))
                    pre.append(transpose(x, xt, f"{n.name or 'conv'}_to_h"))
                a = dict(n.attrs)
                for key in ("kernel_shape", "strides", "dilations"):
                    if key in a:
                        a[key] = _swap2(a[key])
                if "pads" in a:
                    t, l, b, r = (int(p) for p in a["pads"])
                    a["pads"] = [l, t, r, b]
                w = np.ascontiguousarray(np.swapaxes(peek_values(wt), 2, 3))
                inputs = [xt, gs.Constant(names(f"{wt.name}_hw"), w), *n.inputs[2:]]
                stats["convs"] += 1
            else:
                for t in n.inputs:
                    if id(t) in twin:
                        inputs.append(twin[id(t)])
                    elif isinstance(t, gs.Constant) and t.name:
                        if id(t) not in constants:
                            v = np.asarray(t.values)
                            v4 = v.reshape((1,) * (4 - v.ndim) + v.shape)
                            constants[id(t)] = gs.Constant(names(f"{t.name}_hw"), np.ascontiguousarray(np.swapaxes(v4, 2, 3)))
                        inputs.append(constants[id(t)])
                    else:
                        inputs.append(t)
                a = dict(n.attrs)
                stats["elementwise"] += 1
            old_out = n.outputs[0]
            node = gs.Node(n.op, n.name, attrs=a, inputs=inputs, outputs=[twin[id(old_out)]], domain=n.domain)
            A.meta(node).update(A.meta(n))
            A.mark_created(node, self.name, replaced=[n])
            new_nodes[id(n)] = node
            if any(id(c) not in members for c in old_out.outputs) or id(old_out) in outputs:
                n.outputs.clear()  # the Transpose back writes the old tensor: its name, type and shape stay
                after.setdefault(id(n), []).append(transpose(twin[id(old_out)], old_out, f"{n.name or n.op}_to_w"))
        splice_region(g, region, new_nodes, before, after)
