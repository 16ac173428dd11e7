"""Hardware profiles: TOML data files, each number with its unit, source and P/D/E tag.

A profile or op-info file with a missing or mistyped field fails loading with the file, the key
and what was expected (a :class:`graphpass.UsageError`, exit code 2 in the CLI).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path
from typing import Any

from graphpass.cost_model.toolchain import PRECISION_MODES_FILE, UB_FUSION_FILE, load_precision_modes
from graphpass.errors import UsageError

__all__ = ["DATA_DIR", "HardwareProfile", "load_profile", "known_targets", "PROFILE_FIELDS", "TAGS"]

DATA_DIR = Path(__file__).resolve().parent / "data"
TAGS = {"P", "D", "T", "E"}

#: field -> Python type of its value
PROFILE_FIELDS: dict[str, type] = {
    "ai_core_count": int,
    "cube_freq_mhz": float,
    "cube_fp16_macs_per_cycle": int,
    "cube_int8_macs_per_cycle": int,
    "cube_fp32": bool,
    "cube_fp32_macs_per_cycle": int,
    "vector_core_count": int,
    "vector_freq_mhz": float,
    "vector_fp16_elems_per_cycle": int,
    "vector_fp32_elems_per_cycle": int,
    "gm_bytes_per_cycle_per_core": float,
    "ub_kib": int,
    "l2_mib": int,
    "ai_cpu_count": int,
    "h2d_gbps": float,
    "d2h_gbps": float,
    "small_copy_us": float,
    "kernel_launch_us": float,
    "host_dispatch_us": float,
    "aicpu_op_us": float,
    "aicpu_gbps": float,
    "engine_sync_us": float,
    "host_sync_us": float,
    "graph_launch_us": float,
    "transdata_bw_efficiency": float,
    "transpose_bw_efficiency": float,
    "gather_bw_efficiency": float,
    "gm_bandwidth_gbps": float,
    "l2_bandwidth_gbps": float,
    "cube_efficiency": float,
    "l2_resident_fraction": float,
    "ub_fusion_max_ops": int,
    "fractal_m": int,
    "c0_2byte": int,
    "c0_1byte": int,
}

#: ATC's precision modes, from data/precision_modes.toml (read them through ``Target.precision_modes``)
PRECISION_MODES = tuple(m.name for m in load_precision_modes())

#: data files that are not hardware profiles
#: (cann_*.toml, the ATC release data, are skipped by prefix)
NOT_PROFILES = frozenset({"op_info", "op_limits", "calibration", PRECISION_MODES_FILE.stem, UB_FUSION_FILE.stem,
                          "transformer_ops"})  # transformer_ops: the transformer device ops' per-target facts


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    default_precision_mode: str
    values: dict[str, Any]
    sources: dict[str, tuple[str, str]]  # field -> (source key, tag)
    path: Path
    #: per-op-type factors on the estimate, measured on a chip (``graphpass calibrate``); ONNX op -> factor
    op_scale: dict[str, float] = dataclasses.field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:
        values = self.__dict__.get("values", {})
        if key in values:
            return values[key]
        raise AttributeError(key)

    @property
    def gm_bytes_per_us(self) -> float:
        """Chip GM bandwidth in bytes/us (the data file's ``gm_bandwidth_gbps``)."""
        return self.gm_bandwidth_gbps * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "default_precision_mode": self.default_precision_mode,
            "values": {k: {"value": v, "src": self.sources[k][0], "tag": self.sources[k][1]} for k, v in self.values.items()},
        }


def known_targets() -> list[str]:
    # cann_*.toml: the ATC hand-off's release data (cost_model/cann.py), not hardware profiles
    return sorted(p.stem for p in DATA_DIR.glob("*.toml") if p.stem not in NOT_PROFILES and not p.stem.startswith("cann_"))


def _bad(path: Path, key: str, expected: str, got: Any = None) -> UsageError:
    tail = "" if got is None else f", got {got!r}"
    return UsageError(f"{path.name}: key '{key}': expected {expected}{tail}")


def load_profile(target: str | Path) -> HardwareProfile:
    """Load and validate a profile by name (a file of data/, e.g. the default target's) or path."""
    path = Path(target) if str(target).endswith(".toml") else DATA_DIR / f"{target}.toml"
    if not path.is_file():
        raise UsageError(f"unknown target '{target}'; known targets: {', '.join(known_targets())}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path.name}: not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{path.name}: not a UTF-8 text file: {e}") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot read the target file: {e.strerror or e}") from e
    head = data.get("profile")
    if not isinstance(head, dict):
        raise _bad(path, "profile", "a [profile] table with name, description, default_precision_mode")
    for k in ("name", "description", "default_precision_mode"):
        if not isinstance(head.get(k), str):
            raise _bad(path, f"profile.{k}", "a string", head.get(k))
    if head["default_precision_mode"] not in PRECISION_MODES:
        raise _bad(path, "profile.default_precision_mode", f"one of {', '.join(PRECISION_MODES)}", head["default_precision_mode"])
    values: dict[str, Any] = {}
    sources: dict[str, tuple[str, str]] = {}
    for key, kind in PROFILE_FIELDS.items():
        entry = data.get(key)
        if not isinstance(entry, dict):
            raise _bad(path, key, "a table with value, unit, src, tag")
        value = entry.get("value")
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise _bad(path, f"{key}.value", f"a {kind.__name__}", value)
        if kind is not bool and not (math.isfinite(value) and value >= 0):
            raise _bad(path, f"{key}.value", "a finite non-negative number", value)
        for meta in ("unit", "src"):
            if not isinstance(entry.get(meta), str) or not entry[meta]:
                raise _bad(path, f"{key}.{meta}", "a non-empty string", entry.get(meta))
        if entry.get("tag") not in TAGS:
            raise _bad(path, f"{key}.tag", "one of P, D, T, E", entry.get("tag"))
        values[key] = float(value) if kind is float else value
        sources[key] = (entry["src"], entry["tag"])
    scale = data.get("op_scale", {})
    if not isinstance(scale, dict):
        raise _bad(path, "op_scale", "a table of ONNX op -> factor")
    op_scale: dict[str, float] = {}
    for op, f in scale.items():
        if op == "src":
            continue
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not (f > 0 and math.isfinite(f)):
            raise _bad(path, f"op_scale.{op}", "a finite positive number", f)
        op_scale[op] = float(f)
    return HardwareProfile(head["name"], head["description"], head["default_precision_mode"], values, sources, path,
                           op_scale)
