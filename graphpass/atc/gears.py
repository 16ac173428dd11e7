"""Shape profiles (``--shape-profile``, one per gear) -> ATC's ``--input_shape`` and its gear
option: ``--dynamic_batch_size`` when only the first dim of inputs varies and every varying input
has the same value in each gear, else ``--dynamic_dims`` (one value per -1, ``--input_format=ND``).

A profile is ``NAME:D1,D2,...[;NAME2:...]`` (input shapes) or ``DIM=V[,DIM2=V2]`` (values of the
model's symbolic dims); both may be mixed across profiles.
"""

from __future__ import annotations

import dataclasses

import onnx

from graphpass.errors import UsageError

__all__ = ["Gears", "parse_profile", "plan_gears", "static_shapes"]


def parse_profile(text: str) -> dict:
    """``{"inputs": {name: dims}}`` or ``{"dims": {sym: value}}`` from one --shape-profile."""
    text = text.strip()
    if not text:
        raise UsageError("profiles: an empty profile", option="profiles")
    if ":" in text:
        shapes = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            name, sep, dims = part.rpartition(":")
            if not sep or not name:
                raise UsageError(f"profiles {text!r}: expected NAME:D1,D2,... per input", option="profiles")
            try:
                shapes[name] = [int(d) for d in dims.split(",")] if dims.strip() else []
            except ValueError:
                raise UsageError(f"profiles {text!r}: dims of '{name}' must be integers", option="profiles") from None
            if any(d < 1 for d in shapes[name]):
                raise UsageError(f"profiles {text!r}: a gear fixes every dim to a positive value", option="profiles")
        return {"inputs": shapes}
    dims = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        try:
            dims[k.strip()] = int(v)
        except ValueError:
            raise UsageError(f"profiles {text!r}: expected DIM=VALUE[,DIM=VALUE] or NAME:D1,D2,...", option="profiles") from None
        if not sep or not k.strip() or dims[k.strip()] < 1:
            raise UsageError(f"profiles {text!r}: expected DIM=VALUE with VALUE >= 1", option="profiles")
    return {"dims": dims}


def _declared(proto: onnx.ModelProto) -> dict[str, list]:
    init = {t.name for t in proto.graph.initializer}
    out = {}
    for vi in proto.graph.input:
        if vi.name in init:
            continue
        t = vi.type.tensor_type
        out[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return out


def static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]] | None:
    """Every input's shape when all are static, else None."""
    shapes = _declared(proto)
    if all(all(isinstance(d, int) and d > 0 for d in s) for s in shapes.values()):
        return {k: list(v) for k, v in shapes.items()}
    return None


@dataclasses.dataclass
class Gears:
    input_shape: dict[str, list[int]]            # -1 where a dim varies across gears
    shapes: list[dict[str, list[int]]]            # each gear's concrete shapes
    option: str | None = None                     # dynamic_batch_size | dynamic_dims | None
    value: str = ""

    def atc_input_shape(self) -> str:
        return ";".join(f"{k}:{','.join(str(d) for d in v)}" for k, v in self.input_shape.items())


def _concrete(decl: dict[str, list], profile: dict, where: str) -> dict[str, list[int]]:
    out = {}
    syms = {d for dims in decl.values() for d in dims if isinstance(d, str)}
    unknown_dims = set(profile.get("dims", {})) - syms
    if unknown_dims:
        raise UsageError(f"{where}: no input dim named {', '.join(sorted(unknown_dims))} "
                         f"(the model's symbolic dims: {', '.join(sorted(syms)) or 'none'})", option="profiles")
    if "inputs" in profile:
        unknown = set(profile["inputs"]) - set(decl)
        if unknown:
            raise UsageError(f"{where}: no model input named {', '.join(sorted(unknown))} (inputs: {', '.join(decl)})", option="profiles")
    for name, dims in decl.items():
        given = profile.get("inputs", {}).get(name)
        if given is not None:
            if len(given) != len(dims) or any(isinstance(d, int) and d > 0 and d != g for d, g in zip(dims, given)):
                raise UsageError(f"{where}: {name}:{','.join(map(str, given))} does not fit the input's shape "
                                 f"[{','.join(map(str, dims))}]", option="profiles")
            out[name] = list(given)
            continue
        shape = []
        for d in dims:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif isinstance(d, str) and d in profile.get("dims", {}):
                shape.append(profile["dims"][d])
            else:
                raise UsageError(f"{where}: input '{name}' dim '{d}' is open; give it in the profile "
                                 f"({d}=N, or {name}:D1,D2,...)", option="profiles")
        out[name] = shape
    return out


def plan_gears(proto: onnx.ModelProto, profiles: list[str], min_gears: int = 2, max_gears: int = 100) -> Gears:
    """The ATC shape options for ``proto`` with ``profiles`` (none: the model must be static)."""
    decl = _declared(proto)
    for name in decl:  # the syntax of ATC's input_shape option: name:d1,d2;name:...
        bad = [c for c in ";:," if c in name]
        if bad:
            raise UsageError(f"input '{name}' has '{bad[0]}' in its name, which ATC's input_shape option uses as a "
                             "separator (name:d1,d2;...): rename the input before handing the model to ATC")
    if not profiles:
        fixed = static_shapes(proto)
        if fixed is None:
            open_ = [f"{k}[{','.join(map(str, v))}]" for k, v in decl.items()
                     if not all(isinstance(d, int) and d > 0 for d in v)]
            raise UsageError(f"the model has open input dims ({'; '.join(open_)}): ATC needs them fixed; fix the "
                             "input shapes, or give profiles, one per gear of a dynamic model", option="profiles")
        return Gears(fixed, [fixed])
    parsed = [parse_profile(p) for p in profiles]
    shapes = [_concrete(decl, p, f"profiles {t!r}") for p, t in zip(parsed, profiles)]
    if len(shapes) == 1:
        return Gears(shapes[0], shapes)
    if len(shapes) > max_gears:
        raise UsageError(f"profiles: {len(shapes)} gears; ATC takes at most {max_gears}", option="profiles")
    if len({repr(s) for s in shapes}) != len(shapes):
        raise UsageError("profiles: two gears have the same shapes", option="profiles")
    varying = {(k, i) for k, dims in shapes[0].items() for i in range(len(dims))
               if len({s[k][i] for s in shapes}) > 1}
    input_shape = {k: [-1 if (k, i) in varying else d for i, d in enumerate(dims)] for k, dims in shapes[0].items()}
    g = Gears(input_shape, shapes)
    batch_only = all(i == 0 for _, i in varying)
    same_n = all(len({s[k][0] for k, _ in varying}) == 1 for s in shapes)
    if batch_only and same_n:
        g.option = "dynamic_batch_size"
        g.value = ",".join(str(s[next(iter(varying))[0]][0]) for s in shapes)
    else:
        order = [(k, i) for k, dims in shapes[0].items() for i in range(len(dims)) if (k, i) in varying]
        g.option = "dynamic_dims"
        g.value = ";".join(",".join(str(s[k][i]) for k, i in order) for s in shapes)
    if len(shapes) < min_gears:  # pragma: no cover - one profile is handled above
        raise UsageError(f"profiles: ATC's gear options need at least {min_gears} gears", option="profiles")
    return g
