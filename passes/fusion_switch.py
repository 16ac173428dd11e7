"""ATC-compatible fusion switches: read and write ``--fusion_switch_file`` in both forms.

Text form, one switch per line (``#`` comments and blank lines allowed)::

    ConvBatchnormFusionPass:off
    fuse_channel_shuffle:on

JSON form (ATC's, ascend_facts.md §7)::

    {"Switch": {"GraphFusion": {"ALL": "off", "ConvBatchnormFusionPass": "on"},
                "UBFusion": {"ALL": "on"}}}

A name is an Ascend pass name (mapped to the graphpass fusion registered with it) or a
graphpass pass name. An Ascend name graphpass does not implement only warns (the file may be
meant for ATC as well); an unknown snake_case name is an error listing the known passes.
``ALL`` switches every fusion of its section; named entries then override it. Fusions that
have no Ascend counterpart belong to the GraphFusion section.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from graphpass.errors import UsageError
from graphpass.passes.framework.pass_base import PassKind
from graphpass.passes.framework.registry import all_passes

__all__ = ["fusion_passes", "read_switch_file", "write_switch_file", "UB_FUSION"]

log = logging.getLogger(__name__)

#: Ascend names that are UB fusions (ATC's "UBFusion" section, ascend_facts.md §7); the rest
#: of graphpass's fusions are graph fusions.
UB_FUSION = frozenset({"ATbeMatMulElemwiseFusionPass", "TbeConv2DReluv2Pass", "TbeEltwiseFusionPass",
                       "TbeConvBnreduceFusionPass", "TbeBatchMatmulElementWiseFusionPass"})
_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def fusion_passes() -> dict[str, type]:
    return {n: c for n, c in all_passes().items() if c.kind == PassKind.FUSION}


def _section(cls) -> str:
    return "UBFusion" if cls.ascend_name in UB_FUSION else "GraphFusion"


def _resolve(name: str, where: str) -> list[str]:
    fusions = fusion_passes()
    if name in fusions:
        return [name]
    hits = [n for n, c in fusions.items() if c.ascend_name == name]
    if hits:
        return hits
    if _SNAKE.match(name):
        raise UsageError(f"{where}: unknown pass '{name}'; known fusions: {', '.join(fusions)}")
    log.warning("%s: '%s' is not a fusion graphpass implements; ignored here (ATC may know it)", where, name)
    return []


def _onoff(value, where: str) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("on", "off"):
        return value.strip().lower() == "on"
    raise UsageError(f"{where}: expected 'on' or 'off', got {value!r}")


def read_switch_file(path: str | Path) -> dict[str, bool]:
    """graphpass fusion name -> enabled, for every fusion the file switches."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{p}: cannot read the fusion switch file: {e.strerror}") from e
    result: dict[str, bool] = {}
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"{p}: line {e.lineno}: not valid JSON: {e.msg}") from e
        switch = data.get("Switch") if isinstance(data, dict) else None
        if not isinstance(switch, dict):
            raise UsageError(f"{p}: Switch: expected an object with GraphFusion and/or UBFusion")
        fusions = fusion_passes()
        for section, entries in switch.items():
            where = f"{p}: Switch.{section}"
            if section not in ("GraphFusion", "UBFusion"):
                raise UsageError(f"{where}: expected GraphFusion or UBFusion")
            if not isinstance(entries, dict):
                raise UsageError(f"{where}: expected an object of name: on|off")
            if "ALL" in entries:
                on = _onoff(entries["ALL"], f"{where}.ALL")
                for n, c in fusions.items():
                    if _section(c) == section:
                        result[n] = on
            for name, value in entries.items():
                if name == "ALL":
                    continue
                on = _onoff(value, f"{where}.{name}")
                for n in _resolve(name, f"{where}.{name}"):
                    result[n] = on
        return result
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.rpartition(":")
        where = f"{p}: line {lineno}"
        if not sep or not name.strip():
            raise UsageError(f"{where}: expected PassName:on|off, got {raw.strip()!r}")
        on = _onoff(value, where)
        for n in _resolve(name.strip(), where):
            result[n] = on
    return result


def write_switch_file(path: str | Path, enabled: dict[str, bool]) -> Path:
    """Write the settings of every fusion; JSON for a ``.json`` path, text lines otherwise.

    Each fusion is written under its Ascend name where it has one (so ATC applies the same
    choice) and under its graphpass name where it has none.
    """
    p = Path(path)
    from graphpass.cli import _write_text_atomic  # one atomic writer for every text output

    fusions = fusion_passes()
    entries = [(c.ascend_name or n, _section(c), enabled.get(n, c.default_enabled)) for n, c in fusions.items()]
    if p.suffix.lower() == ".json":
        doc: dict = {"Switch": {"GraphFusion": {}, "UBFusion": {}}}
        for name, section, on in entries:
            doc["Switch"][section][name] = "on" if on else "off"
        text = json.dumps(doc, indent=2) + "\n"
    else:
        text = "".join(f"{name}:{'on' if on else 'off'}\n" for name, _, on in entries)
    _write_text_atomic(p, text)
    return p
