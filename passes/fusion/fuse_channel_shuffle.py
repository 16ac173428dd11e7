"""Channel shuffle written as Reshape/Transpose/Reshape becomes one Gather (seed 002).

    Reshape(N,g,C/g,H,W) -> Transpose(0,2,1,3,4) -> Reshape(N,C,H,W)  =>  Gather(axis=1, perm)
        perm[j] = (j % g) * (C/g) + j // g

This is ShuffleNetV2's ``index_select`` rewrite on Ascend: Transpose is an ND island and a
strided kernel, GatherV2 copies whole H*W rows. The cost model decides per site (for the
shapes and formats at hand) which of the two is cheaper; without a cost model the Gather is
taken. Refused (with the reason) for shapes that are unknown or not a shuffle.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, RewriteRule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.shapes import static_shape

__all__ = ["FuseChannelShuffle", "shuffle_permutation"]


def shuffle_permutation(channels: int, groups: int) -> np.ndarray:
    """Input channel read by each output channel of a ``groups``-way channel shuffle."""
    per = channels // groups
    j = np.arange(channels)
    return ((j % groups) * per + j // groups).astype(np.int64)


def _target(shape_t: gs.Tensor, src: list[int]) -> list[int] | None:
    if not isinstance(shape_t, gs.Constant):
        return None
    t = [int(v) for v in np.asarray(shape_t.values).ravel()]
    t = [src[i] if v == 0 and i < len(src) else v for i, v in enumerate(t)]
    if t.count(-1) == 1:
        known = int(np.prod([v for v in t if v != -1]))
        if known <= 0:
            return None
        t[t.index(-1)] = int(np.prod(src)) // known
    return t


class _Shuffle(RewriteRule):
    pattern = ("Reshape", "Transpose", "Reshape")

    def check(self, m: Match, ctx) -> MatchResult:
        r1, tr, r2 = m.nodes
        x = static_shape(r1.inputs[0])
        if x is None or len(x) != 4:
            return MatchResult.fail("the shuffled tensor's shape is unknown or not 4-D")
        n, c, h, w = x
        t1 = _target(r1.inputs[1], x)
        if t1 is None or len(t1) != 5 or t1[0] != n or t1[3:] != [h, w] or t1[1] * t1[2] != c:
            return MatchResult.fail(f"first Reshape to {t1} is not (N, g, C/g, H, W)")
        if list(tr.attrs.get("perm", [])) != [0, 2, 1, 3, 4]:
            return MatchResult.fail(f"Transpose perm {list(tr.attrs.get('perm', []))} is not (0, 2, 1, 3, 4)")
        t2 = _target(r2.inputs[1], [n, t1[2], t1[1], h, w])
        if t2 != [n, c, h, w]:
            return MatchResult.fail(f"last Reshape to {t2} is not back to (N, C, H, W)")
        m.groups = t1[1]
        cm = ctx.cost_model
        if cm is not None and getattr(cm, "active", False):
            choice, costs = self._ask(cm, r1.inputs[0], x, t1, ctx)
            if choice == 0:
                return MatchResult.fail(f"the cost model prefers the Transpose here ({costs[0]:.2f} vs {costs[1]:.2f} us)")
        return MatchResult.success()

    @staticmethod
    def _ask(cm, x: gs.Tensor, shape: list[int], t1: list[int], ctx) -> tuple[int, list[float]]:
        """Cost both forms of this site, with the input's dtype and storage format."""
        def site(use_gather: bool) -> gs.Graph:
            inp = gs.Variable("x", dtype=x.dtype or np.float32, shape=shape)
            fmt = A.get_format(x)
            if fmt:
                A.set_format(inp, fmt)
            out = gs.Variable("y", dtype=inp.dtype, shape=shape)
            if use_gather:
                nodes = [gs.Node("Gather", inputs=[inp, gs.Constant("perm", shuffle_permutation(shape[1], t1[1]))], outputs=[out], attrs={"axis": 1})]
            else:
                a = gs.Variable("a", dtype=inp.dtype, shape=t1)
                b = gs.Variable("b", dtype=inp.dtype, shape=[t1[0], t1[2], t1[1], t1[3], t1[4]])
                nodes = [gs.Node("Reshape", inputs=[inp, gs.Constant("s1", np.array(t1, np.int64))], outputs=[a]),
                         gs.Node("Transpose", inputs=[a], outputs=[b], attrs={"perm": [0, 2, 1, 3, 4]}),
                         gs.Node("Reshape", inputs=[b, gs.Constant("s2", np.array(shape, np.int64))], outputs=[out])]
            return gs.Graph(nodes=nodes, inputs=[inp], outputs=[out], opset=13)

        opts = {k: v for k, v in ctx.cost_options.items() if k == "precision_mode"}
        costs = [cm.estimate(site(False), **opts).total_us, cm.estimate(site(True), **opts).total_us]
        return (1 if costs[1] <= costs[0] else 0), costs

    def rewrite(self, m: Match, ctx) -> list[gs.Node]:
        r1, tr, r2 = m.nodes
        x = r1.inputs[0]
        c = static_shape(x)[1]
        perm = gs.Constant(m.names(f"{r2.name or 'shuffle'}_perm"), shuffle_permutation(c, m.groups))
        out = r2.outputs[0]
        r2.outputs.clear()
        if out.shape is None or static_shape(out) is None:  # a shuffle keeps the shape: say so
            out.shape = list(static_shape(x))
            out.dtype = out.dtype or x.dtype
        gather = gs.Node("Gather", name=m.names(f"{r2.name or 'shuffle'}_gather"), inputs=[x, perm], outputs=[out], attrs={"axis": 1})
        m.graph.nodes.append(gather)
        A.mark_created(gather, FuseChannelShuffle.name, replaced=[r1, tr, r2])
        return [r1, tr, r2]


@register
class FuseChannelShuffle(RulePass):
    """Replaces a Reshape/Transpose/Reshape channel shuffle by a Gather over channels.

    Cases:
      1. static shapes, any group count g dividing C;
      2. Reshape targets with 0 (copy) and -1 (infer) entries are resolved first;
      3. the cost model may keep the Transpose form where it estimates it cheaper.
    """

    name = "fuse_channel_shuffle"
    summary = "Channel shuffle (Reshape/Transpose/Reshape) -> Gather over channels, where cheaper."
    kind = PassKind.FUSION
    promise = EXACT
    rules = (_Shuffle(),)
