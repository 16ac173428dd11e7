"""A TopK whose k is computed at run time becomes a static TopK plus a mask (seed 000, DB_ResNet).

    v = TopK(x, k)[0] -> ReduceSum(v, axis)   =>  ReduceSum(masked, axis)
        masked = Gather(Concat(TopK(x, n, sorted=1)[0], fills), Where(Range(n) < k, Range(n), fill index), axis)
    v = TopK(x, k)[0] -> ReduceMean(v, axes)  =>  ReduceSum(masked, axes) / max(k * other reduced sizes, 1)

n is the static size of the TopK axis (the bound on k). The static TopK is always sorted, whatever
the original's ``sorted``: its first k values are then exactly the k values TopK(x, k) selects
(largest or smallest, ties to the lower index as ONNX says, NaN ordered as onnxruntime orders it).
The mask selects by Gather, it never multiplies: 0 * inf would be NaN (and onnxruntime's float
Where turns a -0.0 taken from its first branch into +0.0, so it cannot select either). The fill is -0.0, the exact
identity of addition (for k = 0 it is +0.0, onnxruntime's sum of an empty tensor; integers fill
0), so the masked sum is the sum of the selected values; only the order of the additions
changes, hence the summation-order tolerance. NaN and inf positions stay where the original has
them, except where values near the dtype's max overflow (or cancel) in only one of the two orders. k = 0 gives 0 for a sum and for a mean (onnxruntime's mean of an empty tensor). With a static k,
nothing depends on the data's shape any more: the graph compiles statically and sinks.

Cases left alone with the reason (the region stays host-scheduled in the cost model): the
selected values feed something other than a reduction over the TopK axis, the indices are
used, the axis size is not static, a float mean whose count (k times the other reduced sizes)
may not be exact in its dtype (over 2048 values in float16), or an integer mean (onnxruntime's does not wrap around like
an integer sum divided by the count: no lowering reproduces it exactly). A TopK
whose k is already a constant is static (k often becomes constant once ``--input-shape`` and
fold_constants have run) and is only counted.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, Promise
from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.graph import NameGen, iter_graphs, remove_nodes
from graphpass.ir.shapes import static_shape

__all__ = ["LowerDynamicTopK"]


def _reduce_axes(node: gs.Node, rank: int) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
        if not isinstance(node.inputs[1], gs.Constant):
            return None
        axes = np.asarray(node.inputs[1].values).ravel().tolist()
    if axes is None or len(axes) == 0:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            return []
        return list(range(rank))
    return sorted(int(a) % rank for a in axes)


def _dtype(t: gs.Tensor) -> np.dtype | None:
    """The numpy dtype of a tensor, or None when unknown or not a plain numpy type (bfloat16, float8)."""
    try:
        return np.dtype(t.dtype) if t.dtype is not None else None
    except TypeError:
        return None


def _check(topk: gs.Node, g: gs.Graph) -> MatchResult:
    x = topk.inputs[0]
    shape = static_shape(x)
    if shape is None:
        return MatchResult.fail("the TopK input's shape is not static: no bound on k")
    dtype = _dtype(x)
    if dtype is None or dtype.kind not in "iuf":
        return MatchResult.fail(f"the TopK input's dtype ({x.dtype}) is unknown or not a numpy int/float type")
    axis = int(topk.attrs.get("axis", -1)) % len(shape)
    outs = {id(t) for t in g.outputs}
    if len(topk.outputs) > 1 and topk.outputs[1].name and (len(topk.outputs[1].outputs) or id(topk.outputs[1]) in outs):
        return MatchResult.fail("the TopK indices are used: a mask cannot stand in for them")
    values = topk.outputs[0]
    if id(values) in outs or not len(values.outputs):
        return MatchResult.fail("the selected values are a graph output")
    for c in values.outputs:
        if c.op not in ("ReduceSum", "ReduceMean") or c.inputs[0] is not values:
            return MatchResult.fail(f"the selected values feed {c.op} '{c.name}': only a reduction can take the mask")
        axes = _reduce_axes(c, len(shape))
        if axes is None or axis not in axes:
            return MatchResult.fail(f"{c.op} '{c.name}' does not reduce over the TopK axis")
        if c.op == "ReduceMean" and dtype.kind == "f":
            count = int(np.prod([shape[a] for a in axes]))
            if count > 2 ** (np.finfo(dtype).nmant + 1):
                return MatchResult.fail(f"ReduceMean '{c.name}' counts up to {count} values: not exact in {dtype}")
        if c.op == "ReduceMean" and dtype.kind in "iu":
            return MatchResult.fail(f"integer ReduceMean '{c.name}': onnxruntime's integer mean does not overflow "
                                    "like a sum divided by the count, so no lowering matches it exactly")
    return MatchResult.success()


@register
class LowerDynamicTopK(Pass):
    """Makes runtime-k TopK static where its values are only summed or averaged.

    Cases:
      1. k constant: already static, counted;
      2. values -> ReduceSum / ReduceMean over the TopK axis (any axes given as attribute or input);
      3. anything else: left alone, the reason recorded;
      4. sorted=0 and largest=0/1: the static TopK is sorted, so its prefix is the selection;
      5. the mask selects (Gather; fill -0.0, +0.0 for k = 0, integer 0): inf, NaN, -0.0 kept.
    """

    name = "lower_dynamic_topk"
    anchor_ops = frozenset({"TopK"})  # nothing to do in a graph without them
    summary = "TopK with a runtime k feeding reductions -> static TopK + mask (OHEM losses)."
    kind = PassKind.LOWERING
    # lowerings make the graph compilable, and fusions may then apply to their output
    runs_before = (PassKind.FUSION,)
    promise = Promise.tolerance("summation-order", rtol=1e-5, atol=1e-6, reason="values reduced in another order after the static TopK")
    required = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        stats = {"lowered": 0, "static_k": 0, "refused": 0}
        names = NameGen(graph)
        opset = model_io.opset_of(graph) or graph.opset or 13
        for g in list(iter_graphs(graph)):
            dead: list[gs.Node] = []
            for topk in list(g.nodes):
                if topk.op != "TopK" or topk.domain not in (None, "", "ai.onnx") or len(topk.inputs) < 2:
                    continue
                if isinstance(topk.inputs[1], gs.Constant):
                    stats["static_k"] += 1
                    continue
                verdict = _check(topk, g)
                if not verdict:
                    stats["refused"] += 1
                    ctx.explain(self.name, topk, verdict.reason)
                    continue
                dead.extend(self._lower(topk, g, names, opset))
                stats["lowered"] += 1
            remove_nodes(g, dead)
        return PassResult(stats["lowered"] > 0, stats)

    def _lower(self, topk: gs.Node, g: gs.Graph, names: NameGen, opset: int) -> list[gs.Node]:
        """Rewrite one site; returns the nodes that are now dead (the TopK, replaced means)."""
        x, k = topk.inputs[0], topk.inputs[1]
        shape = static_shape(x)
        rank = len(shape)
        axis = int(topk.attrs.get("axis", -1)) % rank
        n = shape[axis]
        dtype = _dtype(x)
        base = topk.name or "topk"
        values = topk.outputs[0]
        readers = list(values.outputs)
        created: list[gs.Node] = []
        dead: list[gs.Node] = []

        def node(op, inputs, out_dtype, out_shape=None, **attrs):
            out = gs.Variable(names(f"{base}_{op.lower()}"), dtype=out_dtype, shape=out_shape)
            created.append(gs.Node(op, name=names(f"{base}_{op.lower()}"), inputs=inputs, outputs=[out], attrs=attrs))
            return out

        # static TopK over the whole axis, always sorted (case 4): its first k values are the ones
        # TopK(x, k) selects, ties to the lower index first, NaN where onnxruntime puts it
        full = gs.Variable(names(f"{base}_all_values"), dtype=dtype, shape=shape)
        idx = gs.Variable(names(f"{base}_all_indices"), dtype=np.int64, shape=shape)
        kn = gs.Constant(names(f"{base}_n"), np.array([n], np.int64))
        attrs = {**topk.attrs, "sorted": 1} if opset >= 11 else dict(topk.attrs)  # TopK-10 always sorts
        created.append(gs.Node("TopK", name=names(f"{base}_static"), inputs=[x, kn], outputs=[full, idx], attrs=attrs))
        # mask (case 5): position along the axis < k picks the value, any other position picks the
        # fill; by Gather, which only moves values: 0 * inf would be NaN, and onnxruntime's float
        # Where turns a -0.0 it selects from its first branch into +0.0
        positions = np.arange(n, dtype=np.int64)
        k64 = node("Cast", [k], np.int64, [1], to=onnx.TensorProto.INT64)
        mask = node("Less", [gs.Constant(names(f"{base}_positions"), positions), k64], np.bool_, [n])
        # the fill: -0.0 (index n) is the exact identity of +, so the masked sum is the sum of the
        # selected values whatever their signs; k = 0 takes +0.0 (index n + 1), onnxruntime's sum of
        # an empty tensor; integers fill 0
        is_float = dtype.kind == "f"
        fills = np.array([-0.0, 0.0] if is_float else [0, 0], dtype)
        fill_shape = list(shape)
        fill_shape[axis] = 2
        fill_const = np.reshape(fills, [2 if d == axis else 1 for d in range(rank)])
        fill = node("Expand", [gs.Constant(names(f"{base}_fills"), fill_const),
                               gs.Constant(names(f"{base}_fill_shape"), np.array(fill_shape, np.int64))], dtype, fill_shape)
        ext_shape = list(shape)
        ext_shape[axis] = n + 2
        extended = node("Concat", [full, fill], dtype, ext_shape, axis=axis)
        k_positive = node("Greater", [k64, gs.Constant(names(f"{base}_zero_k"), np.array(0, np.int64))], np.bool_, [1])
        fill_index = node("Where", [k_positive, gs.Constant(names(f"{base}_neg_zero_at"), np.array([n], np.int64)),
                                    gs.Constant(names(f"{base}_pos_zero_at"), np.array([n + 1], np.int64))], np.int64, [1])
        picks = node("Where", [mask, gs.Constant(names(f"{base}_keep_at"), positions), fill_index], np.int64, [n])
        masked = node("Gather", [extended, picks], dtype, shape, axis=axis)
        for r in readers:
            axes = _reduce_axes(r, rank)
            if r.op == "ReduceSum":
                r.inputs[0] = masked
            else:  # ReduceMean over k selected values x the other reduced sizes
                others = int(np.prod([shape[a] for a in axes if a != axis])) if len(axes) > 1 else 1
                out = r.outputs[0]
                r.outputs.clear()
                keep = int(r.attrs.get("keepdims", 1))
                axes_attrs = {"keepdims": keep}
                sum_inputs = [masked]
                if opset >= 13:
                    sum_inputs.append(gs.Constant(names(f"{base}_axes"), np.array(axes, np.int64)))
                else:
                    axes_attrs["axes"] = axes
                total = node("ReduceSum", sum_inputs, dtype, **axes_attrs)
                k_f = node("Cast", [k], dtype, to=onnx.helper.np_dtype_to_tensor_dtype(dtype))
                count = node("Mul", [k_f, gs.Constant(names(f"{base}_others"), np.array(others, dtype))], dtype)
                # k = 0: the sum is 0 and so is onnxruntime's mean of an empty tensor; keep it 0, not 0/0
                count = node("Max", [count, gs.Constant(names(f"{base}_one"), np.array(1, dtype))], dtype)
                count_s = node("Reshape", [count, gs.Constant(names(f"{base}_scalar"), np.array([], np.int64))], dtype, [])
                created.append(gs.Node("Div", name=names(f"{base}_mean"), inputs=[total, count_s], outputs=[out]))
                r.inputs.clear()
                dead.append(r)
        topk.inputs.clear()
        topk.outputs.clear()
        for c in created:
            A.mark_created(c, self.name, replaced=[topk])
        g.nodes.extend(created)
        return [topk] + dead
