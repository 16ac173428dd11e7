"""What ATC would refuse, found before a kit is written; a model outside the chosen CANN's opset
range converted into it (onnx's version converter) and verified equal in onnxruntime.

ATC's ONNX parser finds a node by ``ai.onnx::<the model's ai.onnx opset>::<op_type>`` (the
registrations listed in ``cost_model/data/cann_onnx_ops.toml``): a node is refused when its op
has no registration at that opset in the chosen release, or its domain is not ai.onnx.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import onnx

from graphpass.cost_model.cann import CannRelease
from graphpass.errors import BadModelError, UsageError, VerificationError

__all__ = ["Refusal", "OpCheck", "check_ops", "fit_opset", "model_opset"]


@dataclasses.dataclass
class Refusal:
    node: str
    op_type: str
    domain: str
    opset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op_type}): {self.reason}"


@dataclasses.dataclass
class OpCheck:
    """The op check of a model against one CANN release (what the kit's README reports)."""

    cann: str
    opset_range: tuple[int, int]
    opset: int
    converted_from: int | None = None
    verified: str = ""
    refused: list[Refusal] = dataclasses.field(default_factory=list)
    op_types: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"cann": self.cann, "opset_range": list(self.opset_range), "opset": self.opset,
                "converted_from": self.converted_from, "verified": self.verified, "op_types": self.op_types,
                "refused": [dataclasses.asdict(r) for r in self.refused]}

    def lines(self) -> list[str]:
        out = [f"CANN {self.cann} takes ai.onnx opset v{self.opset_range[0]}..v{self.opset_range[1]}; the model is at v{self.opset}"
               + (f" (converted from v{self.converted_from}; {self.verified})" if self.converted_from is not None else "")]
        if self.refused:
            out.append(f"ATC {self.cann} would refuse {len(self.refused)} node(s):")
            out += [f"  {r}" for r in self.refused]
        else:
            out.append(f"every node's op is in the CANN {self.cann} operator list ({self.op_types} op types)")
        return out


def model_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise BadModelError("the model imports no ai.onnx opset")


def _nodes(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[str, onnx.NodeProto]]:
    for node in graph.node:
        yield where, node
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                yield from _nodes(g, f"{where}{node.name or node.op_type}/{a.name}/")


def check_ops(proto: onnx.ModelProto, rel: CannRelease) -> OpCheck:
    """Every node (subgraphs included) against ``rel``'s operator list."""
    opset = model_opset(proto)
    lo, hi = rel.opset
    check = OpCheck(rel.name, rel.opset, opset)
    local = {f.name for f in proto.functions}
    seen = set()
    for where, node in _nodes(proto.graph):
        name = where + (node.name or (node.output[0] if node.output else node.op_type))
        seen.add((node.domain, node.op_type))
        if node.domain not in ("", "ai.onnx"):
            why = ("a function of the model (ATC reads no ONNX functions)" if node.op_type in local
                   else f"domain '{node.domain}': ATC's ONNX parser takes ai.onnx ops only"
                   + (" (write the model with emit='portable')" if node.domain == "graphpass.ascend" else ""))
            check.refused.append(Refusal(name, node.op_type, node.domain, opset, why))
        elif not lo <= opset <= hi:
            check.refused.append(Refusal(name, node.op_type, node.domain, opset,
                                         f"opset {opset} is outside CANN {rel.name}'s v{lo}..v{hi}"))
        elif not rel.supports(node.op_type, opset):
            have = sorted(rel.ops.get(node.op_type, ()))
            why = (f"not in the CANN {rel.name} ONNX operator list" if not have
                   else f"registered at opsets {_ranges(have)} only, not v{opset}")
            check.refused.append(Refusal(name, node.op_type, node.domain, opset, why))
    check.op_types = len(seen)
    return check


def _ranges(vs: list[int]) -> str:
    out, start = [], vs[0]
    for a, b in zip(vs, vs[1:] + [None]):
        if b != a + 1:
            out.append(f"v{start}" if start == a else f"v{start}..v{a}")
            start = b
    return ", ".join(out)


def fit_opset(proto: onnx.ModelProto, rel: CannRelease, seed: int = 0,
              input_shapes: dict[str, list[int]] | None = None) -> tuple[onnx.ModelProto, OpCheck]:
    """``proto`` in ``rel``'s opset range (converted when outside it, then verified bitwise equal
    in onnxruntime on seeded inputs), and its op check. ``proto`` itself is not changed."""
    opset = model_opset(proto)
    lo, hi = rel.opset
    if lo <= opset <= hi:
        return proto, check_ops(proto, rel)
    want = hi if opset > hi else lo
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(proto, want)
    except Exception as e:  # noqa: BLE001 - the converter raises bare RuntimeErrors
        # onnx has no adapter for many changes that only widened the types (Relu 13 -> 14: bfloat16);
        # such nodes stay as they are under the new opset when their types are allowed there
        blocked = _type_only_blockers(proto, opset, want)
        if blocked:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UsageError(f"the model is at ai.onnx opset {opset}; CANN {rel.name} takes v{lo}..v{hi}, and neither "
                             f"onnx's version converter ({why}) nor a relabel converts it to v{want}: "
                             + "; ".join(blocked[:10])) from None
        converted = onnx.ModelProto()
        converted.CopyFrom(proto)
    for imp in converted.opset_import:  # the converter keeps the ir_version of the input
        if imp.domain in ("", "ai.onnx"):
            imp.version = want
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"onnx's version converter made an invalid model at opset {want}: {str(e).splitlines()[0]}") from None
    verified = _verify(proto, converted, seed, input_shapes)
    check = check_ops(converted, rel)
    check.converted_from, check.verified = opset, verified
    return converted, check


def _type_only_blockers(proto: onnx.ModelProto, have: int, want: int) -> list[str]:
    """Nodes whose op changed between opsets ``have`` and ``want`` in more than its type lists
    (inputs, outputs, attributes), or uses a type ``want`` does not allow; empty: relabelling
    the opset import keeps every node's meaning."""
    from onnx import defs, shape_inference

    try:
        inferred = shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - without types, only schema identity can be judged
        inferred = proto
    types: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in inferred.graph.initializer:
        types[t.name] = t.data_type
    blocked = []
    for _, node in _nodes(proto.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            a, b = defs.get_schema(node.op_type, have), defs.get_schema(node.op_type, want)
        except Exception:  # noqa: BLE001 - the op does not exist at ``want``
            blocked.append(f"{node.name or node.op_type} ({node.op_type}) does not exist at v{want}")
            continue
        if a.since_version == b.since_version:
            continue
        same = ([(i.name, i.option) for i in a.inputs] == [(i.name, i.option) for i in b.inputs]
                and [(o.name, o.option) for o in a.outputs] == [(o.name, o.option) for o in b.outputs]
                and sorted(a.attributes) == sorted(b.attributes))
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in b.type_constraints}
        bad_type = ""
        for formals, names in ((b.inputs, node.input), (b.outputs, node.output)):
            for formal, name in zip(formals, names):
                if name and name in types and formal.type_str in allowed:
                    tstr = f"tensor({onnx.helper.tensor_dtype_to_string(types[name]).split('.')[-1].lower()})"
                    tstr = tstr.replace("tensor(float32)", "tensor(float)").replace("tensor(float64)", "tensor(double)")
                    if tstr not in allowed[formal.type_str]:
                        bad_type = f"{name} is {tstr}"
        if not same or bad_type:
            blocked.append(f"{node.name or node.op_type} ({node.op_type} v{a.since_version} -> v{b.since_version}: "
                           + (bad_type or "inputs or attributes changed") + ")")
    return blocked


def _verify(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int, input_shapes) -> str:
    from graphpass.check import verify as V

    feeds, ref, _, _, notes = V.reference(original, seed=seed, input_shapes=input_shapes or None)
    try:
        checked = V.check_outputs(ref, converted, feeds, rtol=0.0, atol=0.0)
    except BadModelError as e:
        raise VerificationError(f"the model converted by onnx's version converter does not run where the original does: {e}") from None
    if not checked.ok:
        raise VerificationError(f"the opset conversion changed the outputs: {checked.describe()}")
    return f"verified bitwise equal in onnxruntime, {len(checked.comparisons)} output(s), seed {seed}" + "".join(f"; {n}" for n in notes)
