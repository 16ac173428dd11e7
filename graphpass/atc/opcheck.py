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

from graphpass.check.promise import Promise
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
    consts = {t.name for t in proto.graph.initializer}
    consts |= {o for _, n in _nodes(proto.graph) if n.op_type == "Constant" for o in n.output}
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
        else:
            for why in _constraint_breaks(node, rel, consts):
                check.refused.append(Refusal(name, node.op_type, node.domain, opset, why))
    check.op_types = len(seen)
    return check


def _attr_text(node: onnx.NodeProto, name: str) -> str | None:
    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def _constraint_breaks(node: onnx.NodeProto, rel: CannRelease, consts: set[str]) -> list[str]:
    out = []
    for c in rel.constraints:
        if c.op != node.op_type:
            continue
        if any((_attr_text(node, k) or "") != v and not (_attr_text(node, k) is None and v == _default_of(rel, node.op_type, k))
               for k, v in c.when):
            continue
        if c.attr:
            value = _attr_text(node, c.attr)
            value = c.default if value is None else value
            if value not in c.allowed:
                out.append(f"{c.attr}={value}: CANN {rel.name} takes {' or '.join(c.allowed)} ({c.src.split(' ')[0]})")
        for i in c.const_inputs:
            if i < len(node.input) and node.input[i] and node.input[i] not in consts:
                out.append(f"input {i} ({node.input[i]}) must be a constant for CANN {rel.name} "
                           f"(fold_constants makes it one where it can)")
    return out


def _default_of(rel: CannRelease, op: str, attr: str) -> str:
    return next((c.default for c in rel.constraints if c.op == op and c.attr == attr), "")


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
    converted, expanded = _convert(proto, opset, want, rel)
    for imp in converted.opset_import:  # the converter keeps the ir_version of the input
        if imp.domain in ("", "ai.onnx"):
            imp.version = want
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"onnx's version converter made an invalid model at opset {want}: {str(e).splitlines()[0]}") from None
    verified = _verify(proto, converted, seed, input_shapes, expanded)
    check = check_ops(converted, rel)
    check.converted_from, check.verified = opset, verified
    return converted, check


def _convert(proto: onnx.ModelProto, have: int, want: int, rel: CannRelease) -> tuple[onnx.ModelProto, int]:
    """One opset step at a time with onnx's version converter; returns the model and how many
    nodes were expanded. A node whose op does not exist at the next opset down (Gelu below 20,
    LayerNormalization below 17, HardSwish below 14) is replaced by its ONNX function body (the
    op's definition; onnxruntime's own kernel for the op rounds differently, so the result is
    verified within float rounding, not bitwise). Where the converter has no adapter, the nodes
    whose op changed at that step only additively (wider types, a new attribute the node leaves
    at its default) are hidden from it (a placeholder domain) and kept as they are; the rest is
    converted by onnx; a node neither can convert is named."""
    from onnx import version_converter

    step = 1 if want > have else -1
    model = proto
    expanded = 0
    for v in range(have, want, step):
        nxt = v + step
        if step < 0:
            model = _own_adapters(model, v, nxt)
            model, n = _expand_missing(model, nxt)
            expanded += n
        try:
            model = _strip_defaults(version_converter.convert_version(model, nxt), v, nxt)
            continue
        except Exception as e:  # noqa: BLE001 - the converter raises bare RuntimeErrors
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
        safe, blocked = _step_nodes(model, v, nxt)
        hidden = onnx.ModelProto()
        hidden.CopyFrom(model)
        for _, node in _nodes(hidden.graph):
            if node.domain in ("", "ai.onnx") and _key(node) in safe:
                node.domain = _HIDE
        hidden.opset_import.add(domain=_HIDE, version=1)
        try:
            out = _strip_defaults(version_converter.convert_version(hidden, nxt), v, nxt) if blocked else hidden
        except Exception:  # noqa: BLE001
            raise UsageError(f"the model is at ai.onnx opset {have}; CANN {rel.name} takes v{rel.opset[0]}..v{rel.opset[1]}; "
                             f"at the step v{v} -> v{nxt} neither onnx's version converter ({why}) nor a relabel "
                             "converts: " + "; ".join(blocked[:10])) from None
        for _, node in _nodes(out.graph):
            if node.domain == _HIDE:
                node.domain = ""
                known = onnx.defs.get_schema(node.op_type, nxt).attributes
                keep_at = [a for a in node.attribute if a.name in known]  # the rest sits at its old behaviour
                del node.attribute[:]
                node.attribute.extend(keep_at)
        keep = [i for i in out.opset_import if i.domain != _HIDE]
        del out.opset_import[:]
        out.opset_import.extend(keep)
        for imp in out.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = nxt
        model = out
    return model, expanded


_HIDE = "graphpass.opset_step"
_INT64_MAX = 2**63 - 1


def _strip_defaults(model: onnx.ModelProto, have: int, want: int) -> onnx.ModelProto:
    """Attributes ``want``'s schema does not know, left by the converter at the default of
    ``have``'s (onnx's ReduceMean 18 -> 17 keeps noop_with_empty_axes=0), removed; one set to
    anything else stops the conversion."""
    for _, node in _nodes(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            known, old = onnx.defs.get_schema(node.op_type, want), onnx.defs.get_schema(node.op_type, have)
        except Exception:  # noqa: BLE001 - judged by the op check
            continue
        extra = [a for a in node.attribute if a.name not in known.attributes]
        if not extra:
            continue
        if not all(_at_default(a, old) for a in extra):
            raise UsageError(f"{node.name or node.op_type} ({node.op_type}): attribute "
                             f"{', '.join(a.name for a in extra)} has no equivalent at opset {want}")
        keep = [a for a in node.attribute if a.name in known.attributes]
        del node.attribute[:]
        node.attribute.extend(keep)
    return model


def _expand_missing(model: onnx.ModelProto, want: int) -> tuple[onnx.ModelProto, int]:
    """Main-graph nodes whose op does not exist at opset ``want`` replaced by the op's ONNX
    function body (context-dependent bodies built for the node's attributes and input types),
    inlined; the count of nodes expanded."""
    from onnx import defs, inliner, shape_inference

    def missing(n: onnx.NodeProto) -> bool:
        if n.domain not in ("", "ai.onnx"):
            return False
        try:
            defs.get_schema(n.op_type, want)
            return False
        except Exception:  # noqa: BLE001 - no version at or below ``want``
            return True

    if not any(missing(n) for n in model.graph.node):
        return model, 0
    have = model_opset(model)
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001
        inferred = model
    types = {vi.name: vi.type for vi in list(inferred.graph.value_info) + list(inferred.graph.input)}
    for t in inferred.graph.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    count = 0
    for node in out.graph.node:
        if not missing(node):
            continue
        schema = defs.get_schema(node.op_type, have)
        body = None
        if schema.has_function:
            body = onnx.FunctionProto()
            body.CopyFrom(schema.function_body)
        elif schema.has_context_dependent_function and all(i in types for i in node.input if i):
            raw = schema.get_context_dependent_function(node.SerializeToString(),
                                                        [types[i].SerializeToString() for i in node.input if i])
            body = onnx.FunctionProto()
            body.ParseFromString(raw)
        if body is None:
            continue  # named by the step's check
        body.domain, body.name = _EXPAND, f"{node.op_type}_{count}"
        if not body.opset_import:
            body.opset_import.add(domain="", version=have)
        node.domain, node.op_type = _EXPAND, body.name
        if not schema.has_function:  # a context-dependent body has the attributes baked in
            del node.attribute[:]
        out.functions.append(body)
        count += 1
    if not count:
        return model, 0
    out.opset_import.add(domain=_EXPAND, version=1)
    res = inliner.inline_local_functions(out)
    keep = [i for i in res.opset_import if i.domain != _EXPAND]
    del res.opset_import[:]
    res.opset_import.extend(keep)
    del res.functions[:]
    res.functions.extend(f for f in model.functions)
    return res, count


_EXPAND = "graphpass.expand"


def _own_adapters(model: onnx.ModelProto, have: int, want: int) -> onnx.ModelProto:
    """The down-conversions onnx's converter lacks that dynamo exports need, done exactly:
    Shape-15 with start/end -> Shape + Slice (15 -> 14); Split-18 with num_outputs -> Split with
    the sizes input, from the inferred dim (18 -> 17)."""
    from onnx import helper, numpy_helper, shape_inference
    import numpy as np

    def wanted(n: onnx.NodeProto) -> bool:
        return n.domain in ("", "ai.onnx") and (
            (have == 15 and n.op_type == "Shape" and any(a.name in ("start", "end") for a in n.attribute))
            or (have == 18 and n.op_type == "Split" and any(a.name == "num_outputs" for a in n.attribute)))

    if not any(wanted(n) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    todo = [n for n in g.node if wanted(n)]
    dims: dict[str, list] = {}
    if any(n.op_type == "Split" for n in todo):
        try:
            inferred = shape_inference.infer_shapes(out)
        except Exception:  # noqa: BLE001 - no dims: the Split stays for the converter to judge
            inferred = out
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        for t in inferred.graph.initializer:
            dims[t.name] = list(t.dims)
    names = {n.name for n in g.node} | {t.name for t in g.initializer}

    def fresh(base: str) -> str:
        k = 0
        while f"{base}__gp{k}" in names:
            k += 1
        names.add(f"{base}__gp{k}")
        return f"{base}__gp{k}"

    nodes = list(g.node)
    new_nodes = []
    for node in nodes:
        if not any(node is t for t in todo):
            new_nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Shape":
            full = fresh(node.output[0] + "_full")
            starts, ends, axes = fresh("starts"), fresh("ends"), fresh("axes")
            g.initializer.extend([numpy_helper.from_array(np.int64([attrs.get("start", 0)]), starts),
                                  numpy_helper.from_array(np.int64([attrs.get("end", _INT64_MAX)]), ends),
                                  numpy_helper.from_array(np.int64([0]), axes)])
            new_nodes.append(helper.make_node("Shape", [node.input[0]], [full], name=node.name))
            new_nodes.append(helper.make_node("Slice", [full, starts, ends, axes], list(node.output),
                                              name=fresh((node.name or "shape") + "_slice")))
            continue
        axis, n = attrs.get("axis", 0), attrs["num_outputs"]
        shape = dims.get(node.input[0])
        if len(node.input) > 1 and node.input[1] or not shape or shape[axis] is None:
            new_nodes.append(node)  # sizes unknown: left for the converter (and named if it fails)
            continue
        d = shape[axis]
        chunk = -(-d // n)
        sizes = [chunk] * (n - 1) + [d - chunk * (n - 1)]
        split = fresh("split_sizes")
        g.initializer.append(numpy_helper.from_array(np.int64(sizes), split))
        rest = [a for a in node.attribute if a.name != "num_outputs"]
        repl = helper.make_node("Split", [node.input[0], split], list(node.output), name=node.name)
        repl.attribute.extend(rest)
        new_nodes.append(repl)
    del g.node[:]
    g.node.extend(new_nodes)
    return out


def _key(node: onnx.NodeProto) -> tuple:
    return (node.op_type, tuple(node.input), tuple(node.output))


def _step_nodes(proto: onnx.ModelProto, have: int, want: int) -> tuple[set, list[str]]:
    """Of the nodes whose op changed between opsets ``have`` and ``want``: the ones that keep their
    meaning under ``want`` as they are (same inputs and outputs, no attribute set that ``want``
    lacks unless at its default, types allowed), by :func:`_key`; and the others, described."""
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
    consts = {t.name: t for t in proto.graph.initializer}
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    blocked, safe = [], set()
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
        # an attribute the node does not set keeps its default: ONNX adds attributes whose default
        # is the old behaviour (Reshape-14 allowzero=0, Shape-15 start=0/end=none)
        same = ([(i.name, i.option) for i in a.inputs] == [(i.name, i.option) for i in b.inputs]
                and [(o.name, o.option) for o in a.outputs] == [(o.name, o.option) for o in b.outputs]
                and all(at.name in b.attributes or _at_default(at, a) or _moot(node, at, consts)
                        for at in node.attribute))
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
                           + (bad_type or "inputs, outputs or a set attribute changed") + ")")
        else:
            safe.add(_key(node))
    return safe, blocked


def _moot(node: onnx.NodeProto, at: onnx.AttributeProto, consts) -> bool:
    """The attribute changes nothing on this node: Reshape's allowzero with a constant shape
    holding no 0 (allowzero only says what a 0 in the shape means)."""
    if node.op_type == "Reshape" and at.name == "allowzero" and len(node.input) > 1 and node.input[1] in consts:
        from onnx import numpy_helper

        return bool((numpy_helper.to_array(consts[node.input[1]]) != 0).all())
    return False


def _at_default(at: onnx.AttributeProto, schema) -> bool:
    """``at`` is set to the default the newer schema gives it (the older behaviour)."""
    formal = schema.attributes.get(at.name)
    if formal is None or not formal.default_value.name:
        return False
    return onnx.helper.get_attribute_value(at) == onnx.helper.get_attribute_value(formal.default_value)


#: the bound of a model in which ops were replaced by their ONNX function bodies
FUNCTION_BODY = Promise.tolerance("function-body", rtol=1e-5, atol=1e-6,
                                  reason="an op replaced by its ONNX function body: the same formula, rounded per node")


def _verify(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int, input_shapes, expanded: int = 0) -> str:
    from graphpass.check import verify as V

    feeds, ref, _, _, notes = V.reference(original, seed=seed, input_shapes=input_shapes or None)
    try:
        if expanded:
            checked = V.check_outputs(ref, converted, feeds, promises=[FUNCTION_BODY])
        else:
            checked = V.check_outputs(ref, converted, feeds, rtol=0.0, atol=0.0)
    except BadModelError as e:
        raise VerificationError(f"the model converted by onnx's version converter does not run where the original does: {e}") from None
    if not checked.ok:
        raise VerificationError(f"the opset conversion changed the outputs: {checked.describe()}")
    how = (f"verified equal within float rounding ({checked.tolerance}) in onnxruntime, {expanded} node(s) "
           "expanded by their ONNX function bodies" if expanded else "verified bitwise equal in onnxruntime")
    return f"{how}, {len(checked.comparisons)} output(s), seed {seed}" + "".join(f"; {n}" for n in notes)
