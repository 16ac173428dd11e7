"""simplify_shapes' analysis: the symbolic value of every tracked int tensor, and the dims of
every tensor, in one walk over a graph and its bodies.

    values  each op's output from its inputs' values (``_shape_eval.EVAL``, one rule per op)
    dims    dim i of t followed back through the op that wrote t (``ShapeAnalysis._step``) to an
            int, to dim j of another tensor, or to itself (a ``Dim``)

Dims are resolved in graph order (each tensor's before its readers ask), memoized per
(tensor, axis), so no recursion runs deep; the ints proven where a tensor's shape says symbolic
or nothing are written into its shape (``refined``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir.graph import iter_graphs, peek_values
from graphpass.passes.cleanup._common import is_onnx_op
from graphpass.passes.cleanup._shape_eval import EVAL
from graphpass.passes.cleanup._shape_values import (MAX_ELEMS, TRACKED, Dim, Param, Product, Vec, from_array,
                                                    is_known, slice_indices)

__all__ = ["ShapeAnalysis"]


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
_DEVICE = "graphpass.ascend"
#: graphpass device ops whose output has their first input's shape: normalizations along the last
#: axis (the weight is checked to lie along it) and GELU. Not AddRmsNorm (its operands' symbolic
#: dims are taken as equal, not proven); the rotary embedding and the attention are followed
#: through their bodies' broadcasts (ShapeAnalysis._step).
_DEVICE_SAME_SHAPE = frozenset({"RmsNorm", "LayerNorm", "Gelu", "GeluTanh"})


def _static(shape) -> bool:
    """Every dim a number >= 0 (asked of every node output: a loop, no generator, plain ints first)."""
    for d in shape:
        if type(d) is not int and not isinstance(d, (int, np.integer)):
            return False
        if d < 0:
            return False
    return True


#: the stored types gs decodes to a TRACKED dtype (int64, int32, bool): a weight of another type
#: has no Vec (from_array refuses its dtype)
_TRACKED_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})


class ShapeAnalysis:
    """The symbolic value of every tracked tensor of a graph and its bodies (one walk)."""

    def __init__(self, graph: gs.Graph, trust_dim_params: bool = False):
        self.trust = trust_dim_params
        self.memo: dict[int, tuple[gs.Tensor, Vec]] = {}
        self._roots: dict[tuple[int, int], int | Dim] = {}
        self._ranks: dict[int, int | None] = {}
        self._consts: dict[int, tuple[gs.Constant, object, Vec | None]] = {}  # id -> (it, its values, its Vec)
        self.refined = 0
        for g in iter_graphs(graph):  # outermost first: a body's outer-scope reads are known
            for node in g.nodes:  # in order: each tensor's dims are resolved before its readers ask
                for t in node.outputs:
                    shape = t.shape
                    if shape is None or not _static(shape):  # (_refine's own first test, without its call)
                        self._refine(t)
                if not is_onnx_op(node) or len(node.outputs) != 1:
                    continue
                try:
                    vec = EVAL[node.op](self, node) if node.op in EVAL else None
                except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                    vec = None  # a malformed node: nothing known about it
                if vec is not None and len(vec.elems) <= MAX_ELEMS and vec.dtype in TRACKED:
                    out = node.outputs[0]
                    self.memo[id(out)] = (out, vec)

    def _refine(self, t: gs.Tensor) -> None:
        """Write the dims the evaluation proves (ints where ``t``'s shape says symbolic or
        unknown) into its shape, for the passes after this one."""
        shape = t.shape
        if shape is not None and _static(shape):
            return
        try:
            dims = self.dims(t)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            return  # a malformed producer: nothing proven
        if dims is None or shape is None and not any(is_known(d) for d in dims):
            return
        if shape is None:
            shape = [None] * len(dims)  # the rank is proven too
        new = [d if is_known(d) else shape[i] for i, d in enumerate(dims)]
        changed = sum(1 for a, b in zip(new, shape) if a != b)
        if changed:
            t.shape = new
            self.refined += changed

    def value(self, t: gs.Tensor | None) -> Vec | None:
        if t is None or not t.name and not isinstance(t, gs.Constant):
            return None
        if isinstance(t, gs.Constant):
            # a constant's Vec decoded once per analysis (while its values object is the same:
            # passes replace a Constant's values, never write into them); a Vec is immutable
            values = t._values
            hit = self._consts.get(id(t))
            if hit is not None and hit[0] is t and hit[1] is values:
                return hit[2]
            shape = t.shape
            if shape is None or len(shape) > 1 or (int(shape[0]) if shape else 1) > MAX_ELEMS:
                vec = None
            elif type(values) is gs.ir.tensor.LazyValues and values.tensor.data_type not in _TRACKED_TYPES:
                vec = None  # not decoded to be refused by its dtype (a CNN's float biases: ~2k a run)
            else:
                vec = from_array(np.asarray(peek_values(t)))
            self._consts[id(t)] = (t, values, vec)
            return vec
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
        if p is not None and p.domain == _DEVICE and p.op in _DEVICE_SAME_SHAPE and p.inputs:
            return self.rank(p.inputs[0])
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
        """t's shape as elements (an int for a known dim, else the Dim it provably equals), or None."""
        r = self.rank(t)
        if r is None:
            return None
        try:
            return [self.dim(t, i) for i in range(r)]
        except RecursionError:  # a very deep nest of Concats: say nothing rather than guess
            return None

    def dim(self, t: gs.Tensor, axis: int):
        """Dim ``axis`` of ``t`` on every input on which the graph runs: an int, or the Dim it
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
                hit = Dim(t, axis)
                break
            if not isinstance(step, tuple):
                hit = step
                break
            t, axis = step
        if self.trust and isinstance(hit, Dim) and not isinstance(hit, Param):
            shape = hit.tensor.shape
            name = shape[hit.axis] if shape is not None and hit.axis < len(shape) else None
            if isinstance(name, str) and name:
                hit = Param(name)  # the user vouches: one dim_param name, one value
        for key in seen:
            self._roots[key] = hit
        return hit

    def _step(self, t: gs.Tensor, axis: int):
        """(x, j) when dim ``axis`` of ``t`` is dim j of x; an int or Dim when it is that value;
        None when nothing is known."""
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if p is not None and p.domain == _DEVICE and p.inputs:
            if p.op in _DEVICE_SAME_SHAPE:
                return (p.inputs[0], axis)  # graphpass's elementwise device ops keep their input's shape
            if p.op in ("RotaryEmbedding", "RotaryEmbeddingInterleaved") and p.outputs[0] is t:
                return self._broadcast(p, t, axis)  # X * Cos + rotate(X) * Sin: the three broadcast
            if p.op in ("Attention", "AttentionBSH") and p.outputs[0] is t and len(p.inputs) >= 4:
                return self._attention(p, axis)
            return None
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
        return _agree(dims)

    def _attention(self, p: gs.Node, axis: int):
        """A dim of graphpass's attention op's output (its body's broadcasts): BNSD [B, N, Sq, Dv]
        is Q's B, N, Sq broadcast with the mask's (B with K's and V's too), V's Dv; BSH [B, Sq, H]
        the same B and Sq, and Q's H where the mask has one head."""
        q, k, v, mask = p.inputs[:4]
        rq = self.rank(q)
        rm = self.rank(mask) if (mask.name or isinstance(mask, gs.Constant)) else 0
        if rq is None or rm is None or rm > 4:
            return None

        def m(score_axis: int):  # the mask's dim on an axis of the [B, N, Sq, Skv] scores
            j = score_axis - (4 - rm)
            return [self.dim(mask, j)] if j >= 0 else []

        bsh = p.op == "AttentionBSH"
        if rq != (3 if bsh else 4):
            return None
        if axis == 0:
            dims = [self.dim(q, 0), self.dim(k, 0), self.dim(v, 0)] + m(0)
        elif not bsh and axis in (1, 2):
            dims = [self.dim(q, axis)] + m(axis)
        elif not bsh and axis == 3:
            return (v, 3)
        elif bsh and axis == 1:
            dims = [self.dim(q, 1)] + m(2)
        elif bsh and axis == 2:
            heads = m(1)
            return (q, 2) if not heads or (is_known(heads[0]) and heads[0] == 1) else None
        else:
            return None
        return _agree(dims)

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
            if is_known(dx) and is_known(dy):
                return dx if dy == 1 else dy if dx == 1 else None
            for a, b in ((dx, dy), (dy, dx)):
                if is_known(a) and a != 1:
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
        if not is_known(n) or kernel is None or len(kernel) != nsp:
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
        if isinstance(e, Dim):
            if allowzero or (xr is not None and axis < xr and self.dim(x, axis) == e):
                return e
            return None  # e may be 0 at run time, and then the dim is x's (allowzero=0 copies)
        if is_known(e) and e > 0:
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
        num, den = Product(xd), Product([])
        for i, o in enumerate(v.elems):
            if i == axis:
                continue
            if is_known(o) and o == 0 and not allowzero:
                o = xd[i] if i < len(xd) else None
            elif isinstance(o, Dim) and not allowzero and not (i < len(xd) and xd[i] == o):
                return None  # o may be 0 at run time and copy x's dim instead
            if o is None or is_known(o) and o <= 0:
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
        if not is_known(n) or steps[k] == 0:
            return None
        idx = slice_indices(n, int(starts[k]), int(ends[k]), int(steps[k]))
        return None if idx is None else len(idx)

    def _concat(self, p: gs.Node, t: gs.Tensor, axis: int):
        r = self.rank(t)
        if r is None or "axis" not in p.attrs:
            return None
        a = int(p.attrs["axis"])
        a = a + r if a < 0 else a
        if axis != a:
            return (p.inputs[0], axis)  # a valid Concat's inputs agree off its axis
        sizes = [self.dim(i, a) for i in p.inputs]
        return sum(sizes) if all(is_known(d) for d in sizes) else None

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
        return n // len(p.outputs) if is_known(n) and n % len(p.outputs) == 0 else None

    def ints(self, t: gs.Tensor | None) -> list[int] | None:
        v = self.value(t)
        return None if v is None else v.ints()

    def input(self, node: gs.Node, i: int) -> gs.Tensor | None:
        return node.inputs[i] if i < len(node.inputs) and (node.inputs[i].name or isinstance(node.inputs[i], gs.Constant)) else None


def _agree(dims: list):
    """The broadcast of ``dims`` (one axis of several operands): the dims other than 1 must agree
    wherever the op runs; a known one, or a symbol they all are, is the result (None: not known)."""
    dims = [d for d in dims if not (is_known(d) and d == 1)]
    if not dims:
        return 1
    known = {d for d in dims if is_known(d)}
    if known:
        return known.pop() if len(known) == 1 else None
    return dims[0] if all(d == dims[0] for d in dims) else None


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
