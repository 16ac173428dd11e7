"""The op-info table (data/op_info.toml): how each ONNX op maps to Ascend."""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path

from graphpass.cost_model.profiles import DATA_DIR
from graphpass.errors import UsageError

__all__ = ["OpInfo", "OpTable", "load_op_table", "ENGINES", "COST_CLASSES", "LAYOUTS", "FORMATS"]

ENGINES = ("AICORE", "AICPU", "HOST")
COST_CLASSES = ("cube", "vector", "datamove", "gather", "transpose", "transdata", "view", "control", "none")
LAYOUTS = ("fixed", "agnostic", "reduce", "nd", "any", "none")
FORMATS = ("ND", "NCHW", "NHWC", "NC1HWC0", "FRACTAL_Z", "FRACTAL_NZ")
DTYPES = ("float16", "float32", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "int64", "bool", "float64")


@dataclasses.dataclass(frozen=True)
class OpInfo:
    key: str
    ascend: str
    engine: str
    cost: str
    layout: str
    dtypes: tuple[str, ...]
    src: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    fp16_only: bool = False
    static_only: bool = False
    dynamic_output: bool = False
    vector_ops: float = 0.0  # set from the table's [defaults] vector_ops where a row does not say
    note: str = ""
    #: per-target AI Core dtypes where a target's kernel differs from ``dtypes`` (target -> dtypes)
    target_dtypes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: per value of the node's ``mode`` attribute, the row that applies (Resize: one Ascend op per mode)
    modes: tuple[tuple[str, "OpInfo"], ...] = ()
    #: the ``mode`` a node without the attribute has (its ONNX default)
    default_mode: str = ""

    def for_mode(self, mode: str | bytes | None) -> "OpInfo":
        """The row for a node whose ``mode`` attribute is ``mode`` (None: the ONNX default)."""
        if not self.modes:
            return self
        mode = mode.decode() if isinstance(mode, bytes) else (mode or self.default_mode)
        return next((info for name, info in self.modes if name == mode), self)

    def dtypes_on(self, target: str) -> tuple[str, ...]:
        """The AI Core kernel's dtypes on ``target`` (its own row where the table has one)."""
        for name, dts in self.target_dtypes:
            if name == target:
                return dts
        return self.dtypes

    def fp16_only_on(self, target: str) -> bool:
        """fp16 only on ``target``: the row says so and the target's dtypes have no float32."""
        return self.fp16_only and "float32" not in self.dtypes_on(target)

    def input_format(self, i: int) -> str:
        if self.layout == "fixed" and self.inputs:
            return self.inputs[i] if i < len(self.inputs) else "ND"
        return "ND"

    def output_format(self, i: int) -> str:
        if self.layout == "fixed" and self.outputs:
            return self.outputs[i] if i < len(self.outputs) else "ND"
        return "ND"


class OpTable:
    def __init__(self, ops: dict[str, OpInfo], path: Path, default_vector_ops: float | None = None):
        self.ops = ops
        self.path = path
        #: vector instructions per output element where a row does not say (the data file's [defaults])
        self.default_vector_ops = default_vector_ops if default_vector_ops is not None else _default_vector_ops()

    def lookup(self, op: str, domain: str | None) -> OpInfo | None:
        domain = domain or ""
        if domain in ("", "ai.onnx"):
            hit = self.ops.get(op)
            if hit is not None:
                return hit
        return self.ops.get(f"{domain}::{op}") or self.ops.get(f"*::{op}")

    def lookup_node(self, node) -> OpInfo | None:
        """:meth:`lookup` for ``node``, with the row of its ``mode`` where the op has one per mode."""
        info = self.lookup(node.op, node.domain)
        if info is not None and info.modes:
            return info.for_mode(node.attrs.get("mode"))
        return info

    def __len__(self) -> int:
        return len(self.ops)


def _bad(path: Path, key: str, expected: str, got=None) -> UsageError:
    tail = "" if got is None else f", got {got!r}"
    return UsageError(f"{path.name}: key '{key}': expected {expected}{tail}")


def parse_op_table(path: Path) -> OpTable:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path.name}: not valid TOML: {e}") from e
    ops_raw = data.get("ops")
    if not isinstance(ops_raw, dict) or not ops_raw:
        raise _bad(path, "ops", "a non-empty [ops] table")
    defaults = data.get("defaults")
    dv = defaults.get("vector_ops") if isinstance(defaults, dict) else None
    if not isinstance(dv, (int, float)) or isinstance(dv, bool) or dv <= 0:
        raise _bad(path, "defaults.vector_ops", "a positive number", dv)
    ops: dict[str, OpInfo] = {}
    for key, e in ops_raw.items():
        where = f"ops.{key}"
        if not isinstance(e, dict):
            raise _bad(path, where, "a table")
        for k in ("ascend", "src"):
            if not isinstance(e.get(k), str) or not e[k]:
                raise _bad(path, f"{where}.{k}", "a non-empty string", e.get(k))
        for k, allowed in (("engine", ENGINES), ("cost", COST_CLASSES), ("layout", LAYOUTS)):
            if e.get(k) not in allowed:
                raise _bad(path, f"{where}.{k}", f"one of {', '.join(allowed)}", e.get(k))
        dtypes = e.get("dtypes")
        if not isinstance(dtypes, list) or not all(d in DTYPES for d in dtypes):
            raise _bad(path, f"{where}.dtypes", f"a list of {', '.join(DTYPES)}", dtypes)
        for k in ("inputs", "outputs"):
            v = e.get(k, [])
            if not isinstance(v, list) or not all(f in FORMATS for f in v):
                raise _bad(path, f"{where}.{k}", f"a list of {', '.join(FORMATS)}", v)
        if e["layout"] == "fixed" and not e.get("inputs"):
            raise _bad(path, f"{where}.inputs", "a list of formats for a 'fixed' layout")
        for k in ("fp16_only", "static_only", "dynamic_output"):
            if not isinstance(e.get(k, False), bool):
                raise _bad(path, f"{where}.{k}", "true or false", e.get(k))
        vops = e.get("vector_ops", dv)
        if not isinstance(vops, (int, float)) or isinstance(vops, bool) or vops <= 0:
            raise _bad(path, f"{where}.vector_ops", "a positive number", vops)
        targets = e.get("targets", {})
        if not isinstance(targets, dict):
            raise _bad(path, f"{where}.targets", "a table of target -> {dtypes, src}", targets)
        per_target = []
        for tname, te in targets.items():
            tdt = te.get("dtypes") if isinstance(te, dict) else None
            if not isinstance(tdt, list) or not all(d in DTYPES for d in tdt):
                raise _bad(path, f"{where}.targets.{tname}.dtypes", f"a list of {', '.join(DTYPES)}", tdt)
            if not isinstance(te.get("src"), str) or not te["src"]:
                raise _bad(path, f"{where}.targets.{tname}.src", "a non-empty string", te.get("src"))
            per_target.append((tname, tuple(tdt)))
        unknown = set(e) - {"ascend", "engine", "cost", "layout", "dtypes", "src", "inputs", "outputs",
                            "fp16_only", "static_only", "dynamic_output", "vector_ops", "note", "targets",
                            "modes", "default_mode"}
        if unknown:
            raise _bad(path, f"{where}.{sorted(unknown)[0]}", "no such field (typo?)")
        info = OpInfo(key, e["ascend"], e["engine"], e["cost"], e["layout"], tuple(dtypes), e["src"],
                      tuple(e.get("inputs", [])), tuple(e.get("outputs", [])), e.get("fp16_only", False),
                      e.get("static_only", False), e.get("dynamic_output", False), float(vops), e.get("note", ""),
                      tuple(per_target))
        modes = e.get("modes", {})
        if not isinstance(modes, dict):
            raise _bad(path, f"{where}.modes", "a table of mode -> {ascend, engine, cost, src, ...}", modes)
        if modes:
            if not isinstance(e.get("default_mode"), str) or e["default_mode"] not in modes:
                raise _bad(path, f"{where}.default_mode", "one of the modes' names", e.get("default_mode"))
            rows = []
            for mname, me in modes.items():
                mwhere = f"{where}.modes.{mname}"
                if not isinstance(me, dict):
                    raise _bad(path, mwhere, "a table")
                unknown = set(me) - {"ascend", "engine", "cost", "vector_ops", "src", "note"}
                if unknown:
                    raise _bad(path, f"{mwhere}.{sorted(unknown)[0]}", "no such field (a mode overrides ascend, "
                               "engine, cost, vector_ops, src, note)")
                if not isinstance(me.get("src"), str) or not me["src"]:
                    raise _bad(path, f"{mwhere}.src", "a non-empty string", me.get("src"))
                for k, allowed in (("engine", ENGINES), ("cost", COST_CLASSES)):
                    if k in me and me[k] not in allowed:
                        raise _bad(path, f"{mwhere}.{k}", f"one of {', '.join(allowed)}", me[k])
                mv = me.get("vector_ops", info.vector_ops)
                if not isinstance(mv, (int, float)) or isinstance(mv, bool) or mv <= 0:
                    raise _bad(path, f"{mwhere}.vector_ops", "a positive number", mv)
                over = {k: me[k] for k in ("ascend", "engine", "cost", "src", "note") if k in me}
                rows.append((mname, dataclasses.replace(info, **over, vector_ops=float(mv), key=f"{key}[mode={mname}]")))
            info = dataclasses.replace(info, modes=tuple(rows), default_mode=e["default_mode"])
        ops[key] = info
    return OpTable(ops, path, float(dv))


def _default_vector_ops() -> float:
    return load_op_table().default_vector_ops


@functools.lru_cache(maxsize=4)
def load_op_table(path: str | None = None) -> OpTable:
    return parse_op_table(Path(path) if path else DATA_DIR / "op_info.toml")
