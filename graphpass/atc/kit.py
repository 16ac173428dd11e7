"""The ATC conversion kit: ``atc.sh`` (the full ``atc`` command line for the target), every file
it names, a ``README.md`` saying why each option has its value, and ``graphpass_kit.json`` (the
decisions, read back by :func:`read_kit` and by ``graphpass atc-check``).

Order of work (nothing is written before the checks pass):
1. the model in the chosen CANN's opset range (converted and verified when outside it);
2. every node against that release's ONNX operator list: refusals are reported by name;
3. the shapes: static, or one gear per ``--shape-profile`` -> ``--input_shape`` and
   ``--dynamic_batch_size`` / ``--dynamic_dims``; the cost model estimates each gear;
4. precision: ``--precision_mode_v2`` where the release has it and the mode has a v2 name, else
   ``--precision_mode``; the keep-list as ``--keep_dtype`` (op names) and, in the mixed modes,
   ``--modify_mixlist`` for the op types every node of which is kept;
   ``--op_select_implmode=high_precision`` when the precision analysis kept nodes in fp32;
5. the fusion switches as ``--fusion_switch_file`` (passes/fusion_switch.py's JSON form);
6. the command checked against the release's documented options (cost_model/data/cann_atc.toml).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import logging

import onnx

from graphpass.cost_model import cann as C
from graphpass.errors import UnsupportedError, UsageError
from graphpass.atc.gears import Gears, plan_gears
from graphpass.atc.opcheck import OpCheck, fit_opset

__all__ = ["Kit", "write_kit", "read_kit", "check_command", "MANIFEST", "V2_MODES"]

log = logging.getLogger(__name__)
MANIFEST = "graphpass_kit.json"
KEEP_FILE = "keep_dtype.cfg"
MIXLIST_FILE = "modify_mixlist.json"
SWITCH_FILE = "fusion_switch.json"
#: --precision_mode -> --precision_mode_v2 (the v2 page: cube_fp16in_fp32out is force_fp32's new name)
V2_MODES = {"force_fp16": "fp16", "must_keep_origin_dtype": "origin", "allow_mix_precision": "mixed_float16",
            "force_fp32": "cube_fp16in_fp32out"}
_MIXED = {"allow_mix_precision", "mixed_float16"}
_NO_KEEP = {"must_keep_origin_dtype", "origin"}  # --keep_dtype has no effect (the keep_dtype page)


@dataclasses.dataclass
class Kit:
    folder: Path
    cann: str
    options: list[tuple[str, str]]
    why: dict[str, str]
    opcheck: OpCheck
    gears: Gears
    estimates: list[dict[str, Any]]
    keep_fp32: list[str]
    switches: dict[str, bool]
    precision_mode: str
    files: list[str]

    def command(self) -> str:
        return "atc " + " ".join(f"--{k}={shlex.quote(v)}" for k, v in self.options)

    def summary(self) -> list[str]:
        lines = [f"ATC kit for CANN {self.cann} in {self.folder}: {', '.join(self.files)}"]
        lines += self.opcheck.lines()
        if len(self.estimates) > 1:
            lines.append("estimate per gear (cost model, not a measurement):")
            lines += [f"  {e['gear']}: {e['total_ms']:.3f} ms" if e["total_ms"] is not None else f"  {e['gear']}: -"
                      for e in self.estimates]
        lines.append(self.command())
        return lines


def _name_nodes(proto: onnx.ModelProto) -> None:
    """Unnamed nodes named after their first output, as graphpass's keep-list calls them, so that
    ``--keep_dtype`` names the op ATC builds from each (ATC names an op by its node's name)."""
    taken = {n.name for n in proto.graph.node if n.name}
    for n in proto.graph.node:
        if not n.name and n.output and n.output[0] not in taken:
            n.name = n.output[0]
            taken.add(n.name)


def _node_names(proto: onnx.ModelProto) -> dict[str, str]:
    return {(n.name or (n.output[0] if n.output else "")): n.op_type for n in proto.graph.node}


def _input_format(proto: onnx.ModelProto, gears: Gears) -> tuple[str, str]:
    if gears.option == "dynamic_dims":
        return "ND", "--dynamic_dims is used with --input_format=ND (the --dynamic_dims page)"
    ranks = {len(s) for s in gears.input_shape.values()}
    if ranks == {4}:
        return "NCHW", "every input is 4-D, as ONNX lays images out (NCHW, ATC's ONNX default)"
    if ranks == {5}:
        return "NCDHW", "every input is 5-D (NCDHW)"
    return "ND", "the inputs are not all 4-D or all 5-D images: ND lets ATC derive formats per op"


def _estimate(proto, target, gears: Gears, mode: str) -> list[dict[str, Any]]:
    from graphpass.api import estimate, load

    out = []
    for shapes in gears.shapes:
        label = ";".join(f"{k}:{','.join(map(str, v))}" for k, v in shapes.items())
        try:
            r = estimate(load(proto, input_shapes=shapes), target, precision_mode=mode)
            total = None if r.total_us is None else r.total_us / 1000.0
        except Exception as e:  # noqa: BLE001 - an estimate must not stop the kit; say why
            out.append({"gear": label, "total_ms": None, "error": f"{type(e).__name__}: {e}"})
            continue
        out.append({"gear": label, "total_ms": total})
    return out


def write_kit(model, folder: str | Path, *, target: str | None = None, cann: str | None = None,
              profiles: Sequence[str] = (), precision_mode: str | None = None, keep_fp32: Sequence[str] = (),
              switches: Mapping[str, bool] | None = None, seed: int = 0, name: str = "model",
              final_folder: str | Path | None = None, drop_missing_keep: bool = False) -> Kit:
    """Write the kit for ``model`` (any form) into ``folder`` (created if missing). Raises
    :class:`UnsupportedError` naming every node ATC would refuse, before any file is written."""
    from graphpass.cost_model.target import Target
    from graphpass.ir.model import as_proto
    from graphpass.passes.fusion_switch import write_switch_file

    from graphpass.cost_model.target import DEFAULT_TARGET

    rel = C.release(cann)
    tgt = Target.resolve(target or DEFAULT_TARGET)
    if not tgt.has_hardware:
        from graphpass.cost_model import KNOWN_TARGETS

        raise UsageError(f"an ATC kit needs a hardware target ({', '.join(KNOWN_TARGETS)}), not 'none'")
    soc = C.soc_version(tgt.profile.name) if tgt.profile is not None else None
    if soc is None:
        raise UsageError(f"target '{tgt.name}': no ATC soc_version known for profile '{tgt.profile.name}' "
                         f"(cost_model/data/cann_atc.toml [soc_version])")
    proto = as_proto(model)
    fitted, check = fit_opset(proto, rel, seed=seed)
    if fitted is proto:  # as_proto may hand back the caller's own ModelProto: never change it
        fitted = onnx.ModelProto()
        fitted.CopyFrom(proto)
    if check.refused:
        raise UnsupportedError(f"ATC (CANN {rel.name}) would refuse {len(check.refused)} node(s); no kit written: "
                               + "; ".join(str(r) for r in check.refused[:20])
                               + (f"; ... {len(check.refused) - 20} more" if len(check.refused) > 20 else ""))
    dyn = rel.option("dynamic_dims")
    gears = plan_gears(fitted, list(profiles), dyn.min_gears if dyn else 2, dyn.max_gears if dyn else 100)

    _name_nodes(fitted)
    mode = precision_mode or tgt.default_precision_mode or "force_fp16"
    names = _node_names(fitted)
    keep = [n for n in keep_fp32 if n in names]
    missing = [n for n in keep_fp32 if n not in names]
    if missing and drop_missing_keep:  # optimize's keep-list names nodes of its input; some were fused away
        log.warning("keep-list: %d node(s) are not in the optimized model (fused or renamed): %s",
                    len(missing), ", ".join(missing[:5]))
    elif missing:
        raise UsageError(f"keep-list: no node named {', '.join(missing[:5])} in the model handed to ATC")
    switches = dict(switches or {})

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"
    model_file = f"{stem}.onnx"
    _save(fitted, folder / model_file)
    opts: list[tuple[str, str]] = [("framework", "5"), ("model", model_file), ("output", stem), ("soc_version", soc)]
    why = {"framework": "5 is ONNX",
           "model": "the model graphpass handed on" + (f", converted to opset v{check.opset} for CANN {rel.name}"
                                                         if check.converted_from is not None else ""),
           "output": f"ATC writes {stem}.om here",
           "soc_version": f"the chip of graphpass's target '{tgt.name}'"}
    opts.append(("input_shape", gears.atc_input_shape()))
    why["input_shape"] = ("the shapes graphpass fixed" if gears.option is None
                          else "-1 marks the dims that vary across the gears given by --shape-profile")
    if gears.option:
        opts.append((gears.option, gears.value))
        why[gears.option] = (f"{len(gears.shapes)} gears from --shape-profile" +
                             ("; only the batch (first) dim varies" if gears.option == "dynamic_batch_size"
                              else "; one value per -1 of --input_shape, in order"))
    fmt, fmt_why = _input_format(fitted, gears)
    opts.append(("input_format", fmt))
    why["input_format"] = fmt_why
    if "precision_mode_v2" in rel.options and mode in V2_MODES:
        flag, value = "precision_mode_v2", V2_MODES[mode]
        why[flag] = f"graphpass's precision mode {mode} (the v2 name; CANN {rel.name} recommends v2)"
    else:
        flag, value = "precision_mode", mode
        why[flag] = f"graphpass's precision mode {mode}" + ("" if "precision_mode_v2" in rel.options
                                                           else f" (CANN {rel.name} has no --precision_mode_v2)")
    opts.append((flag, value))
    files = [model_file]
    lowers = value not in _NO_KEEP and mode != "force_fp32"
    if keep and lowers:
        (folder / KEEP_FILE).write_text("".join(f"{n}\n" for n in keep), encoding="utf-8")
        opts.append(("keep_dtype", KEEP_FILE))
        why["keep_dtype"] = f"{len(keep)} node(s) the precision analysis keeps in fp32 (by op name)"
        files.append(KEEP_FILE)
        if value in _MIXED:
            count = Counter(names[n] for n in keep)
            total = Counter(names.values())
            black = sorted({t for op, k in count.items() if k == total[op] for t in rel.ascend_types.get(op, ())})
            if black:
                (folder / MIXLIST_FILE).write_text(json.dumps({"black-list": {"to-add": black}}, indent=2) + "\n",
                                                   encoding="utf-8")
                opts.append(("modify_mixlist", MIXLIST_FILE))
                why["modify_mixlist"] = ("op types every node of which is kept in fp32, added to the black list "
                                         "(Ascend IR types)")
                files.append(MIXLIST_FILE)
        opts.append(("op_select_implmode", "high_precision"))
        why["op_select_implmode"] = "the precision analysis found fp16 risk: ops with a high-precision kernel use it"
    write_switch_file(folder / SWITCH_FILE, switches, tgt)
    opts.append(("fusion_switch_file", SWITCH_FILE))
    off = sorted(n for n, on in switches.items() if not on)
    why["fusion_switch_file"] = ("every fusion graphpass knows, with graphpass's choice; off: " + (", ".join(off) or "none"))
    files.append(SWITCH_FILE)
    opts.append(("log", "warning"))
    why["log"] = "warnings and errors in $HOME/ascend/log (ATC's default, null, logs nothing)"
    estimates = _estimate(fitted, tgt, gears, mode)
    kit = Kit(Path(final_folder) if final_folder else folder, rel.name, opts, why, check, gears, estimates, keep,
              switches, mode, files + ["atc.sh", "README.md", MANIFEST])
    problems = check_command(opts, rel, folder)
    if problems:  # graphpass's own mistake: the data says this command would not be accepted
        raise AssertionError("the kit's command breaks the CANN documentation: " + "; ".join(problems))
    (folder / "atc.sh").write_text(_script(kit), encoding="utf-8")
    (folder / "atc.sh").chmod(0o755)
    (folder / "README.md").write_text(_readme(kit, rel), encoding="utf-8")
    (folder / MANIFEST).write_text(json.dumps(_manifest(kit, tgt.name), indent=2) + "\n", encoding="utf-8")
    return kit


def _save(proto: onnx.ModelProto, path: Path) -> None:
    try:
        onnx.save_model(proto, str(path))
    except ValueError:  # over protobuf's 2 GiB: weights beside it
        onnx.save_model(proto, str(path), save_as_external_data=True, location=path.name + ".data")


def check_command(options: Sequence[tuple[str, str]], rel: C.CannRelease, folder: Path) -> list[str]:
    """What in ``options`` the release's documentation does not allow (empty: all is documented)."""
    problems = []
    given = dict(options)
    for k, v in options:
        o = rel.option(k)
        if o is None:
            problems.append(f"--{k} is not an ATC option of CANN {rel.name}")
            continue
        if o.kind == "enum" and v not in o.values:
            problems.append(f"--{k}={v}: not one of {', '.join(o.values)}")
        if o.kind == "file":
            p = folder / v
            if not p.is_file():
                problems.append(f"--{k}={v}: the file is not in the kit")
            else:
                problems += [f"--{k}={v}: {e}" for e in _parses(k, p)]
        if o.kind == "gears":
            n = len(v.split(";" if k == "dynamic_dims" else ","))
            if not o.min_gears <= n <= o.max_gears:
                problems.append(f"--{k}: {n} gears, ATC takes {o.min_gears}..{o.max_gears}")
    if "precision_mode" in given and "precision_mode_v2" in given:
        problems.append("--precision_mode and --precision_mode_v2 together (ATC refuses both)")
    if "dynamic_dims" in given and given.get("input_format") != "ND":
        problems.append("--dynamic_dims needs --input_format=ND")
    return problems


def _parses(flag: str, path: Path) -> list[str]:
    try:
        if flag == "model":
            onnx.checker.check_model(str(path), full_check=False)
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        else:
            path.read_text(encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
        return [f"does not parse: {str(e).splitlines()[0] if str(e) else type(e).__name__}"]
    return []


def _script(kit: Kit) -> str:
    lines = ["#!/bin/sh", "# Written by graphpass: convert the model with ATC (CANN %s). README.md says why each" % kit.cann,
             "# option has its value. For `graphpass atc-check`, keep fusion_result.json and, to compare",
             "# TransData and engines too, dump GE's graphs: export DUMP_GE_GRAPH=2 DUMP_GRAPH_LEVEL=3", "set -e",
             'cd "$(dirname "$0")"', "atc \\"]
    lines += [f"  --{k}={shlex.quote(v)} \\" for k, v in kit.options[:-1]]
    k, v = kit.options[-1]
    lines.append(f"  --{k}={shlex.quote(v)}")
    return "\n".join(lines) + "\n"


def _readme(kit: Kit, rel: C.CannRelease) -> str:
    out = [f"# ATC conversion kit (CANN {kit.cann})", "",
           "Run `sh atc.sh` on a machine with the CANN toolkit installed. Written by graphpass; every option",
           f"below is documented for CANN {kit.cann} (graphpass checked the command against its data, "
           "cost_model/data/cann_atc.toml, before writing).", "", "## Options", "",
           "| option | value | why | document |", "|---|---|---|---|"]
    for k, v in kit.options:
        o = rel.option(k)
        out.append(f"| `--{k}` | `{v}` | {kit.why.get(k, '')} | {o.src if o else ''} |")
    out += ["", "## Operator check", ""] + [f"- {line.strip()}" for line in kit.opcheck.lines()]
    if len(kit.estimates) > 1 or kit.gears.option:
        out += ["", "## Gears (cost-model estimates, not measurements)", "", "| gear | estimate (ms) |", "|---|---|"]
        out += [f"| `{e['gear']}` | {_ms(e['total_ms'])} |" for e in kit.estimates]
    out += ["", "## Files", ""] + [f"- `{f}`" for f in kit.files]
    out += ["", "## Reading back", "",
            "After conversion, compare what ATC did with graphpass's plan:",
            "`graphpass atc-check <model> --kit . --fusion-result fusion_result.json [--ge-graph <dump folder>]`.", ""]
    return "\n".join(out)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _manifest(kit: Kit, target: str) -> dict[str, Any]:
    return {"schema": "graphpass.atc-kit/1", "cann": kit.cann, "target": target, "precision_mode": kit.precision_mode,
            "options": [[k, v] for k, v in kit.options], "keep_fp32": kit.keep_fp32,
            "switches": dict(sorted(kit.switches.items())), "gears": kit.gears.shapes, "estimates": kit.estimates,
            "opcheck": kit.opcheck.to_dict()}


@dataclasses.dataclass
class KitDecisions:
    """What a kit's files say (read back from the files themselves, not from the manifest)."""

    keep_fp32: list[str]
    switches: dict[str, bool]
    options: dict[str, str]


def read_kit(folder: str | Path, target: str | None = None) -> KitDecisions:
    """The decisions in a kit's ``atc.sh``, ``--keep_dtype`` file and ``--fusion_switch_file``."""
    from graphpass.passes.fusion_switch import read_switch_file

    folder = Path(folder)
    script = folder / "atc.sh"
    try:
        text = script.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{script}: cannot read the kit: {e.strerror}") from None
    words = shlex.split(text.split("atc \\", 1)[-1].replace("\\\n", " "))
    options = {}
    for w in words:
        if w.startswith("--") and "=" in w:
            k, v = w[2:].split("=", 1)
            options[k] = v
    keep = []
    if "keep_dtype" in options:
        keep = [ln.strip() for ln in (folder / options["keep_dtype"]).read_text(encoding="utf-8").splitlines()
                if ln.strip() and not ln.startswith("#")]
    switches = read_switch_file(folder / options["fusion_switch_file"], target) if "fusion_switch_file" in options else {}
    return KitDecisions(keep, switches, options)
