"""BatchNormalization folded into the preceding Conv, ConvTranspose or Gemm.

    Conv(x, W, b) -> BN(scale, bias, mean, var, eps)  =>  Conv(x, W * s, (b - mean) * s + bias)
        with s = scale / sqrt(var + eps), per output channel (axis 0 of W; axis 1 for
        ConvTranspose; the output axis of B for Gemm)

Equal in fp32 up to reassociation rounding. Refused (with the reason, for --explain) when a parameter is not a
constant, is float16 or bfloat16, or is shared with another node; when the BN runs in training mode or uses
its extra outputs; for a grouped ConvTranspose; and for pre-opset-9 per-activation BN
(``spatial=0``). Also refused when folding would move an inf or NaN: a channel with
var + eps <= 0 (the BN divides by zero: ±inf, or NaN, where folded weights would give NaN
everywhere), a folded weight or bias that overflows float32, or a nonzero weight that W * s
rounds to zero (an inf input times it would be NaN, where the original gives ±inf).
The fused node keeps the BN's output tensor, so names downstream do not change.

Conv -> BN folds of float32 weights of one shape are computed together before the walk (the
same float64 operations element for element, so the same bits; see ``_prefetch``): at 10k nodes
one fold alone was ~25 small numpy calls, most of the pass's check time.
"""

from __future__ import annotations

import math
from operator import is_

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.passes.framework import MatchResult, PassKind, register
from graphpass.passes.framework.pass_base import REASSOCIATION
from graphpass.passes.framework.rewrite import Match, Rule, RulePass
from graphpass.ir.graph import iter_graphs, peek_values, read_values
from graphpass.passes.fusion._common import bn_inference_refusal, require_constants, shared_refusal

__all__ = ["FoldBatchNorm"]


def _fits(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``np.broadcast_to(array of shape, target)`` succeeds (without building the view)."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


_LAZY = gs.ir.tensor.LazyValues


def _f32_raw(t) -> tuple[bytes, tuple[int, ...]] | None:
    """A float32 Constant's values as little-endian bytes (ONNX's raw_data order) and its shape:
    the stored raw_data of a weight not read yet (no decode), an array's bytes; None for another
    dtype or a weight not in memory."""
    v = t._values
    if type(v) is np.ndarray:
        if v.dtype.kind == "f" and v.dtype.itemsize == 4:
            return v.astype("<f4", copy=False).tobytes(), v.shape
    elif type(v) is _LAZY:
        tp = v.tensor
        if tp.data_type == onnx.TensorProto.FLOAT and tp.data_location != onnx.TensorProto.EXTERNAL and tp.HasField("raw_data"):
            dims = tuple(tp.dims)
            if len(tp.raw_data) == 4 * math.prod(dims):
                return tp.raw_data, dims
    return None


def _bn_params(tensors) -> np.ndarray:
    """The BN's scale, bias, mean and var (four vectors of one length, as check found them) in
    float64, one row each. Float32 ones are joined and converted at once (~3 us; ~10 us one by
    one, ~13k folds at 100k nodes): the same float64 values, element for element."""
    raws = [_f32_raw(t) for t in tensors]
    if all(r is not None and len(r[1]) == 1 for r in raws) and len({r[1] for r in raws}) == 1:
        return np.frombuffer(b"".join([r[0] for r in raws]), dtype="<f4").astype(np.float64).reshape(len(raws), -1)
    # read-only views of the stored bytes: nothing here writes into them (float64 copies once)
    return [np.asarray(read_values(t), dtype=np.float64) for t in tensors]


_STD = (None, "", "ai.onnx")
#: rows of one batched computation: at most this many bytes of float64 weights
_BATCH_BYTES = 1 << 22
#: weights of more elements are folded one by one (numpy's per-call overhead is small beside them)
_BATCH_MAX_WEIGHT = 1 << 14
#: at most this many bytes of weights (float64 and the folded float32 together) held by the folds
#: computed ahead; the rest are folded one by one in the walk (a 1M-node CNN would otherwise hold
#: every fold's weights at once)
_PREFETCH_MAX_BYTES = 1 << 26

#: the folds of the running application computed before its walk (see :func:`_prefetch`):
#: id(BatchNormalization) -> (what it was computed from, (s, w, new_w, new_b, var + eps))
_PREFETCHED: dict[int, tuple[tuple, tuple]] | None = None


def _f32_bytes(t, seen: dict) -> tuple[bytes, tuple[int, ...]] | None:
    """:func:`_f32_raw` of a Constant (None for a Variable); ``seen``: id -> the answer for
    tensors asked already."""
    hit = seen.get(id(t))
    if hit is not None:
        return hit
    out = _f32_raw(t) if type(t) is gs.Constant else None
    seen[id(t)] = out if out is not None else False
    return out


def _sources(bn, seen: dict) -> tuple | None:
    """What a Conv -> BatchNormalization fold reads: (the weight's shape, whether the Conv has a
    bias, the bytes of the weight, the bias (if any) and the four BN vectors, epsilon), or None
    when it is not a plain float32 case."""
    if len(bn.inputs) < 5 or bn.domain not in _STD or len(bn.inputs[0].inputs) != 1:
        return None
    conv = bn.inputs[0].inputs[0]
    if conv.op != "Conv" or conv.domain not in _STD or len(conv.inputs) < 2:
        return None
    w = _f32_bytes(conv.inputs[1], seen)
    if not w or len(w[1]) < 2 or len(w[0]) > 4 * _BATCH_MAX_WEIGHT:
        return None
    vec = (w[1][0],)
    raws = [w[0]]
    has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
    for t in [*(conv.inputs[2:3] if has_bias else ()), *bn.inputs[1:5]]:
        p = _f32_bytes(t, seen)
        if not p or p[1] != vec:
            return None
        raws.append(p[0])
    try:
        eps = float(bn.attrs.get("epsilon", 1e-5))
    except (TypeError, ValueError):
        return None
    return w[1], has_bias, raws, eps


def _key(bn) -> tuple:
    """The objects a prefetched fold was computed from (compared by identity when it is used)."""
    conv = bn.inputs[0].inputs[0]
    ts = (conv, *conv.inputs[1:3], *bn.inputs[1:5])
    return ts + tuple(t.__dict__.get("_values") for t in ts[1:]) + (bn.attrs.get("epsilon", 1e-5),)


def _prefetch(graph) -> dict[int, tuple[tuple, tuple]]:
    """Conv -> BatchNormalization folds of plain float32 weights computed together, many per numpy
    call (one fold alone: ~25 numpy calls of a few channels each): the same float64 operations
    element for element as :meth:`_FoldInto._folded`, so the same bits. A fold whose checks
    (:meth:`_FoldInto.check_values`) all pass is kept for the walk; any other one (an inf or NaN
    to keep, a folded weight that rounds to zero, channels that do not fit) is computed again
    there, one by one, with its reason."""
    groups: dict[tuple, list] = {}
    seen: dict[int, object] = {}
    for g in iter_graphs(graph):
        for bn in g.nodes:
            if bn.op == "BatchNormalization":
                src = _sources(bn, seen)
                if src is not None:
                    groups.setdefault(src[:2], []).append((bn, src))
    out: dict[int, tuple[tuple, tuple]] = {}
    held = 0
    for (shape, has_bias), members in groups.items():
        if len(members) < 2:
            continue  # (one by one in the walk, as before)
        size = math.prod(shape)
        step = max(1, _BATCH_BYTES // (8 * size))
        for at in range(0, len(members), step):
            chunk = members[at:at + step]
            held += 12 * size * len(chunk)  # the float64 weights the folds view, their float32 copies
            if held > _PREFETCH_MAX_BYTES:
                return out
            n, c = len(chunk), shape[0]
            vecs = 5 if has_bias else 4
            with np.errstate(all="ignore"):
                w = np.frombuffer(b"".join([src[2][0] for _, src in chunk]), dtype="<f4").astype(np.float64)
                w = w.reshape((n,) + shape)
                v = np.frombuffer(b"".join([r for _, src in chunk for r in src[2][1:]]), dtype="<f4")
                v = v.astype(np.float64).reshape(n, vecs, c)
                b = v[:, 0] if has_bias else 0.0
                scale, beta, mean, var = v[:, -4], v[:, -3], v[:, -2], v[:, -1]
                var_eps = var + np.array([src[3] for _, src in chunk], dtype=np.float64)[:, None]
                s = scale / np.sqrt(var_eps)
                new_w = (w * s.reshape(s.shape + (1,) * (len(shape) - 1))).astype(np.float32)
                new_b = ((b - mean) * s + beta).astype(np.float32)
                axes = tuple(range(1, new_w.ndim))
                ok = ((var_eps > 0).all(axis=1) & np.isfinite(s).all(axis=1) & np.isfinite(new_w).all(axis=axes)
                      & np.isfinite(new_b).all(axis=1) & ~(new_w == 0).any(axis=axes))
            for i in np.flatnonzero(ok).tolist():
                bn = chunk[i][0]
                out[id(bn)] = (_key(bn), (s[i], w[i], new_w[i].copy(), new_b[i].copy(), var_eps[i]))
    return out


class _FoldInto(Rule):
    def check(self, m: Match, ctx) -> MatchResult:
        prod, bn = m.nodes
        refusal = bn_inference_refusal(bn, m.graph)
        if refusal is not None:
            return refusal
        weights = {"weight": prod.inputs[1]}
        if len(prod.inputs) > 2 and prod.inputs[2].name:
            weights["bias of the producer"] = prod.inputs[2]
        if self._prefetched(m):
            # computed before the walk from these very tensors: constants, float32, four vectors of
            # the weight's channels, every value check passed; what it does not say (whether
            # another node reads the weight or bias) is asked as below, in the same words
            refusal = shared_refusal(weights, prod, tuple(weights))
            return refusal if refusal is not None else MatchResult.success()
        params = {"scale": bn.inputs[1], "bias": bn.inputs[2], "mean": bn.inputs[3], "var": bn.inputs[4]}
        verdict = require_constants({**weights, **params}, prod, exclusive=tuple(weights))
        if not verdict:
            return verdict
        shapes = {k: tuple(t.shape) for k, t in params.items()}  # a Constant's shape without loading it
        if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 1:
            return MatchResult.fail(f"BatchNormalization parameters are not four vectors of one length: {shapes}")
        verdict = self.extra_check(m)
        if not verdict:
            return verdict
        return self.check_values(m)

    def folded(self, m: Match) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(s, the producer's weight, the folded weight and bias in float32); computed once per
        match (check and rewrite both need it, and each read of a lazy weight decodes it again)."""
        done = getattr(m, "bn_folded", None)
        if done is None:
            with np.errstate(all="ignore"):
                done = m.bn_folded = self._folded(m)
        return done

    def _folded(self, m: Match) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(under np.errstate(all="ignore"), which the caller sets)"""
        prod, bn = m.nodes
        scale, beta, mean, var = _bn_params(bn.inputs[1:5])
        m.bn_var_eps = var_eps = var + float(bn.attrs.get("epsilon", 1e-5))  # check_values reads it too
        s = scale / np.sqrt(var_eps)
        w = np.asarray(read_values(prod.inputs[1]), dtype=np.float64)
        old_b = np.asarray(read_values(prod.inputs[2]), dtype=np.float64) if len(prod.inputs) > 2 and prod.inputs[2].name else 0.0
        new_w, new_b = self.fold(prod, w, old_b, s, mean, beta)
        return s, w, new_w.astype(np.float32), np.asarray(new_b).astype(np.float32)

    def _prefetched(self, m: Match) -> bool:
        """Whether the fold was computed before the walk (:func:`_prefetch`) from the same Conv,
        tensors, values objects and epsilon; then the match holds it (asked once: a fold is
        checked once)."""
        if _PREFETCHED is None or type(self) is not _IntoConv:
            return False
        bn = m.nodes[1]
        hit = _PREFETCHED.pop(id(bn), None)
        if hit is not None and len(hit[0]) == len(key := _key(bn)) and all(map(is_, hit[0], key)):
            s, w, new_w, new_b, m.bn_var_eps = hit[1]
            m.bn_folded = (s, w, new_w, new_b)
            return True
        return False

    def check_values(self, m: Match) -> MatchResult:
        """Folding keeps inf and NaN where the BN puts them (see the module docstring)."""
        prod, bn = m.nodes
        with np.errstate(all="ignore"):
            try:
                s, w, new_w, new_b = m.bn_folded = self._folded(m)  # (folded(m) without a second errstate)
                pw = self.per_weight(prod, s, w)
                if not _fits(pw.shape, w.shape):  # what np.broadcast_to accepts
                    raise ValueError("the BN's channels do not broadcast over the weight")
            except ValueError:  # the BN's channel count is not the producer's (onnxruntime refuses it too)
                var_eps = getattr(m, "bn_var_eps", None)
                if var_eps is None:
                    var_eps = np.asarray(peek_values(bn.inputs[4]), np.float64) + float(bn.attrs.get("epsilon", 1e-5))
                return MatchResult.fail(f"BatchNormalization has {var_eps.size} channels, which do not fit "
                                        f"{prod.op} '{prod.name}' (weight {list(np.shape(peek_values(prod.inputs[1])))})")
            var_eps = m.bn_var_eps
            # ndarray methods, not np.any/np.all: ~13k folds at 100k nodes, each check a few us less
            positive = var_eps > 0
            if not positive.all():
                k = int(np.flatnonzero(~positive)[0])
                return MatchResult.fail(f"var + eps is {var_eps[k]:g} in channel {k}: the BN gives inf/NaN there, a fold would not")
            if not (np.isfinite(s).all() and np.isfinite(new_w).all() and np.isfinite(new_b).all()):
                return MatchResult.fail("a folded weight or bias overflows float32 (or the BN's parameters hold inf/NaN)")
            zero = new_w == 0  # rare: the full test (two more passes over W) only when some folded weight is 0
            if zero.any():
                per_weight = np.broadcast_to(pw, w.shape)
                if ((w != 0) & zero & (per_weight != 0)).any():
                    return MatchResult.fail("W * s rounds a nonzero weight to zero: an inf input would give NaN")
        return MatchResult.success()

    def extra_check(self, m: Match) -> MatchResult:
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        prod, bn = m.nodes
        _, _, new_w, new_b = self.folded(m)
        w = gs.Constant(m.names(prod.inputs[1].name + "_bnfold"), new_w)
        b = gs.Constant(m.names(f"{prod.name or prod.op}_bias_bnfold"), new_b)
        # Gemm: the old beta * C is in the folded bias; the producer edited in place when it can be
        # (it is dropped with the BN otherwise: the same graph, without a copy)
        return m.copy(prod, inputs=[prod.inputs[0], w, b], attrs={"beta": 1.0} if prod.op == "Gemm" else None,
                      reuse=True)


class _IntoConv(_FoldInto):
    pattern = ("Conv", "BatchNormalization")

    def per_weight(self, prod, s, w):
        return s.reshape((-1,) + (1,) * (w.ndim - 1))

    def fold(self, prod, w, b, s, mean, beta):
        return w * self.per_weight(prod, s, w), (b - mean) * s + beta


class _IntoConvTranspose(_FoldInto):
    pattern = ("ConvTranspose", "BatchNormalization")

    def extra_check(self, m: Match) -> MatchResult:
        if int(m.nodes[0].attrs.get("group", 1)) != 1:
            return MatchResult.fail("grouped ConvTranspose: output channels are split across groups")
        return MatchResult.success()

    def per_weight(self, prod, s, w):
        return s.reshape((1, -1) + (1,) * (w.ndim - 2))

    def fold(self, prod, w, b, s, mean, beta):
        return w * self.per_weight(prod, s, w), (b - mean) * s + beta


class _IntoGemm(_FoldInto):
    pattern = ("Gemm", "BatchNormalization")

    def extra_check(self, m: Match) -> MatchResult:
        gemm = m.nodes[0]
        if float(gemm.attrs.get("beta", 1.0)) == 0.0 and len(gemm.inputs) > 2 and gemm.inputs[2].name:
            return MatchResult.fail("Gemm with beta=0 and a C input")
        return MatchResult.success()

    def per_weight(self, prod, s, w):
        return s.reshape(-1, 1) if int(prod.attrs.get("transB", 0)) else s.reshape(1, -1)

    def fold(self, prod, w, b, s, mean, beta):
        c = float(prod.attrs.get("beta", 1.0)) * b
        return w * self.per_weight(prod, s, w), (c - mean) * s + beta


@register
class FoldBatchNorm(RulePass):
    """Folds inference BatchNormalization into the op before it.

    Cases:
      1. Conv (any group count) -> BN;
      2. ConvTranspose (group 1) -> BN;
      3. Gemm -> BN over the feature axis.
    """

    name = "fold_batchnorm"
    summary = "Fold inference BatchNormalization into the preceding Conv/ConvTranspose/Gemm."
    kind = PassKind.FUSION
    promise = REASSOCIATION
    ascend_name = "ConvBatchnormFusionPass"
    rules = (_IntoConv(), _IntoConvTranspose(), _IntoGemm())
    anchor_ops = frozenset({"BatchNormalization"})  # every rule's anchor (run is its own: RulePass asks this)

    def run(self, graph, ctx):
        """The rules' walk, with the Conv -> BN folds of one weight shape computed first (:func:`_prefetch`)."""
        global _PREFETCHED
        outer, _PREFETCHED = _PREFETCHED, _prefetch(graph)
        try:
            return super().run(graph, ctx)
        finally:
            _PREFETCHED = outer

