"""The resource contract: how much graphpass may materialize, decided from shapes before any work.

Every tensor graphpass would build in memory (a folded constant, an initializer it decodes, a
value shape inference's data propagation would expand) has its byte size computed from its
shape and dtype first; above the limit it is refused (exit 2) or left alone (a fold is skipped).

* ``MAX_DIM``: a concrete dim above 2^31 is bad input (no real model has one; a single tensor
  with such a dim would not fit in memory anyway).
* ``max_memory``: an estimate of the bytes graphpass holds (the model file, its external data,
  the tensors it folds) must stay under it. The default is 8 GiB or three quarters of the
  physical memory, whichever is smaller; ``GRAPHPASS_MAX_MEMORY`` (bytes, or with a K/M/G/T
  suffix) or the ``max_memory`` argument of :func:`graphpass.ir.model_io.load` raise it.
"""

from __future__ import annotations

import os

import onnx

from graphpass.errors import ResourceLimitError, UsageError

__all__ = [
    "MAX_DIM",
    "default_max_memory",
    "parse_bytes",
    "elem_size",
    "shape_bytes",
    "resolve_max_memory",
    "Budget",
    "over_memory",
]

#: The largest concrete dimension graphpass accepts (2^31).
MAX_DIM = 1 << 31

_DEFAULT_CAP = 8 << 30


def parse_bytes(text: str | int) -> int:
    """``"8G"``, ``"512M"``, ``"1073741824"`` -> bytes (K/M/G/T are powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip().upper().removesuffix("B").removesuffix("I")
        mult = 1
        if s and s[-1] in "KMGT":
            mult = 1 << (10 * ("KMGT".index(s[-1]) + 1))
            s = s[:-1]
        try:
            value = int(float(s) * mult) if "." in s else int(s) * mult
        except ValueError:
            raise UsageError(f"memory limit '{text}' is not a byte count (e.g. 8G, 512M, 1073741824)") from None
    if value <= 0:
        raise UsageError(f"memory limit must be positive, got '{text}'")
    return value


def default_max_memory() -> int:
    """8 GiB, or three quarters of the physical memory if that is less; ``GRAPHPASS_MAX_MEMORY`` wins."""
    env = os.environ.get("GRAPHPASS_MAX_MEMORY")
    if env:
        return parse_bytes(env)
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 0
    return min(_DEFAULT_CAP, phys * 3 // 4) if phys > 0 else _DEFAULT_CAP


def resolve_max_memory(max_memory: int | str | None) -> int:
    return default_max_memory() if max_memory is None else parse_bytes(max_memory)


_FRACTIONAL: dict[int, float] = {onnx.TensorProto.INT4: 0.5, onnx.TensorProto.UINT4: 0.5}
for _name, _size in (("FLOAT4E2M1", 0.5), ("INT2", 0.25), ("UINT2", 0.25)):
    if hasattr(onnx.TensorProto, _name):
        _FRACTIONAL[getattr(onnx.TensorProto, _name)] = _size


def elem_size(elem_type: int) -> float | None:
    """Bytes per element of an ONNX element type (0.5 for 4-bit types); None for strings/unknown."""
    if elem_type in _FRACTIONAL:
        return _FRACTIONAL[elem_type]
    if elem_type == onnx.TensorProto.STRING:
        return None
    try:
        return float(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except Exception:  # noqa: BLE001 - unknown or undefined type
        return None


def shape_bytes(dims, elem_type: int | None = None, itemsize: float | None = None) -> int | None:
    """Bytes of a dense tensor of ``dims``; None when a dim is not a known non-negative int."""
    size = itemsize if itemsize is not None else (elem_size(elem_type) if elem_type is not None else 8.0)
    if size is None:
        size = 8.0
    n = 1
    for d in dims:
        if not isinstance(d, int) or d < 0:
            return None
        n *= d
    return int(-(-n * size // 1))


def over_memory(text: str) -> ResourceLimitError:
    """The one error for "over the memory limit": ``text`` plus how to raise the limit (the
    ``max_memory`` argument, which the CLI names ``--max-memory``, or GRAPHPASS_MAX_MEMORY)."""
    return ResourceLimitError(f"{text} (raise it with max_memory or GRAPHPASS_MAX_MEMORY)", option="max_memory")


class Budget:
    """Bytes graphpass holds for one model, against ``limit``; kept on the loaded graph."""

    def __init__(self, limit: int, held: int = 0):
        self.limit = int(limit)
        self.held = int(held)

    def room(self) -> int:
        return max(0, self.limit - self.held)

    def fits(self, nbytes: int) -> bool:
        return self.held + nbytes <= self.limit

    def take(self, nbytes: int) -> None:
        self.held += int(nbytes)

    def require(self, nbytes: int, what: str) -> None:
        if not self.fits(nbytes):
            raise over_memory(f"{what} needs {_fmt(self.held + nbytes)}, over the memory limit of {_fmt(self.limit)}")


def _fmt(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
