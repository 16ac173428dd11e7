"""simplify_shapes' symbolic values: what one element of a tracked int tensor is known to be.

    an int                  the element's value on every input
    Dim(t, i)               dim i of tensor t (equal only to itself)
    Param("N")              under ``trust_dim_params``: every dim whose ``dim_param`` is "N"
    None                    unknown

A tracked tensor (``Vec``) is a 0-D or 1-D int64/int32/bool tensor of at most ``MAX_ELEMS``
elements; ``Product`` is an int times symbolic dims (what a Reshape's -1 divides).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_graphsurgeon as gs

__all__ = ["MAX_ELEMS", "TRACKED", "Dim", "Param", "Product", "Vec", "from_array", "is_known", "slice_indices"]

#: Longest scalar/vector the evaluation tracks (shape vectors are short; this bounds the work).
MAX_ELEMS = 64


class Dim:
    """Symbolic element: dim ``axis`` of ``tensor`` (compared by identity of the tensor)."""

    __slots__ = ("tensor", "axis")

    def __init__(self, tensor: gs.Tensor, axis: int):
        self.tensor = tensor
        self.axis = axis

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dim) and other.tensor is self.tensor and other.axis == self.axis

    def __hash__(self) -> int:
        return hash((id(self.tensor), self.axis))

    def __repr__(self) -> str:
        return f"{self.tensor.name}[{self.axis}]"


class Param(Dim):
    """Symbolic element under ``trust_dim_params``: the dim named ``name`` (any tensor's dim
    whose ``dim_param`` is that name)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__(None, -1)
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Param) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("param", self.name))

    def __repr__(self) -> str:
        return f"'{self.name}'"


def is_known(e) -> bool:
    return isinstance(e, int)


class Vec:
    """A tracked int tensor: its elements (int, Dim or None), 0-D or 1-D, and its dtype."""

    __slots__ = ("elems", "scalar", "dtype")

    def __init__(self, elems: Sequence, scalar: bool, dtype: np.dtype):
        self.elems = tuple(elems)
        self.scalar = scalar
        self.dtype = np.dtype(dtype)

    @property
    def known(self) -> bool:
        return all(is_known(e) for e in self.elems)

    def ints(self) -> list[int] | None:
        return [int(e) for e in self.elems] if self.known else None

    def array(self) -> np.ndarray:
        a = np.array(self.elems, dtype=self.dtype)
        return a.reshape(()) if self.scalar else a


TRACKED = (np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.bool_))


def from_array(a: np.ndarray) -> Vec | None:
    if a.dtype not in TRACKED or a.ndim > 1 or a.size > MAX_ELEMS:
        return None
    cast = bool if a.dtype == np.bool_ else int
    return Vec([cast(v) for v in a.ravel()], a.ndim == 0, a.dtype)


class Product:
    """An int times a multiset of symbolic dims."""

    def __init__(self, elems: Sequence):
        self.coef = 1
        self.syms: dict[Dim, int] = {}
        for e in elems:
            self.mul(e)

    def mul(self, e) -> None:
        if is_known(e):
            self.coef *= int(e)
        else:
            self.syms[e] = self.syms.get(e, 0) + 1

    def divide(self, other: "Product"):
        """self / other as an int or one Dim, when the division is exact; else None."""
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


#: the largest int64: an end of it with a negative step is read two ways (see slice_indices)
_INT64_MAX = int(np.iinfo(np.int64).max)


def slice_indices(n: int, start: int, end: int, step: int) -> range | None:
    """The indices ONNX Slice takes along an axis of length n; None where onnxruntime departs from
    the spec: an end of INT64_MAX with a negative step, which the spec clamps to n - 1 (nothing
    taken from a start at n - 1) and onnxruntime 1.32 reads as "through the front"."""
    if step < 0 and end >= _INT64_MAX:
        return None
    if start < 0:
        start += n
    if end < 0:
        end += n
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return range(start, end, step)
