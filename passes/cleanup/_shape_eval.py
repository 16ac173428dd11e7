"""simplify_shapes' transfer functions: one per op, an output value from its inputs' values.

    Shape, Constant, Identity, Gather, Slice, Concat, Unsqueeze, Squeeze, Cast,
    Add, Sub, Mul, Div, Equal, Where, ConstantOfShape      ->  Vec (or None: nothing known)

Each rule is exact for every input on which the original runs: Div only for non-negative
operands and a nonzero divisor; a symbolic dim survives a Cast only to int64; an index out of
range leaves the value unknown (the original fails there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.passes.cleanup._shape_values import MAX_ELEMS, Dim, Vec, is_known, slice_indices

if TYPE_CHECKING:
    from graphpass.passes.cleanup._shape_analysis import ShapeAnalysis

__all__ = ["EVAL", "FOLDABLE"]

_INT_TYPES = {onnx.TensorProto.INT64: np.dtype(np.int64), onnx.TensorProto.INT32: np.dtype(np.int32)}


def _shape(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    dims = a.dims(node.inputs[0])
    if dims is None:
        return None
    r = len(dims)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    end = r if end is None else int(end)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return Vec(dims[start:end], False, np.int64)


def _constant(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    if "value" in node.attrs and isinstance(node.attrs["value"], gs.Constant):
        return a.value(node.attrs["value"])
    if "value_int" in node.attrs:
        return Vec([int(node.attrs["value_int"])], True, np.int64)
    if "value_ints" in node.attrs:
        return Vec([int(v) for v in node.attrs["value_ints"]], False, np.int64)
    return None


def _identity(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    return a.value(node.inputs[0])


def _gather(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
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
    return Vec(out, idx.scalar, data.dtype)


def _slice(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
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
    idx = slice_indices(len(data.elems), int(starts[0]), int(ends[0]), int(steps[0]))
    if idx is None:
        return None
    return Vec([data.elems[i] for i in idx], False, data.dtype)


def _concat(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    if int(node.attrs.get("axis", 0)) not in (0, -1):
        return None
    parts = [a.value(t) for t in node.inputs]
    if not parts or any(p is None or p.scalar or p.dtype != parts[0].dtype for p in parts):
        return None
    return Vec([e for p in parts for e in p.elems], False, parts[0].dtype)


def _axes(a: ShapeAnalysis, node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(v) for v in node.attrs["axes"]]
    if a.input(node, 1) is not None:
        return a.ints(node.inputs[1])
    return []


def _unsqueeze(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    v = a.value(node.inputs[0])
    if v is None or not v.scalar or _axes(a, node) not in ([0], [-1]):
        return None
    return Vec(v.elems, False, v.dtype)


def _squeeze(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    v = a.value(node.inputs[0])
    if v is None or v.scalar or len(v.elems) != 1 or _axes(a, node) not in ([], [0], [-1]):
        return None
    return Vec(v.elems, True, v.dtype)


def _cast(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    v = a.value(node.inputs[0])
    to = _INT_TYPES.get(int(node.attrs.get("to", 0)))
    if v is None or to is None:
        return None
    out = []
    for e in v.elems:
        if is_known(e):
            out.append(int(np.array(e, dtype=v.dtype).astype(to)))  # the wrap a narrowing Cast does
        else:
            out.append(e if to == np.int64 else None)  # a dim fits int64; int32 might wrap it
    return Vec(out, v.scalar, to)


def _broadcast(x: Vec, y: Vec) -> tuple[list, list, bool] | None:
    nx, ny = len(x.elems), len(y.elems)
    if nx != ny and nx != 1 and ny != 1:
        return None  # the original fails
    n = max(nx, ny)
    xs = list(x.elems) * n if nx == 1 else list(x.elems)
    ys = list(y.elems) * n if ny == 1 else list(y.elems)
    return xs, ys, x.scalar and y.scalar


def _operands(a: ShapeAnalysis, node: gs.Node) -> tuple[list, list, bool, np.dtype] | None:
    """A binary op's two values broadcast against each other (elements, scalar flag, dtype), or None."""
    x, y = a.value(node.inputs[0]), a.value(a.input(node, 1))
    if x is None or y is None or x.dtype != y.dtype:
        return None
    b = _broadcast(x, y)
    return None if b is None else (*b, x.dtype)


def _arith(op: str):
    def ev(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
        b = _operands(a, node)
        if b is None:
            return None
        xs, ys, scalar, dtype = b
        return Vec([_elem(op, p, q, dtype) for p, q in zip(xs, ys)], scalar, dtype)

    return ev


def _elem(op: str, p, q, dtype: np.dtype):
    if is_known(p) and is_known(q):
        if op == "Div":
            if q == 0 or p < 0 or q < 0:
                return None  # zero divisor; negative operands: ONNX does not define the rounding
            return p // q
        with np.errstate(over="ignore"):  # int arithmetic wraps, as in onnxruntime
            pa, qa = np.array(p, dtype=dtype), np.array(q, dtype=dtype)
            r = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](pa, qa)
        return int(r)
    if op == "Add":
        return p if q == 0 and is_known(q) else (q if is_known(p) and p == 0 else None)
    if op == "Sub":
        return p if is_known(q) and q == 0 else None
    if op == "Mul":
        if (is_known(q) and q == 0) or (is_known(p) and p == 0):
            return 0  # whatever the other factor is
        return p if is_known(q) and q == 1 else (q if is_known(p) and p == 1 else None)
    if op == "Div":
        return p if is_known(q) and q == 1 else None
    return None


def _equal(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    b = _operands(a, node)
    if b is None:
        return None

    def eq(p, q):
        if is_known(p) and is_known(q):
            return bool(p == q)
        if p is not None and p == q:
            return True  # the same dim of the same tensor
        if isinstance(p, Dim) and is_known(q) and q < 0 or isinstance(q, Dim) and is_known(p) and p < 0:
            return False  # a dim is never negative
        return None

    return Vec([eq(p, q) for p, q in zip(b[0], b[1])], b[2], np.bool_)


def _where(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    c, x, y = (a.value(a.input(node, i)) for i in range(3))
    if c is None or x is None or y is None or x.dtype != y.dtype or c.dtype != np.bool_:
        return None
    n = {len(v.elems) for v in (c, x, y)} - {1}
    if len(n) > 1:
        return None
    n = n.pop() if n else 1
    pick = [(v.elems * n if len(v.elems) == 1 else v.elems) for v in (c, x, y)]
    out = [None if k is None else (p if k else q) for k, p, q in zip(*pick)]
    return Vec(out, c.scalar and x.scalar and y.scalar, x.dtype)


def _constant_of_shape(a: ShapeAnalysis, node: gs.Node) -> Vec | None:
    shape = a.ints(node.inputs[0])
    value = node.attrs.get("value")
    if shape is None or len(shape) != 1 or not 0 <= shape[0] <= MAX_ELEMS or not isinstance(value, gs.Constant):
        return None  # (the default value is a float 0: not a shape value)
    v = a.value(value)
    if v is None or len(v.elems) != 1:
        return None
    return Vec(v.elems * shape[0], False, v.dtype)


EVAL = {
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
FOLDABLE = tuple(op for op in EVAL if op != "Constant")
