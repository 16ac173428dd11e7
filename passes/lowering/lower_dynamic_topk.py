"""A TopK whose k is computed at run time becomes a static TopK plus a mask (seed 000, DB_ResNet).

    v = TopK(x, k)[0] -> ReduceSum(v, axis)        =>  ReduceSum(TopK(x, n)[0] * (Range(n) < k), axis)
    v = TopK(x, k)[0] -> ReduceMean(v, axes)       =>  ReduceSum(masked, axes) / (k * other reduced sizes)

n is the static size of the TopK axis (the bound on k). The first k of n sorted values are the k
largest, so the masked sum equals the sum of the k selected values exactly, up to fp32
summation order; k = 0 gives 0 for a sum and for a mean (onnxruntime's mean of an empty tensor). With a static k,
nothing depends on the data's shape any more: the graph compiles statically and sinks.

Cases left alone with the reason (the region stays host-scheduled in the cost model): the
selected values feed something other than a reduction over the TopK axis, the indices are
used, or the axis size is not static. A TopK whose k is already a constant is static (k often
becomes constant once ``--input-shape`` and fold_constants have run) and is only counted.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.infra import MatchResult, PassContext, PassKind, PassResult, register
from graphpass.infra.pass_base import Pass, Promise
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


def _check(topk: gs.Node, g: gs.Graph) -> MatchResult:
    x = topk.inputs[0]
    shape = static_shape(x)
    if shape is None:
        return MatchResult.fail("the TopK input's shape is not static: no bound on k")
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
    return MatchResult.success()


@register
class LowerDynamicTopK(Pass):
    """Makes runtime-k TopK static where its values are only summed or averaged.

    Cases:
      1. k constant: already static, counted;
      2. values -> ReduceSum / ReduceMean over the TopK axis (any axes given as attribute or input);
      3. anything else: left alone, the reason recorded.
    """

    name = "lower_dynamic_topk"
    summary = "TopK with a runtime k feeding reductions -> static TopK + mask (OHEM losses)."
    kind = PassKind.LOWERING
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
        dtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
        base = topk.name or "topk"
        values = topk.outputs[0]
        readers = list(values.outputs)
        created: list[gs.Node] = []
        dead: list[gs.Node] = []

        def node(op, inputs, out_dtype, out_shape=None, **attrs):
            out = gs.Variable(names(f"{base}_{op.lower()}"), dtype=out_dtype, shape=out_shape)
            created.append(gs.Node(op, name=names(f"{base}_{op.lower()}"), inputs=inputs, outputs=[out], attrs=attrs))
            return out

        # static TopK over the whole axis: k = n
        full = gs.Variable(names(f"{base}_all_values"), dtype=dtype, shape=shape)
        idx = gs.Variable(names(f"{base}_all_indices"), dtype=np.int64, shape=shape)
        kn = gs.Constant(names(f"{base}_n"), np.array([n], np.int64))
        created.append(gs.Node("TopK", name=names(f"{base}_static"), inputs=[x, kn], outputs=[full, idx], attrs=dict(topk.attrs)))
        # mask: position along the axis < k
        pos_shape = [1] * rank
        pos_shape[axis] = n
        positions = gs.Constant(names(f"{base}_positions"), np.arange(n, dtype=np.int64).reshape(pos_shape))
        k64 = node("Cast", [k], np.int64, to=onnx.TensorProto.INT64)
        mask = node("Less", [positions, k64], np.bool_, pos_shape)
        mask_f = node("Cast", [mask], dtype, pos_shape, to=onnx.helper.np_dtype_to_tensor_dtype(dtype))
        masked = node("Mul", [full, mask_f], dtype, shape)
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
