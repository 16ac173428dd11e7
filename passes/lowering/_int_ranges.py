"""Value ranges of a graph's integer tensors: the proof narrow_int64 narrows on.

    IntRanges(graph, max_tensor_bytes).of(t)  ->  Range(lo, hi, why)

Every integer tensor of the graph (top level) gets an interval [lo, hi] that holds every element
on every input the model accepts: a constant's min and max, a Shape's dims, the exact interval
arithmetic of Add/Sub/Mul/Div/Neg/Abs/Max/Min (Python ints: no wrap), the hull of what a
movement op (Concat, Gather, Slice, Reshape, Expand, ...) copies, Range between its start and
limit, ArgMax/TopK indices below their axis' size. Where nothing is known the interval is the
dtype's (int64: all of it) and ``why`` says where the unknown came from. Small 1-D values (shape
vectors) are also kept element by element, so ``Gather(Shape(x), 0)`` is the bound of x's dim 0
and not the hull of all of x's dims.

A dim is bounded when it is a number, or a symbol carried by a graph input whose other dims are
all numbers above 0: that input lives in device memory, so the symbol is at most
``max_tensor_bytes / (itemsize * product of the other dims)`` (the target's data file). A symbol
of an input whose other dims are symbols too is not bounded (another dim may be 0, and a tensor
of 0 elements has any size on its other axes). onnxruntime does not hold two inputs that name
one symbol to one size, so a symbol's bound is the weakest over every input carrying it (and
none if one of them does not bound it).

A number in a tensor's shape is trusted where onnxruntime computes that shape from shapes
alone: not on the outputs of ops whose output shape depends on data (NonZero, Unique, Compress,
TopK with a computed k, Range, ...), of a Reshape/Expand/Tile/... whose shape operand is not a
constant, of a Slice with a negative step (onnxruntime and the spec disagree on a backward Slice
to INT64_MAX), or of a control-flow op.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir.graph import peek_values

__all__ = ["Range", "IntRanges", "INT32", "INT64", "fits_int32"]

INT32 = (-(2 ** 31), 2 ** 31 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)
_MAX_ELEMS = 64  # 1-D values kept element by element up to this length (shape vectors)


@dataclasses.dataclass(frozen=True)
class Range:
    lo: int
    hi: int
    why: str = ""  # where an unbounded value came from ("" when bounded)

    def fits(self, bounds: tuple[int, int] = INT32) -> bool:
        return bounds[0] <= self.lo and self.hi <= bounds[1]

    def text(self) -> str:
        return f"[{self.lo}, {self.hi}]"


def fits_int32(r: Range) -> bool:
    return r.fits(INT32)


def _dtype(t: gs.Tensor) -> np.dtype | None:
    try:
        return np.dtype(t.dtype) if t.dtype is not None else None
    except TypeError:
        return None


def _type_range(dt: np.dtype | None) -> tuple[int, int] | None:
    if dt is None:
        return None
    if dt == np.bool_:
        return (0, 1)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return (int(info.min), int(info.max))
    return None


#: ops whose output shape onnxruntime computes from the data (not from input shapes alone)
_DATA_SHAPED = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit", "RegexFullMatch"})
#: ops whose output shape is an input's value: trusted only when that operand is a constant
_SHAPE_OPERAND = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
                  "Pad": (1, 2), "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,), "TopK": (1,),
                  "CenterCropPad": (1,), "Col2Im": (1, 2), "Slice": (1, 2, 3, 4)}
_CONTROL = frozenset({"Loop", "Scan", "If"})


def _untrusted_shape(t: gs.Tensor) -> str:
    """Why the numbers in ``t``'s declared shape may not be what onnxruntime computes (empty:
    they are): a graph input's and a constant's are (onnxruntime checks an input's)."""
    if isinstance(t, gs.Constant) or not t.inputs:
        return ""
    p = t.inputs[0]
    if p.op in _DATA_SHAPED or p.op in _CONTROL or p.domain not in (None, "", "ai.onnx"):
        return f"comes from {p.op}, whose output shape depends on the data"
    idx = _SHAPE_OPERAND.get(p.op)
    if idx is not None and not all(isinstance(p.inputs[i], gs.Constant) for i in idx if i < len(p.inputs)
                                   and p.inputs[i].name):
        return f"is set by {p.op}'s computed operand"
    if p.op == "Slice":
        steps = p.inputs[4] if len(p.inputs) > 4 else None
        if steps is not None and isinstance(steps, gs.Constant) and (np.asarray(peek_values(steps)) < 0).any():
            return "comes from a backward Slice (onnxruntime and the spec disagree on its length)"
    return ""


def _hull(rs: list[Range]) -> Range:
    why = next((r.why for r in rs if r.why), "")
    return Range(min(r.lo for r in rs), max(r.hi for r in rs), why)


def _tdiv(a: int, b: int) -> int:
    """Integer division truncated toward zero (C's, onnxruntime's integer Div)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _arith(op: str, a: Range, b: Range) -> tuple[int, int] | None:
    if op == "Add":
        return a.lo + b.lo, a.hi + b.hi
    if op == "Sub":
        return a.lo - b.hi, a.hi - b.lo
    if op == "Mul":
        c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return min(c), max(c)
    if op == "Div":
        if b.lo <= 0 <= b.hi:
            return None  # a divisor that may be 0
        c = [_tdiv(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return min(c), max(c)
    if op == "Max":
        return max(a.lo, b.lo), max(a.hi, b.hi)
    if op == "Min":
        return min(a.lo, b.lo), min(a.hi, b.hi)
    return None


_ARITH = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})
#: ops whose outputs only copy elements of their data input (input 0; Where: inputs 1 and 2)
_COPIES = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Slice",
                     "Gather", "GatherElements", "GatherND", "Split", "Concat", "Where"})


class IntRanges:
    """The value range of every integer tensor of ``graph`` (its top level)."""

    def __init__(self, graph: gs.Graph, max_tensor_bytes: int | None):
        self.graph = graph
        self.max_tensor_bytes = max_tensor_bytes
        self.sym_bounds = self._symbol_bounds()
        self._r: dict[int, Range] = {}
        self._elems: dict[int, list[Range]] = {}
        for node in graph.nodes:
            try:
                self._node(node)
            except (ValueError, TypeError, IndexError, KeyError, OverflowError):  # a value we cannot read proves nothing
                for t in node.outputs:
                    self._r.pop(id(t), None)
                    self._elems.pop(id(t), None)

    # -- dims ----------------------------------------------------------------------------------

    def _symbol_bounds(self) -> dict[str, int]:
        """symbol -> its largest value, from the graph inputs that bound it (module docstring)."""
        out: dict[str, int] = {}
        unbounded: set[str] = set()
        if not self.max_tensor_bytes:
            return out
        for t in self.graph.inputs:
            dt = _dtype(t)
            shape = t.shape
            if dt is None or shape is None or dt.kind not in "iufb":
                continue
            for k, d in enumerate(shape):
                if not isinstance(d, str) or not d:
                    continue
                others = [e for j, e in enumerate(shape) if j != k]
                if not all(isinstance(e, (int, np.integer)) and e > 0 for e in others):
                    unbounded.add(d)  # this input may carry the symbol at any size
                    continue
                bound = self.max_tensor_bytes // (max(1, dt.itemsize) * math.prod(int(e) for e in others))
                out[d] = max(out.get(d, bound), bound)  # the weakest: another input may disagree
        for t in self.graph.inputs:  # an input of unknown dtype or shape naming a symbol bounds nothing
            if t.shape is not None and _dtype(t) is None:
                unbounded.update(d for d in t.shape if isinstance(d, str) and d)
        for d in unbounded:
            out.pop(d, None)
        return out

    def dim(self, d: Any, what: str) -> Range:
        if isinstance(d, (int, np.integer)) and d >= 0:
            return Range(int(d), int(d))
        if isinstance(d, str) and d in self.sym_bounds:
            return Range(0, self.sym_bounds[d])
        if isinstance(d, str) and d:
            return Range(0, INT64[1], f"dim '{d}' of {what} is not bounded (no graph input carries it with only "
                                      "static dims beside it)")
        return Range(0, INT64[1], f"a dim of {what} is unknown")

    # -- lookups -------------------------------------------------------------------------------

    def of(self, t: gs.Tensor) -> Range:
        """The range of ``t``'s elements (its dtype's range, with a reason, where nothing is known)."""
        r = self._r.get(id(t))
        if r is not None:
            return r
        if isinstance(t, gs.Constant):
            return self._const(t)
        tr = _type_range(_dtype(t))
        if tr is None:
            return Range(INT64[0], INT64[1], f"'{t.name}' is not an integer tensor")
        if tr == INT64:
            src = "a graph input" if any(t is i for i in self.graph.inputs) else f"'{t.name}'"
            return Range(*tr, f"the values of {src} are not bounded")
        return Range(*tr)

    def elems(self, t: gs.Tensor) -> list[Range] | None:
        """Per-element ranges of a small 1-D (or scalar) ``t``, or None."""
        e = self._elems.get(id(t))
        if e is not None:
            return e
        if isinstance(t, gs.Constant):
            v = np.asarray(peek_values(t))
            if v.dtype.kind in "iub" and v.ndim <= 1 and v.size <= _MAX_ELEMS:
                return [Range(int(x), int(x)) for x in v.ravel()]
        return None

    def _const(self, t: gs.Constant) -> Range:
        v = np.asarray(peek_values(t))
        if v.dtype.kind not in "iub":
            return Range(INT64[0], INT64[1], f"'{t.name}' is not an integer tensor")
        if v.size == 0:
            return Range(0, 0)
        r = Range(int(v.min()), int(v.max()))
        self._r[id(t)] = r
        return r

    def _set(self, t: gs.Tensor, r: Range, elems: list[Range] | None = None) -> None:
        dt = _dtype(t)
        tr = _type_range(dt)
        if tr is None:
            return
        if not r.fits(tr):  # the original wraps (or a dtype's whole range): nothing proven beyond the type
            why = r.why or f"'{t.name}' may leave {dt.name}'s range"
            r = Range(tr[0], tr[1], why)
            elems = None
        if elems is not None and not self._vector_of(t, len(elems)):
            elems = None  # per-element ranges only for a known 0-D or 1-D value of that length
        if elems:
            e = _hull(elems)
            r = Range(max(r.lo, e.lo), min(r.hi, e.hi), e.why)  # both hold: their intersection does
        self._r[id(t)] = r
        if elems is not None:
            self._elems[id(t)] = elems

    @staticmethod
    def _vector_of(t: gs.Tensor, n: int) -> bool:
        """Whether ``t`` is known to be a scalar (n == 1) or a 1-D tensor of n elements."""
        shape = t.shape
        if shape is None or n > _MAX_ELEMS:
            return False
        if len(shape) == 0:
            return n == 1
        return len(shape) == 1 and isinstance(shape[0], (int, np.integer)) and int(shape[0]) == n

    # -- transfer functions ----------------------------------------------------------------------

    def _node(self, node: gs.Node) -> None:
        op = node.op
        if node.domain not in (None, "", "ai.onnx") or not node.outputs:
            return
        if all(_type_range(_dtype(t)) is None for t in node.outputs):
            return  # no integer output
        ins = node.inputs
        out = node.outputs[0]
        if op == "Shape":
            self._shape(node)
        elif op == "Size":
            shape = ins[0].shape
            if shape is not None and all(isinstance(d, (int, np.integer)) for d in shape):
                n = math.prod(int(d) for d in shape)
                self._set(out, Range(n, n), [Range(n, n)])
        elif op == "Constant":
            v = node.attrs.get("value")
            if isinstance(v, gs.Constant):
                self._set(out, self._const(v), self.elems(v))
        elif op in _ARITH and len(ins) >= 1:
            self._arith(node)
        elif op in ("Neg", "Abs"):
            a = self.of(ins[0])
            ea = self.elems(ins[0])
            f = (lambda r: Range(-r.hi, -r.lo, r.why)) if op == "Neg" else (
                lambda r: Range(0 if r.lo <= 0 <= r.hi else min(abs(r.lo), abs(r.hi)), max(abs(r.lo), abs(r.hi)), r.why))
            self._set(out, f(a), [f(x) for x in ea] if ea is not None else None)
        elif op == "Range" and len(ins) == 3:
            start, limit, delta = (self.of(t) for t in ins)
            # every element lies between start (included) and limit (excluded)
            if delta.lo > 0:
                r = Range(start.lo, max(start.lo, limit.hi - 1), start.why or limit.why)
            elif delta.hi < 0:
                r = Range(min(start.hi, limit.lo + 1), start.hi, start.why or limit.why)
            else:
                r = _hull([start, limit])
            self._set(out, r)
        elif op == "Cast":
            src = ins[0]
            if _type_range(_dtype(src)) is not None:
                self._set(out, self.of(src), self.elems(src))
        elif op == "ConstantOfShape":
            v = node.attrs.get("value")
            if isinstance(v, gs.Constant):
                r = self._const(v)
                self._set(out, r)
        elif op in ("ArgMax", "ArgMin"):
            self._index_of(node, out, int(node.attrs.get("axis", 0)))
        elif op == "TopK" and len(node.outputs) > 1:
            self._index_of(node, node.outputs[1], int(node.attrs.get("axis", -1)))
        elif op in _COPIES:
            self._copy(node)

    def _shape(self, node: gs.Node) -> None:
        x = node.inputs[0]
        shape = x.shape
        if shape is None:
            return
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end")
        dims = list(shape)[start:] if end is None else list(shape)[start:int(end)]
        why = _untrusted_shape(x)
        if why:  # the declared numbers are not what onnxruntime computes on every input
            dims = [d if isinstance(d, str) else None for d in dims]
        rs = [self.dim(d, f"'{x.name}'") if d is not None else Range(0, INT64[1], f"the shape of '{x.name}' {why}")
              for d in dims]
        if rs:
            self._set(node.outputs[0], _hull(rs), rs)
        else:
            self._set(node.outputs[0], Range(0, 0), [])

    def _index_of(self, node: gs.Node, out: gs.Tensor, axis: int) -> None:
        shape = node.inputs[0].shape
        if shape is None or not -len(shape) <= axis < len(shape):
            return
        d = self.dim(shape[axis], f"'{node.inputs[0].name}'")
        self._set(out, Range(0, max(0, d.hi - 1), d.why))

    def _arith(self, node: gs.Node) -> None:
        op, ins = node.op, node.inputs
        rs = [self.of(t) for t in ins]
        acc = rs[0]
        for b in rs[1:]:
            got = _arith(op, acc, b)
            if got is None:
                self._set(node.outputs[0], Range(INT64[0], INT64[1], f"{op} '{node.name}' may divide by 0"))
                return
            acc = Range(got[0], got[1], acc.why or b.why)
        elems = None
        es = [self.elems(t) for t in ins]
        if all(e is not None for e in es) and len(ins) == 2:
            a, b = es
            if len(a) == len(b) or len(a) == 1 or len(b) == 1:
                n = max(len(a), len(b))
                pairs = [(a[i if len(a) > 1 else 0], b[i if len(b) > 1 else 0]) for i in range(n)] if n else []
                got = [_arith(op, x, y) for x, y in pairs]
                if all(g is not None for g in got):
                    elems = [Range(g[0], g[1], x.why or y.why) for g, (x, y) in zip(got, pairs)]
        self._set(node.outputs[0], acc, elems)

    def _copy(self, node: gs.Node) -> None:
        op, ins = node.op, node.inputs
        if op == "Where":
            data = [t for t in ins[1:3]]
        elif op == "Concat":
            data = [t for t in ins if t.name]
        else:
            data = [ins[0]]
        if not data:
            return
        r = _hull([self.of(t) for t in data])
        elems = self._copy_elems(node, data)
        for t in node.outputs:
            if t.name:
                self._set(t, r, elems if t is node.outputs[0] else None)

    def _copy_elems(self, node: gs.Node, data: list[gs.Tensor]) -> list[Range] | None:
        op, ins = node.op, node.inputs
        if op in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            return self.elems(ins[0])
        if op == "Concat":
            es = [self.elems(t) for t in data]
            if all(e is not None and t.shape is not None and len(t.shape) == 1 for e, t in zip(es, data)):
                return [x for e in es for x in e]  # 1-D inputs: axis 0 (or -1) is the only axis
            return None
        if op == "Gather" and int(node.attrs.get("axis", 0)) in (0, -1) and isinstance(ins[1], gs.Constant):
            e = self.elems(ins[0])
            if e is None or not self._vector_of(ins[0], len(e)) or len(ins[0].shape) != 1:
                return None
            idx = np.asarray(peek_values(ins[1]))
            if e is None or idx.ndim > 1:
                return None
            n = len(e)
            picked = []
            for i in idx.ravel():
                i = int(i)
                if not -n <= i < n:
                    return None
                picked.append(e[i])
            return picked
        if op == "Slice" and len(ins) >= 3 and all(isinstance(t, gs.Constant) for t in ins[1:] if t.name):
            e = self.elems(ins[0])
            if e is None or not self._vector_of(ins[0], len(e)) or len(ins[0].shape) != 1:
                return None
            starts, ends = (np.asarray(peek_values(t)).ravel() for t in ins[1:3])
            axes = np.asarray(peek_values(ins[3])).ravel() if len(ins) > 3 and ins[3].name else [0]
            steps = np.asarray(peek_values(ins[4])).ravel() if len(ins) > 4 and ins[4].name else [1]
            if len(starts) != 1 or int(axes[0]) not in (0, -1) or int(steps[0]) != 1:
                return None  # step 1 only: a backward Slice to INT64_MAX is empty by the spec, not in onnxruntime
            # with step 1, Python slicing clamps as ONNX's Slice does (negative and INT64 bounds included)
            return e[slice(int(starts[0]), int(ends[0]), 1)]
        return None
