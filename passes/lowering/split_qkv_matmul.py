"""One fused QKV projection, split into one projection per part (auto_optimizer's "split QKV MatMul").

    (a) the ViT / timm form: the parts on a new axis, picked by Gathers (or Split + Squeeze):
        y = MatMul(x, W[K, G*H]) -> [elementwise c]* -> Reshape(P + [G] + T) -> Transpose(q) -> Gather(i, axis a)
            =>  y_i = MatMul(x, W[:, cols_i]) -> [elementwise c[cols_i]]* -> Reshape(P + T) -> Transpose(q')
    (b) the GPT-2 form (Conv1D c_attn): the parts cut from the last axis:
        y = Gemm(x, W, b) | MatMul(x, W) -> [elementwise c]* -> [Reshape(P + [G*H])] -> Split(axis=-1)
            =>  y_i = Gemm(x, W[:, cols_i], b[cols_i]) | MatMul -> [elementwise]* -> [Reshape(P + [H_i])]

where ``cols_i`` are the output columns the part i takes (``i*H .. (i+1)*H`` in (a), the Split's
sizes in (b)), q[a] is the part axis, and q' is q without it. Each output column of a MatMul is its
own dot product, so the part i of the fused result is the narrower MatMul of the columns it takes;
a constant of the elementwise ops (the bias Add, a scale Mul) is cut along the last axis where it has
the G*H columns, kept whole where it broadcasts (a scalar). The Reshape keeps its leading entries
(constants or the exporter's computed Concat) and loses the part entry (a) or takes H_i as its last
entry (b); it is provably a regrouping of the leading dims only: the entries from the part axis on
(a), or the last entry (b), are constants that multiply to G*H, the input's last dim.

Promise: exact, measured rather than assumed. Each output column is its own dot product, but
whether a runtime sums it in the same order at another width is the runtime's choice: onnxruntime
1.32 (MLAS) packs a constant 2-D weight once and blocks its sum over K with fixed strides, so the
narrower float32 MatMul or Gemm gives the same bits (894 random parts: M 1..128, K 1..4097, widths
1..384, 2-D and 3-D inputs, no bit differs); fed as a runtime input instead, the weight is not
packed and the K blocking follows the width (differences at K >= 256 and widths <= 128): hence a
constant weight is required. float16 is refused: onnxruntime's own float16 MatMul differs in the last bit of
a few elements in a thousand either way. Integers are exact (their sums wrap the same in any order).
float64 is refused: onnxruntime's float64 GEMM regroups a column's sum by width (measured: up to
half the elements differ in the last bit), and bfloat16 (no onnxruntime kernel to verify it on).

A lowering, not a fusion: like split_avgpool and split_large_kernel_conv it makes several kernels of
one, and it must run before the fusions that read Q, K and V apart (an attention fusion, fuse_matmul_add
making a Gemm of each part), which every lowering does (``runs_before = FUSION``).

Scored and per site: the cost model estimates the site both ways (symbolic dims at 1) and the split
is made only where it is cheaper on the target; the cost veto then judges the whole application.
Refused, with the reason (``--explain split_qkv_matmul``): weights or bias computed at run time or
shared, a part axis that is not a factor of the last axis, a Reshape whose target is computed where
the split must change it, a copy entry (0, allowzero=0) that would copy the changed last dim,
readers other than the part pickers, repeated indices, float64/bfloat16, the estimate.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, Pass

__all__ = ["SplitQkvMatMul"]

_NAME = "split_qkv_matmul"

_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")
_REFUSED_DTYPES = {
    "float64": "onnxruntime's float64 GEMM regroups a column's sum by the width (measured: up to half the elements "
               "differ in the last bit), so the split would not be exact",
    "bfloat16": "onnxruntime has no bfloat16 MatMul kernel to verify the split on",
    "float16": "onnxruntime's CPU float16 MatMul rounds a narrower product differently in the last bit (measured: "
               "9 bytes of a 1x16x192 projection at K=1024), so the split would not be exact",
}


class _Refuse(Exception):
    """A site this pass leaves alone; the message says why (for --explain)."""


def _std(n: gs.Node) -> bool:
    return n.domain in (None, "", "ai.onnx")


def _const(t: gs.Tensor) -> np.ndarray | None:
    return np.asarray(t.values) if isinstance(t, gs.Constant) else None


def _only_reader(t: gs.Tensor, g: gs.Graph, outputs: set[int]) -> gs.Node | None:
    if len(t.outputs) != 1 or id(t) in outputs:
        return None
    n = t.outputs[0]
    return n if _std(n) else None


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)


def _dtype_name(t: gs.Tensor) -> str:
    if t.dtype is None:
        return "unknown"
    if isinstance(t.dtype, (int, np.integer)) and not isinstance(t.dtype, bool):  # an ONNX type gs keeps as such
        import onnx

        return onnx.TensorProto.DataType.Name(int(t.dtype)).lower()
    try:
        return np.dtype(t.dtype).name
    except TypeError:
        return str(t.dtype)


@dataclasses.dataclass
class _Target:
    """A Reshape target: its entries (None where computed at run time) and how to rebuild it."""

    entries: list[int | None]
    concat: gs.Node | None  # the Concat that computes it (None: a constant)
    keep: list[gs.Tensor]  # the Concat's inputs kept as they are (the computed prefix)
    start: int  # the position where the constant suffix starts


def _reshape_target(r: gs.Node) -> _Target:
    t = r.inputs[1] if len(r.inputs) > 1 else None
    v = _const(t) if t is not None else None
    if v is not None:
        return _Target([int(e) for e in v.reshape(-1)], None, [], 0)
    p = t.inputs[0] if t is not None and len(t.inputs) == 1 else None
    if p is None or p.op != "Concat" or not _std(p) or int(p.attrs.get("axis", 0)) not in (0, -1):
        raise _Refuse(f"Reshape '{r.name}': its target is computed at run time (not a Concat of known pieces)")
    entries: list[int | None] = []
    start, keep = 0, []
    for i, piece in enumerate(p.inputs):
        c = _const(piece)
        shape = piece.shape
        if c is not None:
            entries.extend(int(e) for e in c.reshape(-1))
            continue
        if shape is None or len(shape) != 1 or not isinstance(shape[0], (int, np.integer)):
            raise _Refuse(f"Reshape '{r.name}': a computed piece of its target has no static length")
        entries.extend([None] * int(shape[0]))
        keep = list(p.inputs[: i + 1])
        start = len(entries)
    return _Target(entries, p, keep, start)


def _check_prefix(r: gs.Node, tgt: _Target, upto: int, rank_in: int) -> None:
    """The entries before ``upto`` are applied to the same leading dims before and after the split:
    a copy entry (0 with allowzero=0) must not copy the last input axis, whose size changes."""
    if int(r.attrs.get("allowzero", 0)):
        return
    for pos in range(rank_in - 1, upto):
        e = tgt.entries[pos]
        if e is None:
            raise _Refuse(f"Reshape '{r.name}': target entry {pos} is computed at run time and could be 0, which "
                          f"(allowzero=0) copies input dim {pos}: the last axis, whose size the split changes "
                          "(fix the shapes, e.g. with input shapes, to make the target constant)")
        if e == 0:
            raise _Refuse(f"Reshape '{r.name}': target entry {pos} is 0 (copy) of the last input axis, "
                          "whose size the split changes")


@dataclasses.dataclass
class _Site:
    mm: gs.Node  # the MatMul or Gemm
    chain: list[gs.Node]  # elementwise ops after it, in order
    reshape: gs.Node | None
    target: _Target | None
    anchor: gs.Node  # the Transpose / Split / Reshape whose output the parts are picked from
    form: str  # "axis" (a) or "last" (b)
    cols: list[tuple[int, int]]  # per part: [begin, end) of the fused output's columns
    outs: dict[int, gs.Tensor]  # part -> the tensor its branch writes (a picker's output)
    dead: list[gs.Node]  # every node the rewrite replaces
    part_pos: int = -1  # (a): the part axis in the Reshape's output
    perm: list[int] | None = None  # (a): the Transpose's permutation (None: no Transpose)
    # what the branches are built from, kept before the replaced nodes are unlinked
    x: gs.Tensor | None = None
    w: np.ndarray | None = None
    trans_b: bool = False
    c: np.ndarray | None = None  # Gemm's C
    n_out: int = 0
    mm_out: gs.Tensor | None = None
    mm_attrs: dict = dataclasses.field(default_factory=dict)
    chain_spec: list = dataclasses.field(default_factory=list)  # (op, const position, const, attrs, output)
    reshape_out: gs.Tensor | None = None
    reshape_attrs: dict = dataclasses.field(default_factory=dict)

    def capture(self, w: np.ndarray, n_out: int) -> "_Site":
        mm = self.mm
        self.x, self.w, self.n_out, self.mm_out, self.mm_attrs = mm.inputs[0], w, n_out, mm.outputs[0], dict(mm.attrs)
        self.trans_b = mm.op == "Gemm" and bool(int(mm.attrs.get("transB", 0)))
        if mm.op == "Gemm" and len(mm.inputs) > 2 and mm.inputs[2].name:
            self.c = _const(mm.inputs[2])
        for n in self.chain:
            pos = next(i for i, t in enumerate(n.inputs) if _const(t) is not None)
            self.chain_spec.append((n.op, pos, _const(n.inputs[pos]), dict(n.attrs), n.outputs[0]))
        if self.reshape is not None:
            self.reshape_out, self.reshape_attrs = self.reshape.outputs[0], dict(self.reshape.attrs)
        return self


@register
class SplitQkvMatMul(Pass):
    """Splits a fused QKV projection into one MatMul (or Gemm) per part.

    Cases:
      1. MatMul(x, W) [+ bias Add, scale Mul ...] -> Reshape(..., G, N, D) -> Transpose(q) -> G Gathers
         of scalar indices on the part axis (timm's ``qkv[0], qkv[1], qkv[2]``), or a Split into ones
         on it with a Squeeze of that axis per part (``unbind``); the Transpose may be absent;
      2. Gemm(x, W, b) or MatMul -> [Reshape keeping the last axis] -> Split on the last axis into three
         or more parts (GPT-2's Conv1D ``c_attn`` and ``split(n_embd, dim=2)``; any part sizes; two
         halves are the gated MLP that fuse_swiglu packs, left alone);
      3. a Reshape target that is a constant (0 and -1 entries as ONNX reads them) or the exporter's
         Concat of computed leading dims and constant trailing entries.
    """

    name = _NAME
    summary = ("A fused QKV MatMul/Gemm picked apart by Reshape/Transpose/Gather or Split -> one MatMul per part, "
               "where the cost model says it pays.")
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True
    needs_target = True
    anchor_ops = frozenset({"MatMul", "Gemm"})
    runs_before = (PassKind.FUSION,)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        names = None
        stats = {"split": 0, "parts": 0}
        for g in list(iter_graphs(graph)):
            outputs = {id(t) for t in g.outputs}
            sites = []
            for node in g.nodes:
                if node.op not in ("MatMul", "Gemm") or not _std(node):
                    continue
                try:
                    site = self._match(node, g, outputs)
                    if site is None:
                        continue
                    self._check_cost(site, ctx)
                except _Refuse as e:
                    ctx.explain(self.name, node, str(e))
                    continue
                sites.append(site)
            if not sites:
                continue
            if names is None:
                names = NameGen(graph)
            placed: dict[int, list[gs.Node]] = {}
            dead: set[int] = set()
            for site in sites:
                new = self._rewrite(site, names)
                placed[id(site.anchor)] = new
                dead.update(id(n) for n in site.dead)
                stats["split"] += 1
                stats["parts"] += len(site.outs)
            nodes = []
            for n in g.nodes:
                nodes.extend(placed.get(id(n), ()))
                if id(n) not in dead:
                    nodes.append(n)
            g.nodes = nodes
        return PassResult(stats["split"] > 0, stats)

    # -- matching ------------------------------------------------------------------------------

    def _match(self, mm: gs.Node, g: gs.Graph, outputs: set[int]) -> _Site | None:
        """The site rooted at ``mm``, None where ``mm`` is plainly no fused projection (nothing
        picks parts of it), or _Refuse with the reason where it is one this pass cannot split."""
        # walk down: elementwise ops, an optional Reshape, then the part picker
        chain: list[gs.Node] = []
        t = mm.outputs[0] if len(mm.outputs) == 1 else None
        if t is None:
            return None
        nxt = _only_reader(t, g, outputs)
        while nxt is not None and nxt.op in _ELEMENTWISE:
            chain.append(nxt)
            t = nxt.outputs[0]
            nxt = _only_reader(t, g, outputs)
        reshape = None
        if nxt is not None and nxt.op == "Reshape":
            reshape = nxt
            t = nxt.outputs[0]
            nxt = _only_reader(t, g, outputs)
        transpose = None
        if nxt is not None and nxt.op == "Transpose" and reshape is not None:
            transpose = nxt
            t = nxt.outputs[0]
        pickers = list(t.outputs)
        if not pickers or id(t) in outputs or not all(_std(p) and p.op in ("Gather", "Split") for p in pickers):
            return None
        if len(pickers) > 1 and any(p.op == "Split" for p in pickers):
            return None
        # from here on it is a fused projection: refusals say why
        w, n_out = self._weight(mm)
        self._check_chain(mm, chain, n_out)
        x = mm.inputs[0]
        if x.shape is None:
            raise _Refuse(f"{mm.op} '{mm.name}': the rank of its input is unknown")
        rank_in = 2 if mm.op == "Gemm" else max(1, len(x.shape))
        dt = _dtype_name(mm.outputs[0])
        if dt in _REFUSED_DTYPES:
            raise _Refuse(f"{mm.op} '{mm.name}' is {dt}: {_REFUSED_DTYPES[dt]}")
        if dt == "unknown":
            raise _Refuse(f"{mm.op} '{mm.name}': its output type is unknown")
        anchor = transpose if transpose is not None else (reshape if reshape is not None else (chain[-1] if chain else mm))
        dead = [mm, *chain] + ([reshape] if reshape is not None else []) + ([transpose] if transpose is not None else [])
        first = pickers[0]
        out_rank = None if t.shape is None else len(t.shape)
        site = None
        if first.op == "Split":
            axis = int(first.attrs.get("axis", 0))
            if out_rank is None:
                raise _Refuse(f"Split '{first.name}': the rank of the split tensor is unknown")
            axis = axis + out_rank if axis < 0 else axis
            if axis == out_rank - 1 and transpose is None:
                site = self._match_last(mm, chain, reshape, anchor, first, n_out, rank_in, dead, g, outputs)
        if site is None and not (first.op == "Split" and transpose is None and axis == out_rank - 1):
            site = self._match_axis(mm, chain, reshape, transpose, anchor, pickers, n_out, rank_in, dead, g, outputs)
        return None if site is None else site.capture(w, n_out)

    @staticmethod
    def _weight(mm: gs.Node) -> tuple[np.ndarray, int]:
        if len(mm.inputs) < 2:
            raise _Refuse(f"{mm.op} '{mm.name}' has no weight input")
        w = _const(mm.inputs[1])
        if w is None:
            raise _Refuse(f"{mm.op} '{mm.name}': its weight is computed at run time")
        if w.ndim != 2:
            raise _Refuse(f"{mm.op} '{mm.name}': its weight is {w.ndim}-D (only a 2-D weight is split by columns)")
        if len(mm.inputs[1].outputs) != 1:
            raise _Refuse(f"{mm.op} '{mm.name}': its weight is read by other nodes too (the split would store it twice)")
        trans_b = mm.op == "Gemm" and int(mm.attrs.get("transB", 0))
        n_out = w.shape[0] if trans_b else w.shape[1]
        if mm.op == "Gemm" and len(mm.inputs) > 2 and mm.inputs[2].name:
            c = _const(mm.inputs[2])
            if c is None:
                raise _Refuse(f"Gemm '{mm.name}': its C input is computed at run time")
            if c.ndim > 2 or (c.ndim >= 1 and c.shape[-1] not in (1, n_out)):
                raise _Refuse(f"Gemm '{mm.name}': C of shape {list(c.shape)} does not broadcast along the columns")
            if len(mm.inputs[2].outputs) != 1 and c.ndim >= 1 and c.shape[-1] == n_out:
                raise _Refuse(f"Gemm '{mm.name}': its C is read by other nodes too")
        return w, int(n_out)

    @staticmethod
    def _check_chain(mm: gs.Node, chain: list[gs.Node], n_out: int) -> None:
        rank = None if mm.outputs[0].shape is None else len(mm.outputs[0].shape)
        for n in chain:
            consts = [i for i, t in enumerate(n.inputs) if _const(t) is not None]
            if len(n.inputs) != 2 or len(consts) != 1:
                raise _Refuse(f"{n.op} '{n.name}' between the projection and its parts has no single constant operand")
            c = _const(n.inputs[consts[0]])
            if rank is None or c.ndim > rank:
                raise _Refuse(f"{n.op} '{n.name}': its constant of shape {list(c.shape)} could broadcast the output "
                              "to a higher rank")
            if any(d != 1 for d in c.shape[:-1]) or (c.ndim and c.shape[-1] not in (1, n_out)):
                raise _Refuse(f"{n.op} '{n.name}': its constant of shape {list(c.shape)} is not per column")
            if c.ndim and c.shape[-1] == n_out and len(n.inputs[consts[0]].outputs) != 1:
                raise _Refuse(f"{n.op} '{n.name}': its per-column constant is read by other nodes too")

    def _match_axis(self, mm, chain, reshape, transpose, anchor, pickers, n_out, rank_in, dead, g, outputs) -> _Site:
        """Case 1: the parts on an axis of the Reshape's output, picked by Gathers or Split + Squeeze."""
        if reshape is None:
            raise _Refuse(f"{mm.op} '{mm.name}': parts picked without a Reshape that makes a part axis")
        tgt = _reshape_target(reshape)
        ins, out = reshape.inputs[0].shape, reshape.outputs[0].shape
        if (tgt.concat is None and any(e in (0, -1) for e in tgt.entries) and _static(ins) and _static(out)
                and len(out) == len(tgt.entries)):
            tgt = _Target([int(d) for d in out], None, [], 0)  # all static: the resolved target
        r_out = len(tgt.entries)
        perm = [int(p) for p in transpose.attrs.get("perm", range(r_out)[::-1])] if transpose is not None else list(range(r_out))
        if sorted(perm) != list(range(r_out)):
            raise _Refuse(f"Transpose '{transpose.name}': perm {perm} does not match the Reshape's rank {r_out}")
        # the axis the pickers index, in the Reshape's output
        first = pickers[0]
        axis = int(first.attrs.get("axis", 0))
        axis = axis + r_out if axis < 0 else axis
        if not 0 <= axis < r_out:
            raise _Refuse(f"{first.op} '{first.name}': axis {axis} out of range")
        p = perm[axis]
        # the entries from the part axis on are constants that factor the last input axis
        if p < tgt.start:
            raise _Refuse(f"Reshape '{reshape.name}': the part axis {p} of its target is computed at run time")
        tail = tgt.entries[p:]
        parts = tail[0]
        if parts is None or parts < 2 or any(e is None or e <= 0 for e in tail):
            raise _Refuse(f"Reshape '{reshape.name}': target entries {tail} from the part axis on are not positive constants")
        if math.prod(tail) != n_out or n_out % parts:
            raise _Refuse(f"Reshape '{reshape.name}': target entries {tail} from the part axis on do not factor the "
                          f"projection's {n_out} columns into parts")
        _check_prefix(reshape, tgt, p, rank_in)
        width = n_out // parts
        outs: dict[int, gs.Tensor] = {}
        for pk in pickers:
            ax = int(pk.attrs.get("axis", 0))
            ax = ax + r_out if ax < 0 else ax
            if ax != axis:
                raise _Refuse(f"{pk.op} '{pk.name}' picks on axis {ax}, another picks on {axis}")
            if pk.op == "Gather":
                idx = _const(pk.inputs[1]) if len(pk.inputs) > 1 else None
                if idx is None or idx.ndim != 0 or idx.dtype.kind not in "iu":
                    raise _Refuse(f"Gather '{pk.name}': its index is not a scalar constant")
                i = int(idx)
                i = i + parts if i < 0 else i
                if not 0 <= i < parts:
                    raise _Refuse(f"Gather '{pk.name}': index {int(idx)} out of range (it fails at run time: kept so)")
                if i in outs:
                    raise _Refuse(f"Gather '{pk.name}': index {i} is taken twice")
                outs[i] = pk.outputs[0]
                dead.append(pk)
            else:  # Split into ones on the part axis, each part squeezed
                sizes = self._split_sizes(pk, parts)
                if sizes != [1] * parts:
                    raise _Refuse(f"Split '{pk.name}': parts {sizes} on the part axis are not one each")
                dead.append(pk)
                for i, part in enumerate(pk.outputs):
                    if not part.name or not part.outputs and id(part) not in outputs:
                        continue
                    readers = list(part.outputs)
                    if id(part) in outputs or len(readers) != 1 or readers[0].op != "Squeeze" or not _std(readers[0]):
                        raise _Refuse(f"Split '{pk.name}': part {i} is read by something other than one Squeeze")
                    sq = readers[0]
                    if self._squeeze_axes(sq, r_out) != [axis]:
                        raise _Refuse(f"Squeeze '{sq.name}' does not squeeze the part axis {axis} alone")
                    outs[i] = sq.outputs[0]
                    dead.append(sq)
        if not outs:
            return None
        cols = [(i * width, (i + 1) * width) for i in range(parts)]
        return _Site(mm, chain, reshape, tgt, anchor, "axis", cols, outs, dead, part_pos=p,
                     perm=perm if transpose is not None else None)

    def _match_last(self, mm, chain, reshape, anchor, split, n_out, rank_in, dead, g, outputs) -> _Site:
        """Case 2: a Split on the last axis (after a Reshape that keeps it, if any)."""
        tgt = None
        if reshape is not None:
            tgt = _reshape_target(reshape)
            last = tgt.entries[-1] if tgt.entries else None
            ins, out = reshape.inputs[0].shape, reshape.outputs[0].shape
            if (last == -1 and tgt.concat is None and _static(ins) and _static(out) and len(out) == len(tgt.entries)
                    and out[-1] == n_out):
                tgt = _Target([int(d) for d in out], None, [], 0)  # all static: the resolved target
                last = n_out
            if len(tgt.entries) - 1 < tgt.start or last != n_out:
                raise _Refuse(f"Reshape '{reshape.name}': the last entry of its target is not the constant {n_out} "
                              "(the projection's columns)")
            _check_prefix(reshape, tgt, len(tgt.entries) - 1, rank_in)
        sizes = self._split_sizes(split, None, n_out)
        if sizes is None or sum(sizes) != n_out or any(s <= 0 for s in sizes):
            raise _Refuse(f"Split '{split.name}': part sizes {sizes} do not cover the {n_out} columns")
        if len(sizes) < 3:
            raise _Refuse(f"Split '{split.name}': two halves of the last axis are the gated-MLP form (SwiGLU, "
                          "GeGLU), which fuse_swiglu packs into one MatMul: not split here")
        cols, at = [], 0
        for s in sizes:
            cols.append((at, at + s))
            at += s
        outs = {i: o for i, o in enumerate(split.outputs) if o.name and (o.outputs or id(o) in outputs)}
        dead.append(split)
        if not outs:
            return None
        return _Site(mm, chain, reshape, tgt, split, "last", cols, outs, dead)

    @staticmethod
    def _split_sizes(split: gs.Node, parts: int | None, dim: int | None = None) -> list[int] | None:
        n = len(split.outputs)
        if len(split.inputs) > 1 and split.inputs[1].name:
            s = _const(split.inputs[1])
            if s is None:
                raise _Refuse(f"Split '{split.name}': its sizes are computed at run time")
            return [int(v) for v in s.reshape(-1)]
        if "split" in split.attrs:
            return [int(v) for v in split.attrs["split"]]
        total = parts if parts is not None else dim
        if total is None:
            return None
        if "num_outputs" in split.attrs:  # opset 18: ceil(d / n) each, the last smaller
            k = int(split.attrs["num_outputs"])
            each = -(-total // k)
            return [each] * (k - 1) + [total - each * (k - 1)]
        if total % n:
            return None
        return [total // n] * n

    @staticmethod
    def _squeeze_axes(sq: gs.Node, rank: int) -> list[int] | None:
        if len(sq.inputs) > 1 and sq.inputs[1].name:
            a = _const(sq.inputs[1])
            if a is None:
                return None
            axes = [int(v) for v in a.reshape(-1)]
        elif "axes" in sq.attrs:
            axes = [int(v) for v in sq.attrs["axes"]]
        else:
            return None  # every unit axis: not the part axis alone in general
        return sorted(a + rank if a < 0 else a for a in axes)

    # -- the cost model ------------------------------------------------------------------------

    def _check_cost(self, site: _Site, ctx: PassContext) -> None:
        if not ctx.target.estimates:
            return
        graphs = self._site_graphs(site)
        if graphs is None:
            return  # a shape unknown: the cost veto judges the whole application
        opts = {k: v for k, v in ctx.cost_options.items() if k == "precision_mode"}
        cm = ctx.target.cost_model
        fused, split = (cm.estimate(g, **opts).total_us for g in graphs)
        if split >= fused:
            raise _Refuse(f"the cost model prefers the fused projection here on {ctx.target.name} "
                          f"({fused:.1f} us fused, {split:.1f} us split; symbolic dims at 1)")

    def _site_graphs(self, site: _Site) -> tuple[gs.Graph, gs.Graph] | None:
        """The site alone, fused and split, on copies of its tensors with static shapes (symbolic
        dims at 1), Reshape targets as constants and big weights as zeros (the estimate reads
        shapes only). None when a shape is unknown."""
        def static(t: gs.Tensor) -> list[int] | None:
            if t.shape is None:
                return None
            return [int(d) if isinstance(d, (int, np.integer)) else 1 for d in t.shape]

        for n in site.dead:
            if any(o.name and static(o) is None for o in n.outputs):
                return None
        if static(site.x) is None:
            return None
        memo: dict[int, gs.Tensor] = {}

        def sub(t: gs.Tensor) -> gs.Tensor:
            if not t.name:
                return gs.Variable.empty()
            if id(t) not in memo:
                if isinstance(t, gs.Constant):
                    v = np.asarray(t.values)
                    memo[id(t)] = gs.Constant(t.name, v if v.size <= 64 else np.zeros(v.shape, v.dtype))
                else:
                    memo[id(t)] = gs.Variable(t.name, dtype=t.dtype, shape=static(t))
            return memo[id(t)]

        x = sub(site.x)
        nodes = []
        for n in site.dead:
            ins = [sub(i) for i in n.inputs]
            if n is site.reshape:
                ins[1] = gs.Constant(f"{n.name}_target", np.array(static(n.outputs[0]), np.int64))
            nodes.append(gs.Node(n.op, n.name, dict(n.attrs), ins, [sub(o) for o in n.outputs]))
        outs = [memo[id(site.outs[i])] for i in sorted(site.outs)]
        fused = gs.Graph(nodes=nodes, inputs=[x], outputs=outs, opset=17)
        copies = {i: gs.Variable(f"part{i}", dtype=o.dtype, shape=static(o)) for i, o in site.outs.items()}
        branches = self._branches(site, NameGen(fused), x, copies, shape=static, zeros=True)
        split = gs.Graph(nodes=branches, inputs=[x], outputs=[copies[i] for i in sorted(copies)], opset=17)
        return fused, split

    # -- rewriting -----------------------------------------------------------------------------

    def _rewrite(self, site: _Site, names: NameGen) -> list[gs.Node]:
        """Unlink the replaced nodes and build the branches writing the pickers' tensors."""
        for n in site.dead:
            n.inputs.clear()
            n.outputs.clear()  # the branches write the pickers' tensors: names, types, shapes stay
        nodes = self._branches(site, names, site.x, dict(site.outs), shape=lambda t: t.shape, zeros=False)
        for n in nodes:
            A.mark_created(n, self.name, replaced=site.dead)
        return nodes

    def _branches(self, site: _Site, names: NameGen, x: gs.Tensor, outs: dict[int, gs.Tensor], *,
                  shape, zeros: bool) -> list[gs.Node]:
        """One branch per picked part: the narrower MatMul/Gemm, the elementwise ops with their
        constants cut to its columns, the Reshape without the part axis (or with the part's width
        last), the Transpose without it; the last node writes ``outs[i]``. ``shape(t)`` gives the
        shapes the new tensors take from the site's own (a symbolic dim stays symbolic in the
        rewrite, 1 in the cost model's copy); ``zeros``: weights as zeros of their shape."""
        nodes: list[gs.Node] = []
        label = site.mm.name or site.mm.op.lower()
        n_out = site.n_out
        targets: dict[tuple, gs.Tensor] = {}

        def const(name: str, arr: np.ndarray) -> gs.Constant:
            arr = np.ascontiguousarray(arr)
            return gs.Constant(names(name), np.zeros(arr.shape, arr.dtype) if zeros and arr.size > 64 else arr)

        def cut(arr: np.ndarray, a: int, b: int) -> np.ndarray:
            return arr[..., a:b] if arr.ndim and arr.shape[-1] == n_out else arr

        def with_last(s, width):
            return None if s is None else list(s[:-1]) + [width]

        for i in sorted(outs):
            a, b = site.cols[i]
            w = site.w[a:b, :] if site.trans_b else site.w[:, a:b]
            ins = [x, const(f"{label}_w{i}", w)]
            if site.c is not None:
                ins.append(const(f"{label}_c{i}", cut(site.c, a, b)))
            t = gs.Variable(names(f"{label}_part{i}"), dtype=site.mm_out.dtype, shape=with_last(shape(site.mm_out), b - a))
            nodes.append(gs.Node(site.mm.op, names(f"{label}_part{i}"), dict(site.mm_attrs), ins, [t]))
            for (op, pos, c, attrs, out) in site.chain_spec:
                operands = [t, const(f"{label}_{op.lower()}{i}", cut(c, a, b))]
                if pos == 0:
                    operands.reverse()
                t2 = gs.Variable(names(f"{label}_{op.lower()}{i}"), dtype=out.dtype, shape=with_last(shape(out), b - a))
                nodes.append(gs.Node(op, names(f"{label}_{op.lower()}{i}"), dict(attrs), operands, [t2]))
                t = t2
            if site.reshape is not None:
                r_out = shape(site.reshape_out)
                if site.form == "axis":
                    r_shape = None if r_out is None else [d for k, d in enumerate(r_out) if k != site.part_pos]
                else:
                    r_shape = with_last(r_out, b - a)
                target = self._target(site, i, names, r_shape if zeros else None, targets, nodes, label)
                last = site.perm is None and site.form == "axis" or site.form == "last"
                t2 = outs[i] if last else gs.Variable(names(f"{label}_reshape{i}"), dtype=t.dtype, shape=r_shape)
                nodes.append(gs.Node("Reshape", names(f"{label}_reshape{i}"), dict(site.reshape_attrs), [t, target], [t2]))
                t = t2
            if site.perm is not None:
                p = site.part_pos
                perm = [e - (e > p) for e in site.perm if e != p]
                nodes.append(gs.Node("Transpose", names(f"{label}_transpose{i}"), {"perm": perm}, [t], [outs[i]]))
            elif site.reshape is None:  # case 2 without a Reshape: the last node writes the part
                last_node = nodes[-1]
                last_node.outputs.clear()
                last_node.outputs.append(outs[i])
        return nodes

    @staticmethod
    def _target(site: _Site, i: int, names: NameGen, static_shape, memo: dict, nodes: list, label: str) -> gs.Tensor:
        """Part i's Reshape target: a constant, or the exporter's Concat with a new constant tail."""
        if static_shape is not None:  # the cost model's copy: the resolved shape
            return gs.Constant(names(f"{label}_target{i}"), np.array(static_shape, np.int64))
        tgt = site.target
        a, b = site.cols[i]
        if site.form == "axis":
            entries = [e for k, e in enumerate(tgt.entries) if k != site.part_pos]
        else:
            entries = tgt.entries[:-1] + [b - a]
        key = tuple(entries)
        if key in memo:
            return memo[key]
        if tgt.concat is None:
            t = gs.Constant(names(f"{label}_target{i}"), np.array(entries, np.int64))
        else:
            tail = gs.Constant(names(f"{label}_target_tail{i}"), np.array(entries[tgt.start:], np.int64))
            t = gs.Variable(names(f"{label}_target{i}"), dtype=np.int64, shape=[len(entries)])
            pieces = list(tgt.keep) + ([tail] if len(entries) > tgt.start else [])
            nodes.append(gs.Node("Concat", names(f"{label}_target{i}"), {"axis": 0}, pieces, [t]))
        memo[key] = t
        return t
