"""Partial-shape evaluation: shape arithmetic folded where the dims it reads are known.

    Shape(x)[...] -> Gather/Slice/Concat/Unsqueeze/Squeeze/Cast/Add/Sub/Mul/Div -> v
        every element of v known                                    =>  constant v
    Reshape(x, t), t partly known                                    =>  Reshape(x, constant t')
        t' keeps the known entries, writes 0 ("copy") for an entry that is dim i of x itself at
        position i (under allowzero=1 too, by writing allowzero=0, when t holds no literal 0),
        and -1 for the one entry left unknown when the product of the other entries is known
        and nonzero (so the -1 can only stand for that entry's value)
    Reshape(x, t) with t equal to x's own shape                      =>  x
    Expand(x, t) with broadcast(shape(x), t) == shape(x)             =>  x
    Tile(x, r) with r all ones                                       =>  x
    Slice(x, ...) taking every element                               =>  x

Each int64/int32 scalar or vector of at most ``_MAX_ELEMS`` elements is evaluated symbolically
in one walk over the graph (and every If/Loop/Scan body, outer-scope values visible): each
element is a known int, "dim i of tensor t" (a symbolic dim, equal only to itself), or unknown.
A tensor's dims are followed back through the ops that keep or compute them (elementwise and
broadcasting ops, Transpose, Reshape, Slice, Concat, Split, Gather, MatMul, Conv/pool windows),
in graph order so no recursion runs deep; the ints proven where a tensor's shape says symbolic
or nothing are written into its shape for the passes after this one. Two symbolic dims with the
same ``dim_param`` name are not assumed equal unless ``trust_dim_params`` says so.

Exactness (for every input on which the original model runs): a folded element is the value the
original computes; Div is folded only for non-negative operands and a nonzero divisor (onnxruntime
truncates, ONNX does not say); a symbolic dim survives a Cast only to int64; a Reshape target gets
a -1 only where the other entries' product is a known nonzero number (onnxruntime refuses to infer
a -1 next to a 0 product, so an unknown 0 there would turn a run into an error or a wrong shape).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir.graph import iter_graphs, peek_values
from graphpass.passes.cleanup._common import is_onnx_op
from graphpass.passes.cleanup._fold_bounds import valid_shape_operand
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT
from graphpass.passes.framework.rewrite import Match, MatchResult, Rule, RulePass, Scope, apply_rules

__all__ = ["SimplifyShapes"]

#: Longest scalar/vector the evaluation tracks (shape vectors are short; this bounds the work).
_MAX_ELEMS = 64

_INT64_MAX = int(np.iinfo(np.int64).max)

_INT_TYPES = {onnx.TensorProto.INT64: np.dtype(np.int64), onnx.TensorProto.INT32: np.dtype(np.int32)}


class _Dim:
    """Symbolic element: dim ``axis`` of ``tensor`` (compared by identity of the tensor)."""

    __slots__ = ("tensor", "axis")

    def __init__(self, tensor: gs.Tensor, axis: int):
        self.tensor = tensor
        self.axis = axis

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Dim) and other.tensor is self.tensor and other.axis == self.axis

    def __hash__(self) -> int:
        return hash((id(self.tensor), self.axis))

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{self.axis}]"


class _Param(_Dim):
    """Symbolic element under ``trust_dim_params``: the dim named ``name`` (any tensor's dim
    whose ``dim_param`` is that name)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__(None, -1)
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Param) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("param", self.name))

    def __repr__(self) -> str:
        return f"'{self.name}'"


def _known(e) -> bool:
    return isinstance(e, int)


class _Vec:
    """A tracked int tensor: its elements (int, _Dim or None), 0-D or 1-D, and its dtype."""

    __slots__ = ("elems", "scalar", "dtype")

    def __init__(self, elems: Sequence, scalar: bool, dtype: np.dtype):
        self.elems = tuple(elems)
        self.scalar = scalar
        self.dtype = np.dtype(dtype)

    @property
    def known(self) -> bool:
        return all(_known(e) for e in self.elems)

    def ints(self) -> list[int] | None:
        return [int(e) for e in self.elems] if self.known else None

    def array(self) -> np.ndarray:
        a = np.array(self.elems, dtype=self.dtype)
        return a.reshape(()) if self.scalar else a


_TRACKED = (np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.bool_))


def _from_array(a: np.ndarray) -> _Vec | None:
    if a.dtype not in _TRACKED or a.ndim > 1 or a.size > _MAX_ELEMS:
        return None
    cast = bool if a.dtype == np.bool_ else int
    return _Vec([cast(v) for v in a.ravel()], a.ndim == 0, a.dtype)


#: Ops whose output has the shape of their first input (so a symbolic dim of the output is that
#: input's dim): unary elementwise ops and normalizations.
_SAME_SHAPE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BatchNormalization", "Cast", "CastLike", "Ceil",
    "Celu", "Clip", "Cos", "Cosh", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish",
    "Hardmax", "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "LpNormalization", "Mish", "Neg", "Not", "PRelu", "Reciprocal", "Relu", "Round", "Selu",
    "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu",
})
#: Ops whose output keeps dim 0 (the batch) of their first input.
_SAME_BATCH = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
                         "GlobalMaxPool", "GlobalLpPool", "ConvInteger", "QLinearConv"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where"})
class _Product:
    """An int times a multiset of symbolic dims."""

    def __init__(self, elems: Sequence):
        self.coef = 1
        self.syms: dict[_Dim, int] = {}
        for e in elems:
            self.mul(e)

    def mul(self, e) -> None:
        if _known(e):
            self.coef *= int(e)
        else:
            self.syms[e] = self.syms.get(e, 0) + 1

    def divide(self, other: "_Product"):
        """self / other as an int or one _Dim, when the division is exact; else None."""
        left = dict(self.syms)
        for sym, n in other.syms.items():
            if left.get(sym, 0) < n:
                return None
            left[sym] -= n
        left = [s for s, n in left.items() for _ in range(n)]
        if other.coef <= 0 or self.coef % other.coef:
            return None
        q = self.coef // other.coef
        if not left:
            return q
        return left[0] if len(left) == 1 and q == 1 else None


class _Analysis:
    """The symbolic value of every tracked tensor of a graph and its bodies (one walk)."""

    def __init__(self, graph: gs.Graph, trust_dim_params: bool = False):
        self.trust = trust_dim_params
        self.memo: dict[int, tuple[gs.Tensor, _Vec]] = {}
        self._roots: dict[tuple[int, int], int | _Dim] = {}
        self._ranks: dict[int, int | None] = {}
        self.refined = 0
        for g in iter_graphs(graph):  # outermost first: a body's outer-scope reads are known
            for node in g.nodes:  # in order: each tensor's dims are resolved before its readers ask
                for t in node.outputs:
                    self._refine(t)
                if not is_onnx_op(node) or len(node.outputs) != 1:
                    continue
                try:
                    vec = _EVAL[node.op](self, node) if node.op in _EVAL else None
                except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                    vec = None  # a malformed node: nothing known about it
                if vec is not None and len(vec.elems) <= _MAX_ELEMS and vec.dtype in _TRACKED:
                    out = node.outputs[0]
                    self.memo[id(out)] = (out, vec)

    def _refine(self, t: gs.Tensor) -> None:
        """Write the dims the evaluation proves (ints where ``t``'s shape says symbolic or
        unknown) into its shape, for the passes after this one."""
        shape = t.shape
        if shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
            return
        try:
            dims = self.dims(t)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            return  # a malformed producer: nothing proven
        if dims is None or shape is None and not any(_known(d) for d in dims):
            return
        if shape is None:
            shape = [None] * len(dims)  # the rank is proven too
        new = [d if _known(d) else shape[i] for i, d in enumerate(dims)]
        changed = sum(1 for a, b in zip(new, shape) if a != b)
        if changed:
            t.shape = new
            self.refined += changed

    def value(self, t: gs.Tensor | None) -> _Vec | None:
        if t is None or not t.name and not isinstance(t, gs.Constant):
            return None
        if isinstance(t, gs.Constant):
            shape = t.shape
            if shape is None or len(shape) > 1 or int(np.prod(shape, dtype=np.int64)) > _MAX_ELEMS:
                return None
            return _from_array(np.asarray(peek_values(t)))
        hit = self.memo.get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def rank(self, t: gs.Tensor) -> int | None:
        """t's rank: its shape's, else what its producer implies (an exporter's value_info may
        have none); cached."""
        if t.shape is not None:
            return len(t.shape)
        key = id(t)
        if key in self._ranks:
            return self._ranks[key]
        self._ranks[key] = None  # (a cycle guard; graphs are acyclic)
        r = self._producer_rank(t)
        self._ranks[key] = r
        return r

    def _producer_rank(self, t: gs.Tensor) -> int | None:
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if p is None or not is_onnx_op(p) or not p.inputs:
            return None
        if p.op == "Reshape" and len(p.inputs) > 1:
            v = self.value(p.inputs[1])  # a Reshape's rank is its target's length
            return None if v is None or v.scalar else len(v.elems)
        if p.op == "Split" or (p.outputs[0] is t and (
                p.op in _SAME_SHAPE or p.op in _SAME_BATCH or p.op in ("Transpose", "Concat", "Slice"))):
            return self.rank(p.inputs[0])
        if p.outputs[0] is t and p.op in _BROADCAST:
            ranks = [self.rank(i) for i in p.inputs if i.name or isinstance(i, gs.Constant)]
            return None if None in ranks or not ranks else max(ranks)
        if p.outputs[0] is t and p.op == "Gather" and len(p.inputs) == 2:
            rd, ri = self.rank(p.inputs[0]), self.rank(p.inputs[1])
            return rd - 1 + ri if rd is not None and ri is not None and rd >= 1 else None
        if p.outputs[0] is t and p.op == "MatMul" and len(p.inputs) == 2:
            rx, ry = self.rank(p.inputs[0]), self.rank(p.inputs[1])
            return max(rx, ry) if rx is not None and ry is not None and rx >= 2 and ry >= 2 else None
        return None

    def dims(self, t: gs.Tensor) -> list | None:
        """t's shape as elements (an int for a known dim, else the _Dim it provably equals), or None."""
        r = self.rank(t)
        if r is None:
            return None
        try:
            return [self.dim(t, i) for i in range(r)]
        except RecursionError:  # a very deep nest of Concats: say nothing rather than guess
            return None

    def dim(self, t: gs.Tensor, axis: int):
        """Dim ``axis`` of ``t`` on every input on which the graph runs: an int, or the _Dim it
        provably equals, followed back through the ops that keep or compute it (:meth:`_step`)."""
        seen = []
        while True:
            d = t.shape[axis] if t.shape is not None and axis < len(t.shape) else None
            if isinstance(d, (int, np.integer)) and d >= 0:
                hit = int(d)
                break
            key = (id(t), axis)
            if key in self._roots:
                hit = self._roots[key]
                break
            seen.append(key)
            step = self._step(t, axis)
            if step is None:
                hit = _Dim(t, axis)
                break
            if not isinstance(step, tuple):
                hit = step
                break
            t, axis = step
        if self.trust and isinstance(hit, _Dim) and not isinstance(hit, _Param):
            shape = hit.tensor.shape
            name = shape[hit.axis] if shape is not None and hit.axis < len(shape) else None
            if isinstance(name, str) and name:
                hit = _Param(name)  # the user vouches: one dim_param name, one value
        for key in seen:
            self._roots[key] = hit
        return hit

    def _step(self, t: gs.Tensor, axis: int):
        """(x, j) when dim ``axis`` of ``t`` is dim j of x; an int or _Dim when it is that value;
        None when nothing is known."""
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if p is None or not is_onnx_op(p) or not p.inputs:
            return None
        if p.op == "Split":
            return self._split(p, t, axis)
        if p.outputs[0] is not t:
            return None
        if p.op == "Reshape":
            return self._reshape(p, t, axis)
        if p.op == "Slice":
            return self._slice(p, t, axis)
        if p.op == "Concat":
            return self._concat(p, t, axis)
        if p.op in ("Conv", "MaxPool", "AveragePool") and axis > 0:
            return self._window(p, t, axis)
        if p.op == "MatMul" and len(p.inputs) == 2:
            return self._matmul(p, t, axis)
        if p.op in _BROADCAST:
            return self._broadcast(p, t, axis)
        if p.op == "Gather" and len(p.inputs) == 2:
            return self._gather(p, t, axis)
        if p.op in ("GlobalAveragePool", "GlobalMaxPool") and axis > 0:
            return (p.inputs[0], 1) if axis == 1 else 1
        return _keeps(p, t, axis, self.rank)

    def _broadcast(self, p: gs.Node, t: gs.Tensor, axis: int):
        """Multidirectional broadcasting: the operands' dims at this axis (aligned right) other
        than 1 must agree wherever the op runs; a known one, or a symbol they all are, is the result."""
        r = self.rank(t)
        if r is None:
            return None
        dims = []
        for i in p.inputs:
            if not (i.name or isinstance(i, gs.Constant)):
                continue
            ri = self.rank(i)
            if ri is None or ri > r:
                return None
            if axis >= r - ri:
                dims.append(self.dim(i, axis - (r - ri)))
        dims = [d for d in dims if not (_known(d) and d == 1)]
        if not dims:
            return 1
        known = {d for d in dims if _known(d)}
        if known:
            return known.pop() if len(known) == 1 else None
        return dims[0] if all(d == dims[0] for d in dims) else None

    def _gather(self, p: gs.Node, t: gs.Tensor, axis: int):
        """Gather(data, indices, axis=a): data's dims before a, indices' dims, data's dims after a."""
        data, idx = p.inputs
        rd, ri = self.rank(data), self.rank(idx)
        if rd is None or ri is None or rd < 1:
            return None
        a = int(p.attrs.get("axis", 0))
        a = a + rd if a < 0 else a
        if axis < a:
            return (data, axis)
        if axis < a + ri:
            return (idx, axis - a)
        return (data, axis - ri + 1)

    def _matmul(self, p: gs.Node, t: gs.Tensor, axis: int):
        """x @ y: x's rows, y's columns; a batch dim broadcast from both when they agree."""
        x, y = p.inputs
        r, rx, ry = self.rank(t), self.rank(x), self.rank(y)
        if r is None or r < 2 or rx is None or ry is None:
            return None
        if axis == r - 1:
            return (y, ry - 1) if ry >= 2 else None
        if axis == r - 2:
            return (x, rx - 2) if rx == r else None
        if ry == 2 and rx == r:
            return (x, axis)
        if rx == ry == r:
            dx, dy = self.dim(x, axis), self.dim(y, axis)
            if dx == dy:
                return dx
            if _known(dx) and _known(dy):
                return dx if dy == 1 else dy if dx == 1 else None
            for a, b in ((dx, dy), (dy, dx)):
                if _known(a) and a != 1:
                    return a  # the other is 1 or equal to it wherever the MatMul runs
        return None

    def _window(self, p: gs.Node, t: gs.Tensor, axis: int):
        """Conv / MaxPool / AveragePool: the channel dim, and a spatial dim by ONNX's formula."""
        x, r = p.inputs[0], self.rank(t)
        if r is None or self.rank(x) != r or r < 3:
            return None
        w = p.inputs[1] if p.op == "Conv" and len(p.inputs) > 1 else None
        if axis == 1:
            if p.op != "Conv":
                return (x, 1)
            return int(w.shape[0]) if isinstance(w, gs.Constant) else None
        if p.op != "Conv" and int(p.attrs.get("ceil_mode", 0)):
            return None  # ceil_mode's last-window rule differs between opsets: not evaluated
        i, nsp = axis - 2, r - 2
        n = self.dim(x, axis)
        kernel = p.attrs.get("kernel_shape")
        if kernel is None and isinstance(w, gs.Constant) and len(w.shape) == r:
            kernel = list(w.shape[2:])
        if not _known(n) or kernel is None or len(kernel) != nsp:
            return None
        strides = list(p.attrs.get("strides", [1] * nsp))
        dilations = list(p.attrs.get("dilations", [1] * nsp))
        pads = list(p.attrs.get("pads", [0] * 2 * nsp))
        auto_pad = p.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if len(strides) != nsp or len(dilations) != nsp or len(pads) != 2 * nsp or strides[i] <= 0:
            return None
        span = int(dilations[i]) * (int(kernel[i]) - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // int(strides[i]))
        elif auto_pad == "VALID":
            out = (n - span) // int(strides[i]) + 1
        elif auto_pad == "NOTSET":
            out = (n + int(pads[i]) + int(pads[i + nsp]) - span) // int(strides[i]) + 1
        else:
            return None
        return out if out >= 1 else None

    def _reshape(self, p: gs.Node, t: gs.Tensor, axis: int):
        x, v = p.inputs[0], self.value(self.input(p, 1))
        if v is None or v.scalar or len(v.elems) != self.rank(t):
            return None
        allowzero = int(p.attrs.get("allowzero", 0))
        e = v.elems[axis]
        xr = self.rank(x)
        if isinstance(e, _Dim):
            if allowzero or (xr is not None and axis < xr and self.dim(x, axis) == e):
                return e
            return None  # e may be 0 at run time, and then the dim is x's (allowzero=0 copies)
        if _known(e) and e > 0:
            return e
        if e == 0:
            return 0 if allowzero else ((x, axis) if xr is not None and axis < xr else None)
        if e != -1:
            return None
        # -1: x's element count over the other entries' product (nonzero wherever the Reshape
        # runs), as an int times symbolic dims: the symbols of the product must cancel
        xd = self.dims(x)
        if xd is None:
            return None
        num, den = _Product(xd), _Product([])
        for i, o in enumerate(v.elems):
            if i == axis:
                continue
            if _known(o) and o == 0 and not allowzero:
                o = xd[i] if i < len(xd) else None
            elif isinstance(o, _Dim) and not allowzero and not (i < len(xd) and xd[i] == o):
                return None  # o may be 0 at run time and copy x's dim instead
            if o is None or _known(o) and o <= 0:
                return None
            den.mul(o)
        return num.divide(den)

    def _slice(self, p: gs.Node, t: gs.Tensor, axis: int):
        x, r = p.inputs[0], self.rank(t)
        if r is None:
            return None
        if "starts" in p.attrs:  # Slice-1
            starts, ends = list(p.attrs["starts"]), list(p.attrs["ends"])
            axes = list(p.attrs.get("axes", range(len(starts))))
            steps = [1] * len(starts)
        else:
            starts, ends = self.ints(self.input(p, 1)), self.ints(self.input(p, 2))
            if self.input(p, 3) is not None:
                axes = self.ints(p.inputs[3])
            else:
                n = len(starts) if starts is not None else len(ends) if ends is not None else None
                axes = None if n is None else list(range(n))
            steps = self.ints(p.inputs[4]) if self.input(p, 4) is not None else None if axes is None else [1] * len(axes)
        if axes is None:
            return None
        axes = [a + r if a < 0 else a for a in axes]
        if axis not in axes:
            return (x, axis)  # an axis the Slice does not cut (whatever its bounds are)
        if starts is None or ends is None or steps is None or not len(starts) == len(ends) == len(axes) == len(steps):
            return None
        k = axes.index(axis)
        n = self.dim(x, axis)
        if not _known(n) or steps[k] == 0:
            return None
        return len(_slice_indices(n, int(starts[k]), int(ends[k]), int(steps[k])))

    def _concat(self, p: gs.Node, t: gs.Tensor, axis: int):
        r = self.rank(t)
        if r is None or "axis" not in p.attrs:
            return None
        a = int(p.attrs["axis"])
        a = a + r if a < 0 else a
        if axis != a:
            return (p.inputs[0], axis)  # a valid Concat's inputs agree off its axis
        sizes = [self.dim(i, a) for i in p.inputs]
        return sum(sizes) if all(_known(d) for d in sizes) else None

    def _split(self, p: gs.Node, t: gs.Tensor, axis: int):
        x, r = p.inputs[0], self.rank(t)
        if r is None:
            return None
        a = int(p.attrs.get("axis", 0))
        a = a + r if a < 0 else a
        if axis != a:
            return (x, axis)
        k = next(i for i, o in enumerate(p.outputs) if o is t)
        split = list(p.attrs["split"]) if "split" in p.attrs else (
            self.ints(p.inputs[1]) if self.input(p, 1) is not None else None)
        if split is not None:
            return int(split[k]) if len(split) == len(p.outputs) and split[k] >= 0 else None
        n = self.dim(x, a)
        return n // len(p.outputs) if _known(n) and n % len(p.outputs) == 0 else None

    def ints(self, t: gs.Tensor | None) -> list[int] | None:
        v = self.value(t)
        return None if v is None else v.ints()

    def input(self, node: gs.Node, i: int) -> gs.Tensor | None:
        return node.inputs[i] if i < len(node.inputs) and (node.inputs[i].name or isinstance(node.inputs[i], gs.Constant)) else None


def _keeps(p: gs.Node, t: gs.Tensor, axis: int, rank) -> tuple[gs.Tensor, int] | int | None:
    """(x, j) when dim ``axis`` of ``t`` (the first output of ``p``) is dim j of p's input x (or
    the int it is)."""
    x = p.inputs[0]
    r = rank(t)
    if p.op in _SAME_SHAPE or (p.op in _SAME_BATCH and axis == 0):
        return (x, axis) if rank(x) == r else None
    if p.op == "Transpose":
        perm = p.attrs.get("perm")
        perm = list(range(r))[::-1] if perm is None and r is not None else perm
        return (x, int(perm[axis])) if perm is not None and rank(x) == r and axis < len(perm) else None
    return None


# -- the evaluation rules, one per op --------------------------------------------------------------

def _shape(a: _Analysis, node: gs.Node) -> _Vec | None:
    dims = a.dims(node.inputs[0])
    if dims is None:
        return None
    r = len(dims)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    end = r if end is None else int(end)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return _Vec(dims[start:end], False, np.int64)


def _constant(a: _Analysis, node: gs.Node) -> _Vec | None:
    if "value" in node.attrs and isinstance(node.attrs["value"], gs.Constant):
        return a.value(node.attrs["value"])
    if "value_int" in node.attrs:
        return _Vec([int(node.attrs["value_int"])], True, np.int64)
    if "value_ints" in node.attrs:
        return _Vec([int(v) for v in node.attrs["value_ints"]], False, np.int64)
    return None


def _identity(a: _Analysis, node: gs.Node) -> _Vec | None:
    return a.value(node.inputs[0])


def _gather(a: _Analysis, node: gs.Node) -> _Vec | None:
    data, idx = a.value(node.inputs[0]), a.value(a.input(node, 1))
    if data is None or data.scalar or idx is None or not idx.known:
        return None
    if int(node.attrs.get("axis", 0)) not in (0, -1):
        return None
    n = len(data.elems)
    out = []
    for i in idx.ints():
        if not -n <= i < n:
            return None  # the original fails: leave it to fail
        out.append(data.elems[i])
    return _Vec(out, idx.scalar, data.dtype)


def _slice_indices(n: int, start: int, end: int, step: int) -> range:
    """The indices ONNX Slice takes along an axis of length n."""
    if start < 0:
        start += n
    if end < 0:
        end += n
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return range(start, end, step)


def _slice(a: _Analysis, node: gs.Node) -> _Vec | None:
    data = a.value(node.inputs[0])
    if data is None or data.scalar:
        return None
    if "starts" in node.attrs:  # Slice-1
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes, steps = node.attrs.get("axes", [0]), [1]
    else:
        starts, ends = a.ints(a.input(node, 1)), a.ints(a.input(node, 2))
        axes = a.ints(a.input(node, 3)) if a.input(node, 3) is not None else [0]
        steps = a.ints(a.input(node, 4)) if a.input(node, 4) is not None else [1]
    if None in (starts, ends, axes, steps) or not (len(starts) == len(ends) == len(axes) == len(steps) == 1):
        return None
    if axes[0] not in (0, -1) or steps[0] == 0:
        return None
    idx = _slice_indices(len(data.elems), int(starts[0]), int(ends[0]), int(steps[0]))
    return _Vec([data.elems[i] for i in idx], False, data.dtype)


def _concat(a: _Analysis, node: gs.Node) -> _Vec | None:
    if int(node.attrs.get("axis", 0)) not in (0, -1):
        return None
    parts = [a.value(t) for t in node.inputs]
    if not parts or any(p is None or p.scalar or p.dtype != parts[0].dtype for p in parts):
        return None
    return _Vec([e for p in parts for e in p.elems], False, parts[0].dtype)


def _axes(a: _Analysis, node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(v) for v in node.attrs["axes"]]
    if a.input(node, 1) is not None:
        return a.ints(node.inputs[1])
    return []


def _unsqueeze(a: _Analysis, node: gs.Node) -> _Vec | None:
    v = a.value(node.inputs[0])
    if v is None or not v.scalar or _axes(a, node) not in ([0], [-1]):
        return None
    return _Vec(v.elems, False, v.dtype)


def _squeeze(a: _Analysis, node: gs.Node) -> _Vec | None:
    v = a.value(node.inputs[0])
    if v is None or v.scalar or len(v.elems) != 1 or _axes(a, node) not in ([], [0], [-1]):
        return None
    return _Vec(v.elems, True, v.dtype)


def _cast(a: _Analysis, node: gs.Node) -> _Vec | None:
    v = a.value(node.inputs[0])
    to = _INT_TYPES.get(int(node.attrs.get("to", 0)))
    if v is None or to is None:
        return None
    out = []
    for e in v.elems:
        if _known(e):
            out.append(int(np.array(e, dtype=v.dtype).astype(to)))  # the wrap a narrowing Cast does
        else:
            out.append(e if to == np.int64 else None)  # a dim fits int64; int32 might wrap it
    return _Vec(out, v.scalar, to)


def _broadcast(x: _Vec, y: _Vec) -> tuple[list, list, bool] | None:
    nx, ny = len(x.elems), len(y.elems)
    if nx != ny and nx != 1 and ny != 1:
        return None  # the original fails
    n = max(nx, ny)
    xs = list(x.elems) * n if nx == 1 else list(x.elems)
    ys = list(y.elems) * n if ny == 1 else list(y.elems)
    return xs, ys, x.scalar and y.scalar


def _arith(op: str):
    def ev(a: _Analysis, node: gs.Node) -> _Vec | None:
        x, y = a.value(node.inputs[0]), a.value(a.input(node, 1))
        if x is None or y is None or x.dtype != y.dtype:
            return None
        b = _broadcast(x, y)
        if b is None:
            return None
        xs, ys, scalar = b
        return _Vec([_elem(op, p, q, x.dtype) for p, q in zip(xs, ys)], scalar, x.dtype)

    return ev


def _elem(op: str, p, q, dtype: np.dtype):
    if _known(p) and _known(q):
        if op == "Div":
            if q == 0 or p < 0 or q < 0:
                return None  # zero divisor; negative operands: ONNX does not define the rounding
            return p // q
        with np.errstate(over="ignore"):  # int arithmetic wraps, as in onnxruntime
            pa, qa = np.array(p, dtype=dtype), np.array(q, dtype=dtype)
            r = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](pa, qa)
        return int(r)
    if op == "Add":
        return p if q == 0 and _known(q) else (q if _known(p) and p == 0 else None)
    if op == "Sub":
        return p if _known(q) and q == 0 else None
    if op == "Mul":
        if (_known(q) and q == 0) or (_known(p) and p == 0):
            return 0  # whatever the other factor is
        return p if _known(q) and q == 1 else (q if _known(p) and p == 1 else None)
    if op == "Div":
        return p if _known(q) and q == 1 else None
    return None


def _equal(a: _Analysis, node: gs.Node) -> _Vec | None:
    x, y = a.value(node.inputs[0]), a.value(a.input(node, 1))
    if x is None or y is None or x.dtype != y.dtype:
        return None
    b = _broadcast(x, y)
    if b is None:
        return None

    def eq(p, q):
        if _known(p) and _known(q):
            return bool(p == q)
        if p is not None and p == q:
            return True  # the same dim of the same tensor
        if isinstance(p, _Dim) and _known(q) and q < 0 or isinstance(q, _Dim) and _known(p) and p < 0:
            return False  # a dim is never negative
        return None

    return _Vec([eq(p, q) for p, q in zip(b[0], b[1])], b[2], np.bool_)


def _where(a: _Analysis, node: gs.Node) -> _Vec | None:
    c, x, y = (a.value(a.input(node, i)) for i in range(3))
    if c is None or x is None or y is None or x.dtype != y.dtype or c.dtype != np.bool_:
        return None
    n = {len(v.elems) for v in (c, x, y)} - {1}
    if len(n) > 1:
        return None
    n = n.pop() if n else 1
    pick = [(v.elems * n if len(v.elems) == 1 else v.elems) for v in (c, x, y)]
    out = [None if k is None else (p if k else q) for k, p, q in zip(*pick)]
    return _Vec(out, c.scalar and x.scalar and y.scalar, x.dtype)


def _constant_of_shape(a: _Analysis, node: gs.Node) -> _Vec | None:
    shape = a.ints(node.inputs[0])
    value = node.attrs.get("value")
    if shape is None or len(shape) != 1 or not 0 <= shape[0] <= _MAX_ELEMS or not isinstance(value, gs.Constant):
        return None  # (the default value is a float 0: not a shape value)
    v = a.value(value)
    if v is None or len(v.elems) != 1:
        return None
    return _Vec(v.elems * shape[0], False, v.dtype)


_EVAL = {
    "Shape": _shape,
    "Equal": _equal,
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Constant": _constant,
    "Identity": _identity,
    "Gather": _gather,
    "Slice": _slice,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Cast": _cast,
    "Add": _arith("Add"),
    "Sub": _arith("Sub"),
    "Mul": _arith("Mul"),
    "Div": _arith("Div"),
}

#: Ops whose known result is worth a constant (a Constant node is one already).
_FOLDABLE = tuple(op for op in _EVAL if op != "Constant")


# -- the rewrites --------------------------------------------------------------------------------

class _Fold(Rule):
    """Case 1: a value whose every element is known becomes a constant, where it leaves the
    evaluated arithmetic (a reader that is not itself folded, or a graph output)."""

    pattern = (_FOLDABLE,)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if not is_onnx_op(anchor) or len(anchor.outputs) != 1:
            return None
        out = anchor.outputs[0]
        v = self.analysis.value(out)
        if v is None or not v.known:
            return None
        if not scope.is_output(out) and all(self._folded(r) for r in out.outputs):
            return None  # its readers fold: the constant goes there
        m = scope.match([anchor])
        m.vec = v
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        value = m.vec.array()
        for reader in m.anchor.outputs[0].outputs:
            for i, t in enumerate(reader.inputs):
                if t is not m.anchor.outputs[0]:
                    continue
                # (Range's bounds: a [1] tensor runs when computed, not as an initializer)
                if not valid_shape_operand(reader.op, i, value) or reader.op == "Range" and value.ndim:
                    return MatchResult.fail(f"{reader.op} cannot take this value as a constant input {i} "
                                            "(onnxruntime refuses it at load)")
        return MatchResult.success()

    def _folded(self, reader: gs.Node) -> bool:
        if reader.op not in _FOLDABLE or not is_onnx_op(reader) or len(reader.outputs) != 1:
            return False
        v = self.analysis.value(reader.outputs[0])
        return v is not None and v.known

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("folded")
        out = m.anchor.outputs[0]
        value = gs.Constant(m.names(f"{out.name}_folded"), m.vec.array())
        if m.writes_graph_output():  # a Constant node writes the output under its own name
            return m.op("Constant", [], {"value": value}, dtype=m.vec.dtype, shape=list(value.shape))
        return value


def _reshape_parts(node: gs.Node, analysis: _Analysis):
    x, t = node.inputs[0], analysis.input(node, 1)
    v = analysis.value(t)
    if v is None or v.scalar:
        return None
    return x, t, v, int(node.attrs.get("allowzero", 0))


class _ReshapeNoop(Rule):
    """Case 3: a Reshape to the shape its input already has (every entry its input's dim at the
    same position, or one free entry -1/unknown beside dims whose product is a known nonzero)."""

    pattern = ("Reshape",)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        parts = None if m is None else _reshape_parts(anchor, self.analysis)
        if parts is None:
            return None
        x, _, v, allowzero = parts
        dims = self.analysis.dims(x)
        if dims is None or len(dims) != len(v.elems):
            return None
        free = []
        for i, (e, d) in enumerate(zip(v.elems, dims)):
            if e == d or (_known(e) and e == 0 and not allowzero):
                continue  # x's own dim: the same known int, the same symbolic dim, or a 0 that copies it
            free.append(i)
        if len(free) > 1:
            return None
        if free:
            j = free[0]
            if _known(v.elems[j]) and v.elems[j] != -1:
                return None  # a known size other than x's dim: a real reshape
            if any(not (_known(d) and d > 0) for i, d in enumerate(dims) if i != j):
                return None  # the free entry is x's dim j only when the others' product is nonzero
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


class _ReshapeTarget(Rule):
    """Case 2: a computed Reshape target, partly known, becomes a constant with 0 and -1."""

    pattern = ("Reshape",)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        parts = None if m is None else _reshape_parts(anchor, self.analysis)
        if parts is None or isinstance(parts[1], gs.Constant) or not any(_known(e) or isinstance(e, _Dim)
                                                                           for e in parts[2].elems):
            return None
        m.parts = parts
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        x, _, v, allowzero = m.parts
        xdims = self.analysis.dims(x)
        # an entry proven equal to x's own dim at its place becomes 0 ("copy"); under allowzero=1
        # too, by writing allowzero=0, when the target holds no literal 0 that would change meaning
        # and no -1 (onnxruntime infers a -1 next to a 0 under allowzero=1: [0, -1] on a (0, 3, 2)
        # input gives (0, 6); under allowzero=0 the copied 0 makes the Reshape fail)
        can_copy = not (allowzero and any(_known(e) and e in (0, -1) for e in v.elems))
        target, free, copies = [], [], False
        for i, e in enumerate(v.elems):
            if _known(e):
                target.append(e)
            elif isinstance(e, _Dim) and can_copy and xdims is not None and i < len(xdims) and e == xdims[i]:
                target.append(0)  # the same value on every input, 0 included
                copies = True
            else:
                target.append(None)
                free.append(i)
        m.allowzero = 0 if copies else allowzero
        if len(free) > 1:
            return MatchResult.fail(f"target entries {free} are unknown: at most one can become -1")
        if free:
            j = free[0]
            if -1 in target:
                return MatchResult.fail(f"target entry {j} is unknown and another entry is already -1")
            for i, e in enumerate(target):
                if i == j:
                    continue
                if e == 0 and m.allowzero:
                    return MatchResult.fail(f"entry {i} is 0 with allowzero=1: a -1 cannot be inferred")
                size = e if e != 0 else (xdims[i] if xdims is not None and i < len(xdims) else None)
                if not (_known(size) and size > 0):
                    return MatchResult.fail(f"entry {i} may be 0 at run time: the -1 for entry {j} would be ambiguous")
            target[j] = -1
        if any(e < -1 for e in target):
            return MatchResult.fail("the target holds a negative entry other than -1 (the Reshape fails)")
        m.target = np.array(target, dtype=np.int64)
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("reshape_targets")
        node = m.anchor
        shape = gs.Constant(m.names(f"{node.inputs[1].name or 'shape'}_static"), m.target)
        attrs = {"allowzero": m.allowzero} if "allowzero" in node.attrs else None
        return m.copy(node, inputs=[node.inputs[0], shape], attrs=attrs)


class _ExpandNoop(Rule):
    """Case 4: an Expand whose target broadcasts to the input's own shape."""

    pattern = ("Expand",)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or len(anchor.inputs) < 2:
            return None
        x, v = anchor.inputs[0], self.analysis.value(anchor.inputs[1])
        dims = self.analysis.dims(x)
        if v is None or v.scalar or dims is None or len(v.elems) > len(dims):
            return None
        off = len(dims) - len(v.elems)
        for j, e in enumerate(v.elems):
            d = dims[off + j]
            if not ((_known(e) and e == 1) or e == d):
                return None
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


class _TileNoop(Rule):
    """Case 5: a Tile whose repeats are all ones."""

    pattern = ("Tile",)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or len(anchor.inputs) < 2:
            return None
        reps = self.analysis.ints(anchor.inputs[1])
        dims = self.analysis.dims(anchor.inputs[0])
        if reps is None or any(r != 1 for r in reps) or dims is None or len(reps) != len(dims):
            return None
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


class _SliceNoop(Rule):
    """Case 6: a Slice that takes every element (step 1 from the start to the end of each axis it
    cuts: an end of INT64_MAX, or at least the dim when the dim is known)."""

    pattern = ("Slice",)

    def __init__(self, analysis: _Analysis):
        self.analysis = analysis

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or "starts" in anchor.attrs:
            return None
        a = self.analysis
        x = anchor.inputs[0]
        r = a.rank(x)
        starts, ends = a.ints(a.input(anchor, 1)), a.ints(a.input(anchor, 2))
        if r is None or starts is None or ends is None or len(starts) != len(ends):
            return None
        axes = a.ints(anchor.inputs[3]) if a.input(anchor, 3) is not None else list(range(len(starts)))
        steps = a.ints(anchor.inputs[4]) if a.input(anchor, 4) is not None else [1] * len(starts)
        if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
            return None
        for axis, start, end, step in zip(axes, starts, ends, steps):
            axis = axis + r if axis < 0 else axis
            if step != 1 or not 0 <= axis < r:
                return None
            n = a.dim(x, axis)
            if _known(n):
                if len(_slice_indices(n, start, end, 1)) != n:
                    return None
            elif start != 0 or end != _INT64_MAX:
                return None
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


@register
class SimplifyShapes(RulePass):
    """Evaluates shape arithmetic symbolically and folds what it finds.

    Cases:
      1. an int shape value (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze, Cast, Identity,
         Add, Sub, Mul, Div) whose elements are all known, even though the tensor it measures
         has symbolic dims, becomes a constant;
      2. a computed Reshape target that is partly known becomes a constant: 0 for an entry that
         is the input's own dim at that position, -1 for the one entry left unknown;
      3. a Reshape to the shape its input already has is removed;
      4. an Expand whose target broadcasts to the input's own shape is removed;
      5. a Tile whose repeats are all ones is removed;
      6. a Slice that takes every element is removed.
    """

    name = "simplify_shapes"
    summary = "Fold Shape arithmetic whose used dims are known; constant Reshape targets; drop no-op Reshape/Expand/Tile."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    runs_after = ("fold_constants",)
    runs_before = ("merge_reshapes",)

    def __init__(self, *, trust_dim_params: bool = False):
        """Args:
            trust_dim_params: take two dims with the same ``dim_param`` name as equal (what the
                ONNX IR intends and torch's dynamo exporter guarantees), so a Reshape target
                built from one input's dims may copy another's. Off by default: onnxruntime
                does not check it, and a pass promising EXACT must hold for every input it runs.
        """
        self.trust_dim_params = bool(trust_dim_params)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        analysis = _Analysis(graph, self.trust_dim_params)
        rules = (_Fold(analysis), _ReshapeNoop(analysis), _ReshapeTarget(analysis), _ExpandNoop(analysis),
                 _TileNoop(analysis), _SliceNoop(analysis))
        counts = apply_rules(graph, rules, ctx, self.name)
        stats = {k: counts.total(k) for k in ("folded", "reshape_targets", "noop_removed")}
        stats["refused"] = counts.total("refused")
        stats["dims_resolved"] = analysis.refined
        stats["rules"] = counts
        return PassResult(counts.total("rewritten") > 0, stats)
