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
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.ir import annotations as A
from graphpass.ir.shapes import static_shape

__all__ = ["FuseChannelShuffle", "shuffle_permutation"]


def shuffle_permutation(channels: int, groups: int) -> np.ndarray:
    """Input channel read by each output channel of a ``groups``-way channel shuffle."""
    per = channels // groups
    j = np.arange(channels)
    return ((j % groups) * per + j // groups).astype(np.int64)


class _Batch:
    """A symbolic leading dim (the batch an exporter leaves dynamic); every other dim must be static."""

    def __repr__(self) -> str:
        return "N"


N = _Batch()


def _numel(dims: list) -> tuple[int, int]:
    """(how many times N appears, product of the static dims)."""
    return sum(d is N for d in dims), int(np.prod([d for d in dims if d is not N], dtype=np.int64))


def _target(reshape: gs.Node, src: list) -> list | None:
    """The Reshape's output dims for an input of dims ``src`` (ints, or N for the symbolic batch).

    0 copies the input's dim (allowzero=0); -1 is resolved only where it is exactly a static
    number or exactly N; anything else (allowzero=1 with a 0, a -1 that would be a multiple of N)
    is None: not provable for every batch.
    """
    shape_t = reshape.inputs[1] if len(reshape.inputs) > 1 else None
    if not isinstance(shape_t, gs.Constant):
        return None
    t = [int(v) for v in np.asarray(shape_t.values).ravel()]
    if 0 in t and int(reshape.attrs.get("allowzero", 0)):
        return None
    if any(v == 0 and i >= len(src) for i, v in enumerate(t)):
        return None
    t = [src[i] if v == 0 else v for i, v in enumerate(t)]
    if t.count(-1) > 1 or any(v is not N and v < -1 for v in t):
        return None
    if t.count(-1) == 1:
        src_n, src_p = _numel(src)
        known_n, known_p = _numel([v for v in t if v is N or v != -1])
        if known_p <= 0 or src_p % known_p:
            return None
        rest = src_p // known_p
        if src_n == known_n:
            t[t.index(-1)] = rest
        elif src_n == known_n + 1 and rest == 1:
            t[t.index(-1)] = N
        else:
            return None
    return t if _numel(t) == _numel(src) else None


def _dims(t: gs.Tensor) -> list | None:
    """The tensor's dims with a symbolic (named or unknown) leading dim as N; None if another is not static."""
    shape = static_shape(t)
    if shape is not None:
        return list(shape)
    if t.shape is None or not len(t.shape):
        return None
    rest = list(t.shape[1:])
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in rest):
        return None
    return [N] + [int(d) for d in rest]


class _Shuffle(Rule):
    pattern = ("Reshape", "Transpose", "Reshape")

    def check(self, m: Match, ctx) -> MatchResult:
        r1, tr, r2 = m.nodes
        x = _dims(r1.inputs[0])
        if x is None or len(x) != 4:
            return MatchResult.fail("the shuffled tensor's shape is unknown or not 4-D "
                                    "(channels, height and width must be static; the batch may be symbolic)")
        n, c, h, w = x
        t1 = _target(r1, x)
        if t1 is None or len(t1) != 5 or t1[0] != n or t1[3:] != [h, w] or N in t1[1:3] or t1[1] * t1[2] != c:
            return MatchResult.fail(f"first Reshape to {t1} is not (N, g, C/g, H, W)")
        if list(tr.attrs.get("perm", [])) != [0, 2, 1, 3, 4]:
            return MatchResult.fail(f"Transpose perm {list(tr.attrs.get('perm', []))} is not (0, 2, 1, 3, 4)")
        t2 = _target(r2, [n, t1[2], t1[1], h, w])
        if t2 is None or len(t2) != 4 or t2[0] != n or t2[1:] != [c, h, w]:
            return MatchResult.fail(f"last Reshape to {t2} is not back to (N, C, H, W)")
        m.groups = t1[1]
        if ctx.target.estimates:
            # a symbolic batch is costed at 1 (the choice is per image: both forms scale with N)
            one = [1 if d is N else d for d in x]
            choice, costs = self._ask(ctx.target.cost_model, r1.inputs[0], one, [1 if d is N else d for d in t1], ctx)
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

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        r1, tr, r2 = m.nodes
        x = r1.inputs[0]
        c = _dims(x)[1]
        perm = gs.Constant(m.names(f"{r2.name or 'shuffle'}_perm"), shuffle_permutation(c, m.groups))
        # a shuffle keeps the shape: say so (the engine keeps the output's own shape if static)
        return m.op("Gather", [x, perm], {"axis": 1}, name=m.names(f"{r2.name or 'shuffle'}_gather"),
                    dtype=x.dtype, shape=list(x.shape))


@register
class FuseChannelShuffle(RulePass):
    """Replaces a Reshape/Transpose/Reshape channel shuffle by a Gather over channels.

    Cases:
      1. static shapes, any group count g dividing C;
      2. a symbolic batch (what exporters write) with static C, H, W: the Reshape targets must then
         carry the batch as 0 (copy) or as the one -1;
      3. Reshape targets with 0 (copy) and -1 (infer) entries are resolved first (allowzero=1 with a
         0 is refused);
      4. the cost model may keep the Transpose form where it estimates it cheaper.
    """

    name = "fuse_channel_shuffle"
    summary = "Channel shuffle (Reshape/Transpose/Reshape) -> Gather over channels, where cheaper."
    kind = PassKind.FUSION
    promise = EXACT
    rules = (_Shuffle(),)
