"""1-D Conv and ConvTranspose as 2-D ones with an H of 1, converted a region at a time.

    Conv1d(x (N,C,L), W (M,C/g,k))  =>  Squeeze(Conv2d(Unsqueeze(x, 2), W (M,C/g,1,k)), 2)
        (or, where a length is over the AI Core Conv's input W of 4096, the unit axis on W:
         Unsqueeze(x, 3), W (M,C/g,k,1), the length running along H, which has no such bound)
        kernel_shape [k] -> [1,k], strides [s] -> [1,s], dilations [d] -> [1,d],
        pads [b,e] -> [0,b,0,e]; ConvTranspose: output_padding [p] -> [0,p], output_shape [L] -> [1,L]

A region is converted together: the outputs of 1-D convolutions, and of the elementwise ops
that read only such outputs and constants (Whisper's decomposed GELU between its two convs),
live as (N,C,1,L) tensors, so no Squeeze/Unsqueeze sits between two convolutions of a region;
a Squeeze (writing the old tensor, name and shape kept) is placed only where something outside
the region reads a value, and an Unsqueeze only where a convolution reads from outside. A
constant operand of an elementwise op gets the same unit axis (its shape padded to rank 3,
then (a,b,c) -> (a,b,1,c)), so broadcasting is unchanged. Why: the Cube's kernels are 2-D and
ATC's 5HD formats are 4-D; a 3-D tensor is ND, so each 1-D conv pays TransData on both sides.

Exact: a 2-D convolution with a unit H axis and kernel height 1 sums the same products in the
same order, elementwise ops are shape-agnostic, and Unsqueeze/Squeeze only reshape. A region is
converted only where it needs fewer reshapes than ATC's ONNX parser adds itself when it maps a
1-D conv to Conv2D (two per conv; E: the parser's behaviour, not a printed figure). The pass
needs a hardware target (it is an Ascend layout choice) and is scored: the cost model vetoes an
application that does not pay. Refused (for --explain): a convolution whose input or weight
rank is unknown, or whose weight is not 3-D.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import load_op_limits
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs
from graphpass.ir.model import opset_of
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, Pass
from graphpass.passes.framework.rewrite import LazyNameGen
from graphpass.passes.lowering._knowledge import splice_region

__all__ = ["LowerConv1dToConv2d", "ELEMENTWISE"]

_NAME = "lower_conv1d_to_conv2d"

#: default-domain ops that act element by element (broadcasting their operands), any rank
ELEMENTWISE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Erf", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Softplus", "Softsign",
    "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "Gelu", "Clip", "Cast", "Identity",
    "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "ThresholdedRelu", "Not", "IsNaN", "IsInf",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Mod", "And", "Or", "Xor",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
})


def _std(n: gs.Node) -> bool:
    return n.domain in (None, "", "ai.onnx")


def _rank(t: gs.Tensor) -> int | None:
    shape = t.shape  # a Constant's: its lazy weight's, without decoding (and caching) it
    return len(shape) if shape is not None else None


def _shape4(t: gs.Tensor, u: int = 2):
    """``t``'s shape with the unit axis inserted at ``u`` (2: H = 1, 3: W = 1)."""
    if t.shape is None:
        return None
    shape = list(t.shape)
    shape.insert(u, 1)
    return shape


def _wide(n: gs.Node, limit: int | None) -> bool:
    """The conv's input length is over the AI Core Conv's input W (it must run along H)."""
    shape = n.inputs[0].shape
    return limit is not None and shape is not None and isinstance(shape[-1], (int, np.integer)) and shape[-1] > limit


def _conv1d(n: gs.Node) -> str | None:
    """None when ``n`` is a 1-D Conv/ConvTranspose this pass converts, else why not."""
    if len(n.inputs) < 2:
        return "no weight input"
    xr, wr = _rank(n.inputs[0]), _rank(n.inputs[1])
    if xr is None or wr is None:
        return "the input or weight rank is unknown"
    if xr != 3 or wr != 3:
        return f"rank {xr} input, rank {wr} weight: not a 1-D convolution"
    if len(n.outputs) != 1 or _rank(n.outputs[0]) not in (3, None):
        return "an output that is not 3-D"
    return None


def _attrs2d(n: gs.Node, u: int = 2) -> dict:
    a = dict(n.attrs)

    def two(v: int, unit: int) -> list[int]:
        return [unit, int(v)] if u == 2 else [int(v), unit]

    for key, unit in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0), ("output_shape", 1)):
        if key in a:
            a[key] = two(a[key][0], unit)
    if "kernel_shape" not in a and isinstance(n.inputs[1], gs.Constant):
        a["kernel_shape"] = two(tuple(n.inputs[1].shape)[2], 1)
    if "pads" in a:
        b, e = (int(v) for v in a["pads"])
        a["pads"] = [0, b, 0, e] if u == 2 else [b, 0, e, 0]
    return a


@register
class LowerConv1dToConv2d(Pass):
    """Converts 1-D convolutions, and the elementwise ops between them, to 2-D with H=1.

    Cases:
      1. Conv and ConvTranspose (any group, pads, strides, dilations, auto_pad, bias);
      2. a chain Conv1d -> elementwise ops -> Conv1d converted together (no Squeeze/Unsqueeze between);
      3. a constant weight reshaped once (shared weights too); a weight computed at run time unsqueezed;
      4. a value read outside the region, or a graph output, gets one Squeeze writing its old tensor;
      5. a connected region is converted only when it needs fewer Unsqueeze/Squeeze than ATC's
         parser adds around each 1-D conv (two per conv, E): a lone conv is left as it is;
      6. a conv longer than the AI Core Conv's input W (data/op_limits.toml) puts the length on H
         and the unit axis on W, (N,C,L,1), and its region is converted whatever it adds (it leaves AI CPU).
    """

    name = _NAME
    summary = "1-D Conv/ConvTranspose (and elementwise ops between them) -> 2-D with H=1, one region at a time."
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True
    needs_target = True  # a layout choice for Ascend's 2-D Cube kernels and 4-D formats
    runs_before = (PassKind.FUSION,)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        ctx.target.require(f"pass '{self.name}'")
        names = LazyNameGen(graph)  # nothing to rename on most graphs: no walk for the names
        new_opset = opset_of(graph) or graph.opset or 13
        stats = {"convs": 0, "elementwise": 0, "squeezes": 0, "unsqueezes": 0}
        for g in list(iter_graphs(graph)):
            self._run_graph(g, ctx, names, new_opset, stats)
        modified = stats["convs"] > 0
        return PassResult(modified, {"fired": stats["convs"], **stats} if modified else {"fired": 0})

    def _paying(self, region: list[gs.Node], twin: dict[int, gs.Tensor], g: gs.Graph, ctx: PassContext,
                limit: int | None) -> list[gs.Node]:
        """The connected parts of ``region`` that save reshapes: ATC's ONNX parser runs a 1-D
        conv as a 2-D one between its own reshapes (two per conv), so a part pays when it needs
        fewer Unsqueeze + Squeeze than that (case 2); a lone conv gains nothing and is left."""
        producer = {id(n.outputs[0]): n for n in region}
        parent = {id(n): id(n) for n in region}

        def find(k: int) -> int:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for n in region:
            for t in n.inputs:
                p = producer.get(id(t))
                if p is not None:
                    parent[find(id(n))] = find(id(p))
        members = {id(n) for n in region}
        outputs = {id(t) for t in g.outputs}
        parts: dict[int, list[gs.Node]] = {}
        for n in region:
            parts.setdefault(find(id(n)), []).append(n)
        keep: list[gs.Node] = []
        for nodes in parts.values():
            convs = [n for n in nodes if n.op in ("Conv", "ConvTranspose")]
            if not convs:
                continue
            added = sum(id(n.inputs[0]) not in twin for n in convs) + sum(
                any(id(c) not in members for c in n.outputs[0].outputs) or id(n.outputs[0]) in outputs for n in nodes)
            if added >= 2 * len(convs) and not any(_wide(n, limit) for n in convs):
                for n in convs:
                    ctx.explain(self.name, n, f"{len(convs)} 1-D conv(s) would need {added} Unsqueeze/Squeeze: "
                                "no fewer than ATC's parser adds itself (two per conv), nothing to gain")
                continue
            keep.extend(nodes)
        order = {id(n): i for i, n in enumerate(region)}
        return sorted(keep, key=lambda n: order[id(n)])

    def _run_graph(self, g: gs.Graph, ctx: PassContext, names: NameGen | LazyNameGen, opset: int, stats: dict) -> None:
        twin: dict[int, gs.Tensor] = {}  # id(3-D tensor) -> its (N,C,1,L) twin
        region: list[gs.Node] = []
        for n in g.nodes:
            if not _std(n) or len(n.outputs) != 1:
                continue
            if n.op in ("Conv", "ConvTranspose"):
                why = _conv1d(n)
                if why is not None:
                    if "not a 1-D" not in why:
                        ctx.explain(self.name, n, why)
                    continue
            elif n.op in ELEMENTWISE:
                if not twin:  # no conv converted yet: nothing it reads can be a twin (most graphs)
                    continue
                variables = [t for t in n.inputs if t.name and not isinstance(t, gs.Constant)]
                if not variables or any(id(t) not in twin for t in variables):
                    continue
                if _rank(n.outputs[0]) != 3 or any(isinstance(t, gs.Constant) and len(t.shape) > 3 for t in n.inputs):
                    continue
            else:
                continue
            out = n.outputs[0]
            twin[id(out)] = gs.Variable(names(f"{out.name}_h1"), dtype=out.dtype)
            region.append(n)
        row = load_op_limits().get("Conv")
        limit = row.max_input_w if row is not None else None
        region = self._paying(region, twin, g, ctx, limit)
        if not region:
            return
        # the unit axis: H (2) unless a conv's length is over the AI Core Conv's input W, then W (3):
        # the length runs along H, where the Conv has no such bound (case 6)
        u = 3 if any(n.op in ("Conv", "ConvTranspose") and _wide(n, limit) for n in region) else 2
        for n in region:
            twin[id(n.outputs[0])].shape = _shape4(n.outputs[0], u)
        members = {id(n) for n in region}
        weights: dict[int, gs.Constant] = {}
        constants: dict[int, gs.Constant] = {}
        before: dict[int, list[gs.Node]] = {}
        after: dict[int, list[gs.Node]] = {}
        outputs = {id(t) for t in g.outputs}

        def axes_node(op: str, x: gs.Tensor, y: gs.Tensor, label: str) -> gs.Node:
            if opset >= 13:
                axes = gs.Constant(names(f"{label}_axes"), np.array([u], np.int64))
                node = gs.Node(op, names(label), inputs=[x, axes], outputs=[y])
            else:
                node = gs.Node(op, names(label), attrs={"axes": [u]}, inputs=[x], outputs=[y])
            A.mark_created(node, self.name)
            return node

        new_nodes: dict[int, gs.Node] = {}
        for n in region:
            old_out = n.outputs[0]
            inputs = []
            pre = before.setdefault(id(n), [])
            if n.op in ("Conv", "ConvTranspose"):
                x, w = n.inputs[0], n.inputs[1]
                if id(x) in twin:
                    x4 = twin[id(x)]
                else:
                    x4 = gs.Variable(names(f"{x.name}_h1"), dtype=x.dtype, shape=_shape4(x, u))
                    pre.append(axes_node("Unsqueeze", x, x4, f"{n.name or 'conv'}_unsqueeze"))
                    stats["unsqueezes"] += 1
                if isinstance(w, gs.Constant):
                    if id(w) not in weights:
                        v = np.asarray(w.values)
                        weights[id(w)] = gs.Constant(names(f"{w.name}_h1"), np.ascontiguousarray(np.expand_dims(v, u)))
                    w4 = weights[id(w)]
                else:
                    w4 = gs.Variable(names(f"{w.name}_h1"), dtype=w.dtype, shape=_shape4(w, u))
                    pre.append(axes_node("Unsqueeze", w, w4, f"{n.name or 'conv'}_weight_unsqueeze"))
                inputs = [x4, w4, *n.inputs[2:]]
                attrs = _attrs2d(n, u)
                stats["convs"] += 1
            else:
                for t in n.inputs:
                    if id(t) in twin:
                        inputs.append(twin[id(t)])
                    elif isinstance(t, gs.Constant) and t.name:
                        if id(t) not in constants:
                            v = np.asarray(t.values)
                            v3 = v.reshape((1,) * (3 - v.ndim) + v.shape)
                            constants[id(t)] = gs.Constant(names(f"{t.name}_h1"), np.ascontiguousarray(np.expand_dims(v3, u)))
                        inputs.append(constants[id(t)])
                    else:
                        inputs.append(t)  # an absent optional input
                attrs = dict(n.attrs)
                stats["elementwise"] += 1
            node = gs.Node(n.op, n.name, attrs=attrs, inputs=inputs, outputs=[twin[id(old_out)]], domain=n.domain)
            A.meta(node).update(A.meta(n))
            A.mark_created(node, self.name, replaced=[n])
            new_nodes[id(n)] = node
            readers_outside = [c for c in old_out.outputs if id(c) not in members]
            if readers_outside or id(old_out) in outputs:
                n.outputs.clear()  # the Squeeze writes the old tensor: its name, type and shape stay
                after.setdefault(id(n), []).append(axes_node("Squeeze", twin[id(old_out)], old_out, f"{n.name or n.op}_squeeze"))
                stats["squeezes"] += 1
        splice_region(g, region, new_nodes, before, after)
