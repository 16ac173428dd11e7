"""Device ops: the ``graphpass.ascend`` domain, each op with an ONNX function body.

A device op (a fused Conv, later TransData) is what the Ascend device will run as one kernel.
It is emitted with a model-local function that defines it in standard ONNX, so every model
graphpass writes still runs in onnxruntime and shows in Netron.

Two forms of output: ``emit="device"`` keeps the device ops as nodes (for review, diff, cost);
``emit="portable"`` (what ``graphpass.save`` writes by default) inlines each through its body
into standard ONNX and drops the functions; the inlined nodes keep the call's annotations
(engine, provenance), so the formats, engines and provenance stay as metadata.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import onnx
import onnx.inliner
import onnx_graphsurgeon as gs
from onnx import AttributeProto, TensorProto, helper, numpy_helper
from onnx_graphsurgeon.importers.onnx_importer import OnnxImporter

from graphpass.ir.graph import graph_protos, has_subgraph

__all__ = ["DOMAIN", "CONV_ATTRS", "FUSED_CONV", "FLOAT_TYPES", "elem_type", "typed_scalar", "fused_conv_function",
           "gelu_function", "layer_norm_function", "transdata_function", "is_transdata", "ensure_function",
           "function_type_conflict", "to_portable"]

log = logging.getLogger(__name__)

DOMAIN = "graphpass.ascend"

#: Conv attributes a fused Conv forwards to its body (attribute references).
CONV_ATTRS = {"auto_pad": AttributeProto.STRING, "dilations": AttributeProto.INTS, "group": AttributeProto.INT,
              "kernel_shape": AttributeProto.INTS, "pads": AttributeProto.INTS, "strides": AttributeProto.INTS}

#: activation -> (device op name, extra function attributes, minimum opset of the body)
FUSED_CONV = {
    "Relu": ("FusedConvRelu", {}, 7),
    "Relu6": ("FusedConvRelu6", {}, 11),
    "LeakyRelu": ("FusedConvLeakyRelu", {"alpha": AttributeProto.FLOAT}, 7),
    "HardSwish": ("FusedConvHardSwish", {}, 14),
    "SiLU": ("FusedConvSiLU", {}, 7),
}


#: The float types a device op body is written for (its constants are typed by one of them).
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)

#: Marks a body whose constants are typed: ``doc_string`` is this prefix and the type's name.
_TYPED = "graphpass body typed for "

#: The device ops whose bodies hold typed constants (the others are polymorphic).
_TYPED_OPS = ("FusedConvRelu6", "Gelu", "LayerNorm",
              "RmsNorm", "AddRmsNorm", "GeluTanh", "GeGlu", "GeGluTanh")  # the last five: device_ops_tf


def elem_type(dtype) -> int | None:
    """The ``TensorProto`` element type of a tensor's dtype as graphsurgeon holds it (a numpy
    dtype, or the ONNX enum for types numpy lacks, e.g. bfloat16); None when unknown."""
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)):
        return int(dtype)
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return None


def _scalar_tensor(name: str, value: float, elem: int) -> onnx.TensorProto:
    return helper.make_tensor(name, elem, [], [value])


def typed_scalar(value: float, elem: int) -> float:
    """``value`` as a tensor of type ``elem`` holds it (rounded once, as a constant written in
    that type holds it): what a matcher compares a graph's constant with, bit for bit."""
    return float(numpy_helper.to_array(_scalar_tensor("v", value, elem)))


def _ref(name: str, kind: int) -> AttributeProto:
    return helper.make_attribute_ref(name, kind)


def _typed(fn: onnx.FunctionProto, elem: int) -> onnx.FunctionProto:
    fn.doc_string = _TYPED + TensorProto.DataType.Name(elem)
    return fn


def fused_conv_function(activation: str, opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """The body of ``FusedConv<activation>(X, W, B)``: Conv, then the activation. Relu6's Clip
    bounds are constants of type ``elem`` (the Conv's), so that body is for that type only."""
    op, extra, _ = FUSED_CONV[activation]
    conv = helper.make_node("Conv", ["X", "W", "B"], ["c"])
    conv.attribute.extend(_ref(a, k) for a, k in CONV_ATTRS.items())
    if activation == "Relu":
        body = [helper.make_node("Relu", ["c"], ["Y"])]
    elif activation == "Relu6":
        body = [_const("lo", 0.0, elem), _const("hi", 6.0, elem), helper.make_node("Clip", ["c", "lo", "hi"], ["Y"])]
    elif activation == "LeakyRelu":
        leaky = helper.make_node("LeakyRelu", ["c"], ["Y"])
        leaky.attribute.append(_ref("alpha", AttributeProto.FLOAT))
        body = [leaky]
    elif activation == "HardSwish":
        body = [helper.make_node("HardSwish", ["c"], ["Y"])]
    else:  # SiLU: x * sigmoid(x)
        body = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["Y"])]
    fn = helper.make_function(DOMAIN, op, ["X", "W", "B"], ["Y"], [conv] + body, [helper.make_opsetid("", opset)],
                              attributes=list(CONV_ATTRS) + list(extra))
    return _typed(fn, elem) if activation == "Relu6" else fn


def _const(name: str, value: float, elem: int) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=_scalar_tensor(name, value, elem))


def gelu_function(opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """``Gelu(X) = X * 0.5 * (1 + erf(X / sqrt(2)))`` for opsets without the Gelu op (< 20),
    its constants of type ``elem``."""
    body = [_const("sqrt2", 2.0 ** 0.5, elem), _const("one", 1.0, elem), _const("half", 0.5, elem),
            helper.make_node("Div", ["X", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["X", "a"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["Y"])]
    return _typed(helper.make_function(DOMAIN, "Gelu", ["X"], ["Y"], body, [helper.make_opsetid("", opset)]), elem)


def layer_norm_function(opset: int, elem: int = TensorProto.FLOAT) -> onnx.FunctionProto:
    """``LayerNorm(X, scale, bias)`` over the last axis, attribute ``epsilon`` (a float, cast to
    ``elem`` in the body), for opsets < 17."""
    eps_f = helper.make_node("Constant", [], ["eps" if elem == TensorProto.FLOAT else "eps_f"])
    eps_f.attribute.append(helper.make_attribute_ref("value_float", AttributeProto.FLOAT))
    eps_f.attribute[0].ref_attr_name = "epsilon"
    eps_f.attribute[0].name = "value_float"
    eps = [eps_f] if elem == TensorProto.FLOAT else [eps_f, helper.make_node("Cast", ["eps_f"], ["eps"], to=elem)]
    mean = helper.make_node("ReduceMean", ["X"], ["mu"], axes=[-1]) if opset < 18 else None
    if opset >= 18:
        body_axes = [helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", onnx.TensorProto.INT64, [1], [-1]))]
        mean = helper.make_node("ReduceMean", ["X", "ax"], ["mu"])
        var = helper.make_node("ReduceMean", ["sq", "ax"], ["var"])
    else:
        body_axes = []
        var = helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1])
    body = body_axes + eps + [_const("two", 2.0, elem), mean, helper.make_node("Sub", ["X", "mu"], ["d"]),
                        helper.make_node("Pow", ["d", "two"], ["sq"]), var, helper.make_node("Add", ["var", "eps"], ["ve"]),
                        helper.make_node("Sqrt", ["ve"], ["sd"]), helper.make_node("Div", ["d", "sd"], ["n"]),
                        helper.make_node("Mul", ["n", "Scale"], ["ns"]), helper.make_node("Add", ["ns", "B"], ["Y"])]
    return _typed(helper.make_function(DOMAIN, "LayerNorm", ["X", "Scale", "B"], ["Y"], body,
                                       [helper.make_opsetid("", opset)], attributes=["epsilon"]), elem)


def _drop_device_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the ``graphpass.ascend`` opset import and functions (nothing calls them any more)."""
    keep = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    rest = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(rest)
    return model


def transdata_function(opset: int) -> onnx.FunctionProto:
    """``TransData(X)`` with attributes ``src_format``/``dst_format``: a change of storage format,
    so on the logical value it is Identity."""
    return helper.make_function(DOMAIN, "TransData", ["X"], ["Y"], [helper.make_node("Identity", ["X"], ["Y"])],
                                [helper.make_opsetid("", opset)], attributes=["src_format", "dst_format"])


def is_transdata(node: gs.Node) -> bool:
    return node.op == "TransData" and node.domain == DOMAIN


def function_type_conflict(graph: gs.Graph, name: str, elem: int) -> str | None:
    """Why ``graph`` cannot call its device op ``name`` on a tensor of type ``elem``: the model
    already holds that op's body typed for another type (one body per op and model). None if
    it can (no body yet, one for ``elem``, or a polymorphic op)."""
    for f in graph.functions:
        if f.domain == DOMAIN and f.name == name and name in _TYPED_OPS:
            doc = f.doc_string or ""
            # a body without the mark was written before bodies were typed: its constants are float
            have = doc[len(_TYPED):] if doc.startswith(_TYPED) else TensorProto.DataType.Name(TensorProto.FLOAT)
            if have != TensorProto.DataType.Name(elem):
                return (f"this model's {name} body is typed for {have}; a {TensorProto.DataType.Name(elem)} "
                        "call cannot share it")
    return None


def ensure_function(graph: gs.Graph, proto: onnx.FunctionProto) -> None:
    """Add the function ``proto`` to ``graph`` unless one with its domain and name is there
    (callers check :func:`function_type_conflict` first)."""
    if any(f.domain == proto.domain and f.name == proto.name for f in graph.functions):
        return
    fn = OnnxImporter.import_function(proto, model_opset=graph.opset, model_import_domains=graph.import_domains)
    graph.functions = list(graph.functions) + [fn]


def _rename_inputs(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename what nodes (of ``graph`` and every body in it) read, and the bodies' outputs."""
    for g in graph_protos(graph):
        for n in g.node:
            for i, name in enumerate(n.input):
                if name in mapping:
                    n.input[i] = mapping[name]
        if g is not graph:
            for o in g.output:
                if o.name in mapping:
                    o.name = mapping[o.name]


def _bypass_transdata(model: onnx.ModelProto) -> None:
    """Drop TransData calls from the top graph: on the logical value they are Identity, and the
    storage formats stay as tensor annotations. A TransData that writes a graph output stays
    (it inlines to an Identity, so the output keeps its name)."""
    g = model.graph
    outputs = {o.name for o in g.output}
    mapping: dict[str, str] = {}
    keep = []
    for n in g.node:
        if n.domain == DOMAIN and n.op_type == "TransData" and len(n.input) == 1 and n.output[0] not in outputs:
            src = n.input[0]
            mapping[n.output[0]] = mapping.get(src, src)
        else:
            keep.append(n)
    if not mapping:
        return
    del g.node[:]
    g.node.extend(keep)
    _rename_inputs(g, mapping)
    vis = [vi for vi in g.value_info if vi.name not in mapping]
    del g.value_info[:]
    g.value_info.extend(vis)


@contextlib.contextmanager
def transdata_bypassed(graph: gs.Graph):
    """For the portable export of ``graph`` (topologically sorted): for the block, the top
    graph's TransData calls that :func:`_bypass_transdata` would drop are out of ``graph.nodes``
    and their readers read the TransData's input; everything is put back after. The exporter
    then writes the ONNX :func:`_bypass_transdata` would have left, without writing each call,
    its output's value info and annotations first (a transformer of 10k nodes has ~3,700).

    Only for a graph without subgraphs whose every such call is plain (one named input, a
    variable produced by an earlier node or a graph input; one output, not a graph input): the
    tensors then appear to the exporter in the order they would have, so the bytes are the same
    (tests/ir/test_portable_transdata.py); otherwise nothing is done and the proto is bypassed
    after the export, as before. The readers' input lists are written directly (gs's list
    would move each reader to the end of its tensor's reader list, and back to the end again):
    the graph comes back exactly as it was. Yields whether it bypassed anything.
    """
    nodes = graph.nodes
    if not any(n.op == "TransData" and n.domain == DOMAIN for n in nodes) or any(has_subgraph(n) for n in nodes):
        yield False
        return
    outputs = {t.name for t in graph.outputs}
    known = {id(t) for t in graph.inputs}
    inputs = set(known)
    target: dict[int, gs.Tensor] = {}  # id of a dropped call's output -> the tensor its readers read
    dropped: set[int] = set()
    for n in nodes:
        if n.op == "TransData" and n.domain == DOMAIN and len(n.inputs) == 1 and len(n.outputs) == 1 \
                and n.outputs[0].name not in outputs:
            x, y = n.inputs[0], n.outputs[0]
            if not (isinstance(x, gs.Variable) and x.name and id(x) in known and y.name and id(y) not in inputs):
                yield False  # not plain: the proto path decides, as it always did
                return
            target[id(y)] = target.get(id(x), x)
            dropped.add(id(n))
        for t in n.outputs:
            known.add(id(t))
    if not dropped:
        yield False
        return
    # the opset imports the exporter adds for the domains nodes use (gs records them on the
    # graph): added now, with every call still there, as an export with them adds them (gs's
    # walk of every subgraph only when one is missing: there are no subgraphs here)
    have = graph.import_domains
    if have is None or {n.domain for n in nodes} - {d.domain for d in have} - {None}:
        from graphpass.ir.fast_export import _update_import_domains

        _update_import_domains(graph)  # (gs's own adds two new domains in its set's order)
    order = list(nodes)
    rewired: list[tuple[list, int, gs.Tensor]] = []
    set_item = list.__setitem__
    try:
        for n in order:
            if id(n) in dropped:
                continue
            ins = n.inputs
            for i, t in enumerate(ins):
                new = target.get(id(t))
                if new is not None:
                    rewired.append((ins, i, t))
                    set_item(ins, i, new)
        nodes[:] = [n for n in order if id(n) not in dropped]
        yield True
    finally:
        nodes[:] = order
        for ins, i, t in rewired:
            set_item(ins, i, t)


def to_portable(model: onnx.ModelProto) -> onnx.ModelProto:
    """Inline every ``graphpass.ascend`` op through its body (TransData is dropped where it can
    be: it is Identity on the value); keep the calls' annotations."""
    _bypass_transdata(model)
    graphs = list(graph_protos(model.graph))
    if _expand_attention(model, graphs):
        graphs = list(graph_protos(model.graph))  # node lists rebuilt: the bodies are new messages
    if not any(n.domain == DOMAIN for g in graphs for n in g.node):
        return _drop_device_domain(model)
    ids = [(f.domain, f.name) for f in model.functions if f.domain == DOMAIN]
    if not ids:
        return model
    fns = {f.name: f for f in model.functions if f.domain == DOMAIN}
    # per body node: whether it has an attribute reference (the call's attributes replace them)
    refs = {name: [any(a.ref_attr_name for a in b.attribute) for b in f.node] for name, f in fns.items()}
    plans = {name: _body_plan(f, refs[name]) for name, f in fns.items()}
    taken = {x for g in graphs for x in [*(i.name for i in g.initializer), *(i.name for i in g.input),
                                         *(o.name for o in g.output), *(o for n in g.node for o in n.output)] if x}
    # bodies before the graphs holding them: rebuilding a graph's node list copies its nodes
    # (their body attributes with them), so a body edited after its parent would be lost
    for g in reversed(graphs):
        if not any(n.domain == DOMAIN and n.op_type in fns for n in g.node):
            continue
        nodes: list[onnx.NodeProto] = []
        body_constants: list[int] = []  # positions of the Constant nodes the bodies brought
        for n in g.node:
            f = fns.get(n.op_type) if n.domain == DOMAIN else None
            if f is None:
                nodes.append(n)
                continue
            for b in _expand_call(n, f, taken, refs[f.name], plans[f.name]):
                if b.op_type == "Constant" and b.domain in ("", "ai.onnx"):
                    body_constants.append(len(nodes))
                nodes.append(b)
        del g.node[:]
        g.node.extend(nodes)
        if model.ir_version >= 4:  # before IR 4 an initializer must also be a graph input
            _constants_to_initializers(g, body_constants)
    return _drop_device_domain(model)


def _expand_call(call: onnx.NodeProto, fn: onnx.FunctionProto, taken: set[str],
                 refs: "list[bool] | None" = None, plan: "list[tuple] | None" = None) -> list[onnx.NodeProto]:
    """The nodes of ``fn``'s body for the call ``call``, in place of it (what onnx's inliner does,
    without copying the model: a big graph's portable export holds one copy). Formal inputs and
    outputs become the call's tensors, the body's own values get names of their own, attribute
    references take the call's values (an attribute the call does not set is left out), and
    each node the call's name (``call/j_Op``) and annotations. ``refs``: per body node, whether
    it has an attribute reference (a node without one keeps its attributes as they are).
    ``plan``: :func:`_body_plan` of ``fn`` and ``refs`` when the caller has it (made once per
    function, not per call).

    Each node is parsed from its serialized fields (the body node's own ones serialized once, in
    the plan): the same message as a copy of the body node with its inputs, outputs, name,
    attributes and annotations set (protobuf writes a message's fields in one order, however
    they were read), without a field set per call."""
    call_inputs = call.input
    fn_inputs = fn.input
    mapping = dict(zip(fn_inputs, call_inputs))
    if len(fn_inputs) > len(call_inputs):
        mapping.update({formal: "" for formal in fn_inputs[len(call_inputs):]})  # an optional input left out
    call_outputs = call.output
    mapping.update(zip(fn.output, call_outputs))
    base = call_outputs[0] if call_outputs and call_outputs[0] else (call.name or fn.name)
    prefix = call.name or base
    meta = b"".join([_record(_META_FIELD, e.SerializeToString()) for e in call.metadata_props])
    if plan is None:
        plan = _body_plan(fn, refs)
    attrs = None

    def rename(v: str) -> bytes:
        if not v:
            return b""
        new = mapping.get(v)
        if new is None:
            k, new = 0, f"{base}__{fn.name}_{v}"
            while new in taken:
                k += 1
                new = f"{base}__{fn.name}_{v}_{k}"
            taken.add(new)
            mapping[v] = new
        return new.encode("utf-8")

    out = []
    parse = onnx.NodeProto.FromString
    for ins, outs, suffix, own, attr_plan in plan:
        parts = [_record(_INPUT_FIELD, rename(v)) for v in ins]
        parts += [_record(_OUTPUT_FIELD, rename(v)) for v in outs]
        parts.append(_record(_NAME_FIELD, (prefix + suffix).encode("utf-8")))
        parts.append(own)
        if attr_plan is not None:  # the attributes in their order, references taking the call's values
            if attrs is None:
                attrs = {a.name: a for a in call.attribute}
            for written, ref, name in attr_plan:
                if written is not None:
                    parts.append(written)
                    continue
                given = attrs.get(ref)
                if given is None:
                    continue
                a2 = onnx.AttributeProto()
                a2.CopyFrom(given)
                a2.name = name
                parts.append(_record(_ATTRIBUTE_FIELD, a2.SerializeToString()))
        parts.append(meta)
        out.append(parse(b"".join(parts)))
    return out


# NodeProto's field numbers (onnx.proto) of what _expand_call writes per call
_INPUT_FIELD, _OUTPUT_FIELD, _NAME_FIELD, _ATTRIBUTE_FIELD, _META_FIELD = 1, 2, 3, 5, 9


def _record(field: int, data: bytes) -> bytes:
    """A length-delimited field's record: its key, the length (a varint), the bytes."""
    n = len(data)
    if n < 0x80:
        return bytes((field << 3 | 2, n)) + data
    head = bytearray((field << 3 | 2,))
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + data


def _body_plan(fn: onnx.FunctionProto, refs: "list[bool] | None" = None) -> list[tuple]:
    """Per body node of ``fn``: its inputs, outputs, its name's suffix (``/j_Op``), the record of
    the fields a call keeps as they are (the node without inputs, outputs, name and annotations;
    without attributes too where they are written per call), and, for a node with an attribute
    reference (``refs``; every node without it), its attributes in order: ``(record, None,
    None)`` for one kept as it is, ``(None, referenced name, name)`` for a reference."""
    plan = []
    for j, b in enumerate(fn.node):
        own = onnx.NodeProto()
        own.CopyFrom(b)
        own.ClearField("input")
        own.ClearField("output")
        own.ClearField("name")
        own.ClearField("metadata_props")
        attr_plan = None
        if refs is None or refs[j]:
            own.ClearField("attribute")
            attr_plan = [(None, a.ref_attr_name, a.name) if a.ref_attr_name
                         else (_record(_ATTRIBUTE_FIELD, a.SerializeToString()), None, None) for a in b.attribute]
        plan.append((list(b.input), list(b.output), f"/{j}_{b.op_type}", own.SerializeToString(), attr_plan))
    return plan


def _expand_attention(model: onnx.ModelProto, graphs: "list[onnx.GraphProto] | None" = None) -> bool:
    """Each attention call as the plain ops it stands for (device_ops_attention.expand: the
    export's decomposition, not the generic body with its identity slots), in place.
    ``graphs``: ``list(graph_protos(model.graph))`` when the caller has it. Returns whether a
    call was found (node lists were rebuilt)."""
    from graphpass.ir import device_ops_attention as att

    unread: set[str] = set()  # the -0.0 "no mask" constants the expansions do not read
    if graphs is None:
        graphs = list(graph_protos(model.graph))
    ops = set(att.OPS.values())
    # bodies first: rebuilding a parent's node list copies its bodies
    holding = [g for g in reversed(graphs) if any(n.domain == DOMAIN and n.op_type in ops for n in g.node)]
    if not holding:
        return False  # no attention: the model's names are not collected (a 100k-node export: ~0.2 s)
    taken = {x for g in graphs for x in [*(i.name for i in g.initializer), *(i.name for i in g.input),
                                         *(o for n in g.node for o in n.output), *(n.name for n in g.node)] if x}
    for g in holding:
        nodes = []
        for n in g.node:
            if n.domain == DOMAIN and n.op_type in att.OPS.values() and any(a.name == "input_type" for a in n.attribute):
                new = att.expand(n, g, taken)
                for x in new:
                    x.metadata_props.extend(n.metadata_props)
                nodes.extend(new)
                if len(n.input) > 3 and not any(n.input[3] in x.input for x in new):
                    unread.add(n.input[3])
            else:
                nodes.append(n)
        del g.node[:]
        g.node.extend(nodes)
    if unread:
        read = {i for g in graphs for n in g.node for i in n.input} | {o.name for g in graphs for o in g.output}
        for g in graphs:
            keep = [t for t in g.initializer if t.name not in unread or t.name in read]
            if len(keep) != len(g.initializer):
                del g.initializer[:]
                g.initializer.extend(keep)
    return True


def _constants_to_initializers(g: onnx.GraphProto, positions: list[int]) -> None:
    """The Constant nodes the inlined bodies brought (at ``positions`` of ``g.node``) as
    initializers, one per distinct value (dtype, dims, bytes): a fused op's portable form adds
    no node a body's constant would add (a Gelu's 0.5, 1 and sqrt(2) per call). Same values, same
    order of evaluation: the model computes the same. A Constant that is a graph output, or not
    a plain ``value`` tensor, stays a node."""
    if not positions:
        return
    outputs = {o.name for o in g.output}
    taken = {i.name for i in g.initializer}
    by_value: dict[bytes, str] = {}
    rename: dict[str, str] = {}
    drop: set[int] = set()
    for i in positions:
        n = g.node[i]
        if len(n.attribute) != 1 or n.attribute[0].name != "value" or n.output[0] in outputs or n.output[0] in taken:
            continue
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        arr = onnx.numpy_helper.to_array(t)
        key = bytes([t.data_type]) + repr(tuple(t.dims)).encode() + arr.tobytes()
        drop.add(i)
        if key in by_value:
            rename[n.output[0]] = by_value[key]
            continue
        by_value[key] = n.output[0]
        t.name = n.output[0]
        t.ClearField("doc_string")
        g.initializer.append(t)
        taken.add(t.name)
    if not drop:
        return
    keep = [n for j, n in enumerate(g.node) if j not in drop]
    del g.node[:]
    g.node.extend(keep)
    if rename:
        _rename_inputs(g, rename)
        vis = [vi for vi in g.value_info if vi.name not in rename]
        del g.value_info[:]
        g.value_info.extend(vis)


#: Where :func:`free_reserved_domain` moves a model's own functions that use graphpass's domain.
MODEL_OWN_DOMAIN = DOMAIN + ".model"


def _bodies_graphpass_writes(name: str, opset: int) -> list[onnx.FunctionProto]:
    """Every body graphpass writes for device op ``name`` at ``opset`` (one per float type)."""
    makers = [lambda e, a=act: fused_conv_function(a, opset, e) for act, (op, _, _) in FUSED_CONV.items() if op == name]
    if name == "Gelu":
        makers.append(lambda e: gelu_function(opset, e))
    elif name == "LayerNorm":
        makers.append(lambda e: layer_norm_function(opset, e))
    elif name == "TransData":
        makers.append(lambda e: transdata_function(opset))
    from graphpass.ir import device_ops_attention, device_ops_tf  # the transformer ops (RmsNorm, Attention, ...)

    return ([make(e) for make in makers for e in FLOAT_TYPES] + device_ops_tf.bodies(name, opset, FLOAT_TYPES)
            + device_ops_attention.bodies(name, opset))


def _body_key(fn: onnx.FunctionProto) -> bytes:
    """A function as graphpass compares it: inputs, outputs, attributes and body (no doc string)."""
    key = onnx.FunctionProto()
    key.CopyFrom(fn)
    key.doc_string = ""
    key.ClearField("metadata_props")
    # value names are not semantics: each becomes its order of first appearance
    names: dict[str, str] = {}

    def canon(name: str) -> str:
        return names.setdefault(name, f"v{len(names)}") if name else name

    key.input[:] = [canon(x) for x in key.input]
    for n in key.node:
        n.doc_string = ""
        n.name = ""
        n.input[:] = [canon(x) for x in n.input]
        n.output[:] = [canon(x) for x in n.output]
    key.output[:] = [canon(x) for x in key.output]
    return key.SerializeToString(deterministic=True)


def is_graphpass_body(fn: onnx.FunctionProto) -> bool:
    """Whether ``fn`` (in the ``graphpass.ascend`` domain) is a body graphpass itself writes."""
    opset = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return False
    key = _body_key(fn)
    return any(_body_key(b) == key for b in _bodies_graphpass_writes(fn.name, opset))


def _node_lists(model: onnx.ModelProto):
    """The node lists of the main graph, every function body and every subgraph inside them."""
    tops = [model.graph] + [g for f in model.functions for n in f.node for a in n.attribute
                            for g in ([a.g] if a.HasField("g") else list(a.graphs))]
    yield from (f.node for f in model.functions)
    for top in tops:
        yield from (g.node for g in graph_protos(top))


def free_reserved_domain(model: onnx.ModelProto) -> list[str]:
    """Move the model's own functions that sit in ``graphpass.ascend`` with a body graphpass does
    not write to :data:`MODEL_OWN_DOMAIN` (their calls too, in every graph and function body), so
    that nothing graphpass does with its device ops (reusing a body, bypassing TransData,
    inlining) touches them; the model computes the same. Returns the moved names."""
    foreign = {f.name for f in model.functions if f.domain == DOMAIN and not is_graphpass_body(f)}
    # a node of the domain with a graph attribute is not one of graphpass's device ops either
    # (they never carry one; the IR's walks rely on it, graphpass.ir.graph._NO_SUBGRAPHS)
    _G = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for nodes in _node_lists(model):
        foreign.update(n.op_type for n in nodes if n.domain == DOMAIN and any(a.type in _G for a in n.attribute))
    if not foreign:
        return []
    version = next((o.version for o in model.opset_import if o.domain == DOMAIN), 1)
    for f in model.functions:
        if f.domain == DOMAIN and f.name in foreign:
            f.domain = MODEL_OWN_DOMAIN
    for nodes in _node_lists(model):
        for n in nodes:
            if n.domain == DOMAIN and n.op_type in foreign:
                n.domain = MODEL_OWN_DOMAIN
    for holder in [model] + list(model.functions):
        if not any(o.domain == MODEL_OWN_DOMAIN for o in holder.opset_import):
            holder.opset_import.append(helper.make_opsetid(MODEL_OWN_DOMAIN, version))
    log.warning("this model defines its own %s (another body than graphpass writes): moved to domain '%s'",
                ", ".join(f"{DOMAIN}::{n}" for n in sorted(foreign)), MODEL_OWN_DOMAIN)
    return sorted(foreign)
