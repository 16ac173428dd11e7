"""The op-limits table (data/op_limits.toml): attribute values and sizes that put an op on AI CPU.

    load_op_limits().aicpu_reason(node)  ->  "AveragePool kernel 16x17 = 272 > 256 (...)" | None
    load_op_limits().int64_reason(node, target.name)  ->  "int64 Range has no AI Core kernel ..." | None
    load_op_limits().max_tensor_bytes(target.name)  ->  34359738368 | None

The op table (op_info.toml) says which engine runs an op; this table says where the AI Core
kernel of an op ends (a kernel size, a stride, an input width, a mode), so that the estimate
places such a node on AI CPU and a pass can ask whether a rewrite brings it back. Its `[int64.<Op>]`
rows say on which targets an op's AI Core kernel takes no int64 (such a node runs on AI CPU), and
`[tensor_limits.<target>]` the most bytes one tensor can take there. Every limit comes with its
source and a P/D/E tag in the data file; none lives here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from pathlib import Path
from typing import Any

from graphpass.cost_model.profiles import DATA_DIR, TAGS, known_targets
from graphpass.errors import UsageError

__all__ = ["OpLimit", "Int64Row", "TensorLimit", "OpLimits", "load_op_limits", "LIMIT_FIELDS", "int64_data"]

#: the limits a row may hold (see the data file's header)
LIMIT_FIELDS = ("max_kernel_dim", "max_kernel_area", "max_stride", "max_input_w", "aicpu_modes", "last_axis_unit_step")


@dataclasses.dataclass(frozen=True)
class OpLimit:
    op: str
    src: str
    tag: str
    fallback_tag: str
    max_kernel_dim: int | None = None
    max_kernel_area: int | None = None
    max_stride: int | None = None
    max_input_w: int | None = None
    aicpu_modes: tuple[str, ...] = ()
    note: str = ""
    last_axis_unit_step: bool = False


@dataclasses.dataclass(frozen=True)
class Int64Row:
    """An op whose AI Core kernel takes no int64 on the targets ``aicpu_on`` (an int64 node: AI CPU)."""
    op: str
    aicpu_on: tuple[str, ...]
    src: str
    tag: str


@dataclasses.dataclass(frozen=True)
class TensorLimit:
    """The most bytes one tensor can take on ``target`` (its device memory)."""
    target: str
    max_tensor_bytes: int
    src: str
    tag: str


def _is_int64(t: Any) -> bool:
    import numpy as np

    try:
        return t is not None and t.dtype is not None and np.dtype(t.dtype) == np.int64
    except TypeError:
        return False


def int64_data(node: Any) -> bool:
    """Whether ``node`` computes on int64 data: its first output is int64, or it is bool (a
    comparison) and its first input is int64."""
    import numpy as np

    outs = [t for t in node.outputs if t.name]
    if not outs:
        return False
    if _is_int64(outs[0]):
        return True
    try:
        is_bool = outs[0].dtype is not None and np.dtype(outs[0].dtype) == np.bool_
    except TypeError:
        is_bool = False
    return is_bool and bool(node.inputs) and _is_int64(node.inputs[0])


def _attr(node: Any, name: str, default: Any = None) -> Any:
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _kernel(node: Any) -> list[int] | None:
    ks = _attr(node, "kernel_shape")
    if ks is None and (node.op in ("Conv", "ConvTranspose") or node.op.startswith("FusedConv")) and len(node.inputs) > 1:
        shape = node.inputs[1].shape
        if shape is not None and len(shape) > 2 and all(isinstance(d, int) for d in shape[2:]):
            ks = list(shape[2:])
    return [int(k) for k in ks] if ks is not None else None


def _last_axis_step(node: Any) -> int | None:
    """The step a Slice takes on its input's last axis (None: unknown, or the axis is not sliced)."""
    import numpy as np
    import onnx_graphsurgeon as gs

    ins = node.inputs
    shape = ins[0].shape if ins else None
    if len(ins) < 5 or not ins[4].name or shape is None or not isinstance(ins[4], gs.Constant):
        return None
    rank = len(shape)
    steps = [int(v) for v in np.asarray(ins[4].values).ravel()]
    if len(ins) > 3 and ins[3].name:
        if not isinstance(ins[3], gs.Constant):
            return None
        axes = [int(a) % rank for a in np.asarray(ins[3].values).ravel()]
    else:
        axes = list(range(len(steps)))
    return next((s for a, s in zip(axes, steps) if a == rank - 1), None)


class OpLimits:
    def __init__(self, rows: dict[str, OpLimit], path: Path, int64: dict[str, Int64Row] | None = None,
                 tensor_limits: dict[str, TensorLimit] | None = None):
        self.rows = rows
        self.path = path
        self.int64 = dict(int64 or {})
        self.tensor_limits = dict(tensor_limits or {})

    def int64_reason(self, node: Any, target: str) -> str | None:
        """Why ``node`` runs on AI CPU on ``target`` because it computes on int64 (its op's AI Core
        kernel takes no int64 there), or None."""
        if node.domain not in (None, "", "ai.onnx"):
            return None
        row = self.int64.get(node.op)
        if row is None or target not in row.aicpu_on or not int64_data(node):
            return None
        return f"int64 {node.op} has no AI Core kernel on {target} ({row.src}; {row.tag})"

    def max_tensor_bytes(self, target: str) -> int | None:
        """The most bytes one tensor can take on ``target`` (None: not known)."""
        row = self.tensor_limits.get(target)
        return row.max_tensor_bytes if row is not None else None

    def get(self, op: str) -> OpLimit | None:
        return self.rows.get(op)

    def _row(self, node: Any) -> OpLimit | None:
        op = node.op
        if node.domain == "graphpass.ascend" and op.startswith("FusedConv"):
            op = "Conv"  # a Conv with its activation fused in is still that Conv's kernel
        elif node.domain not in (None, "", "ai.onnx"):
            return None
        return self.rows.get(op)

    def aicpu_reason(self, node: Any) -> str | None:
        """Why ``node`` (a default-domain gs.Node) leaves AI Core by this table, or None."""
        row = self._row(node)
        if row is None:
            return None
        return self.reason(row, node)

    def reads_values(self, node: Any) -> bool:
        """Whether :meth:`aicpu_reason` reads the values of ``node``'s inputs (a Slice's steps),
        not only its op, attributes and its tensors' shapes and dtypes (the cost model then
        decides the engine per node, not once per signature)."""
        row = self._row(node)
        return row is not None and row.last_axis_unit_step

    @staticmethod
    def reason(row: OpLimit, node: Any) -> str | None:
        where = f"({row.src}; {row.tag})"
        ks = _kernel(node)
        if row.max_kernel_dim is not None and ks and max(ks) > row.max_kernel_dim:
            return f"{node.op} kernel {'x'.join(map(str, ks))}: a side above {row.max_kernel_dim} {where}"
        if row.max_kernel_area is not None and ks and math.prod(ks) > row.max_kernel_area:
            return f"{node.op} kernel {'x'.join(map(str, ks))} = {math.prod(ks)} > {row.max_kernel_area} {where}"
        strides = _attr(node, "strides")
        if row.max_stride is not None and strides and max(strides) > row.max_stride:
            return f"{node.op} stride {max(strides)} > {row.max_stride} {where}"
        if row.max_input_w is not None and node.inputs:
            shape = node.inputs[0].shape
            if shape is not None and len(shape) >= 3 and isinstance(shape[-1], int) and shape[-1] > row.max_input_w:
                return f"{node.op} input W {shape[-1]} > {row.max_input_w} {where}"
        if row.aicpu_modes and _attr(node, "mode", "constant") in row.aicpu_modes:
            return f"{node.op} mode={_attr(node, 'mode')} runs on AI CPU {where}"
        if row.last_axis_unit_step and _last_axis_step(node) not in (None, 1):
            return f"{node.op} step {_last_axis_step(node)} on the last axis {where}"
        return None


def _bad(path: Path, key: str, expected: str, got: Any = None) -> UsageError:
    tail = "" if got is None else f", got {got!r}"
    return UsageError(f"{path.name}: key '{key}': expected {expected}{tail}")


def parse_op_limits(path: Path) -> OpLimits:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path.name}: not valid TOML: {e}") from e
    ops = data.get("ops")
    if not isinstance(ops, dict):
        raise _bad(path, "ops", "an [ops.<Op>] table per op")
    rows = {}
    for op, e in ops.items():
        where = f"ops.{op}"
        if not isinstance(e, dict):
            raise _bad(path, where, "a table")
        unknown = set(e) - set(LIMIT_FIELDS) - {"src", "tag", "fallback_tag", "note"}
        if unknown:
            raise _bad(path, f"{where}.{sorted(unknown)[0]}", "no such field (typo?)")
        if not isinstance(e.get("src"), str) or not e["src"]:
            raise _bad(path, f"{where}.src", "a non-empty string", e.get("src"))
        for k in ("tag", "fallback_tag"):
            if e.get(k) not in TAGS:
                raise _bad(path, f"{where}.{k}", f"one of {', '.join(TAGS)}", e.get(k))
        for k in LIMIT_FIELDS[:-2]:
            v = e.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise _bad(path, f"{where}.{k}", "a positive integer", v)
        if not isinstance(e.get("last_axis_unit_step", False), bool):
            raise _bad(path, f"{where}.last_axis_unit_step", "true or false", e.get("last_axis_unit_step"))
        modes = e.get("aicpu_modes", [])
        if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
            raise _bad(path, f"{where}.aicpu_modes", "a list of strings", modes)
        rows[op] = OpLimit(op, e["src"], e["tag"], e["fallback_tag"], e.get("max_kernel_dim"), e.get("max_kernel_area"),
                           e.get("max_stride"), e.get("max_input_w"), tuple(modes), e.get("note", ""),
                           e.get("last_axis_unit_step", False))
    return OpLimits(rows, path, _parse_int64(path, data), _parse_tensor_limits(path, data))


def _source(path: Path, where: str, e: dict) -> tuple[str, str]:
    if not isinstance(e.get("src"), str) or not e["src"]:
        raise _bad(path, f"{where}.src", "a non-empty string", e.get("src"))
    if e.get("tag") not in TAGS:
        raise _bad(path, f"{where}.tag", f"one of {', '.join(TAGS)}", e.get("tag"))
    return e["src"], e["tag"]


def _parse_int64(path: Path, data: dict) -> dict[str, Int64Row]:
    table = data.get("int64", {})
    if not isinstance(table, dict):
        raise _bad(path, "int64", "an [int64.<Op>] table per op")
    out = {}
    for op, e in table.items():
        where = f"int64.{op}"
        if not isinstance(e, dict):
            raise _bad(path, where, "a table")
        unknown = set(e) - {"aicpu_on", "src", "tag", "note"}
        if unknown:
            raise _bad(path, f"{where}.{sorted(unknown)[0]}", "no such field (typo?)")
        targets = e.get("aicpu_on")
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise _bad(path, f"{where}.aicpu_on", "a non-empty list of target names", targets)
        unknown_targets = sorted(set(targets) - set(known_targets()))
        if unknown_targets:
            raise _bad(path, f"{where}.aicpu_on", f"targets of {', '.join(known_targets())}", unknown_targets[0])
        src, tag = _source(path, where, e)
        out[op] = Int64Row(op, tuple(targets), src, tag)
    return out


def _parse_tensor_limits(path: Path, data: dict) -> dict[str, TensorLimit]:
    table = data.get("tensor_limits", {})
    if not isinstance(table, dict):
        raise _bad(path, "tensor_limits", "a [tensor_limits.<target>] table per target")
    out = {}
    for target, e in table.items():
        where = f"tensor_limits.{target}"
        if not isinstance(e, dict):
            raise _bad(path, where, "a table")
        if target not in known_targets():
            raise _bad(path, where, f"a target of {', '.join(known_targets())}", target)
        unknown = set(e) - {"max_tensor_bytes", "src", "tag"}
        if unknown:
            raise _bad(path, f"{where}.{sorted(unknown)[0]}", "no such field (typo?)")
        v = e.get("max_tensor_bytes")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise _bad(path, f"{where}.max_tensor_bytes", "a positive integer", v)
        src, tag = _source(path, where, e)
        out[target] = TensorLimit(target, v, src, tag)
    return out


@functools.lru_cache(maxsize=4)
def load_op_limits(path: str | None = None) -> OpLimits:
    return parse_op_limits(Path(path) if path else DATA_DIR / "op_limits.toml")
