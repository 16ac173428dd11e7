"""device_ops._expand_call parses each inlined node from records (the body node's own fields
serialized once per function): the same messages as the copy-and-set expansion it replaced,
written out here as the reference, on every function graphpass writes, with and without
annotations, attribute values, optional inputs, names taken, an empty call name, non-ASCII and
long names (a length over 127 takes a two-byte varint)."""

import itertools

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from graphpass.ir import device_ops


def _reference(call, fn, taken):
    """The expansion as it was written before (a copy of each body node, its fields set)."""
    mapping = dict(zip(fn.input, call.input))
    if len(fn.input) > len(call.input):
        mapping.update({formal: "" for formal in fn.input[len(call.input):]})
    mapping.update(zip(fn.output, call.output))
    base = call.output[0] if call.output and call.output[0] else (call.name or fn.name)
    attrs = {a.name: a for a in call.attribute}
    prefix = call.name or base

    def rename(v):
        if not v:
            return v
        if v not in mapping:
            k, new = 0, f"{base}__{fn.name}_{v}"
            while new in taken:
                k += 1
                new = f"{base}__{fn.name}_{v}_{k}"
            taken.add(new)
            mapping[v] = new
        return mapping[v]

    out = []
    for j, b in enumerate(fn.node):
        n = onnx.NodeProto()
        n.CopyFrom(b)
        n.input[:] = [rename(v) for v in b.input]
        n.output[:] = [rename(v) for v in b.output]
        kept = []
        for a in n.attribute:
            if a.ref_attr_name:
                given = attrs.get(a.ref_attr_name)
                if given is None:
                    continue
                a2 = onnx.AttributeProto()
                a2.CopyFrom(given)
                a2.name = a.name
                kept.append(a2)
            else:
                kept.append(a)
        del n.attribute[:]
        n.attribute.extend(kept)
        n.name = f"{prefix}/{j}_{b.op_type}"
        del n.metadata_props[:]
        n.metadata_props.extend(call.metadata_props)
        out.append(n)
    return out


def _functions():
    fns = [device_ops.fused_conv_function(a, 17) for a in sorted(device_ops.FUSED_CONV)]
    fns += [device_ops.gelu_function(17), device_ops.layer_norm_function(17), device_ops.transdata_function(17),
            device_ops.fused_conv_function(sorted(device_ops.FUSED_CONV)[0], 17, T.FLOAT16)]
    return fns


@pytest.mark.parametrize("fn", _functions(), ids=lambda f: f.name)
@pytest.mark.parametrize("annotated, attributes, name, dropped_input",
                         list(itertools.product([False, True], [False, True], ["conv1", "", "ü" * 70], [False, True])))
def test_the_messages_of_the_copy_and_set_expansion(fn, annotated, attributes, name, dropped_input):
    inputs = [f"in{k}" for k in range(len(fn.input))]
    if dropped_input and len(inputs) > 1:
        inputs = inputs[:-1]  # an optional input left out: its formal reads ""
    out = "y" * 200 if name == "" else "y"
    call = h.make_node(fn.name, inputs, [out], name=name, domain=device_ops.DOMAIN)
    if attributes:
        call.attribute.extend([h.make_attribute("pads", [1, 1, 1, 1]), h.make_attribute("group", 1),
                               h.make_attribute("alpha", 0.1), h.make_attribute("epsilon", 1e-5),
                               h.make_attribute("src_format", "NCHW")])
    if annotated:
        call.metadata_props.add(key="graphpass.engine", value="AI_CORE")
        call.metadata_props.add(key="graphpass.fused_from", value='["a", "ü"]' * 40)
    refs = [any(a.ref_attr_name for a in b.attribute) for b in fn.node]
    # names the inlined values would take are already taken: the suffixes _1, _2 are tried
    body_values = [v for b in fn.node for v in b.output if v not in fn.output]
    taken = {out, *inputs} | {f"{out}__{fn.name}_{v}" for v in body_values}
    taken |= {f"{out}__{fn.name}_{v}_1" for v in body_values[:1]}
    ours_taken, theirs_taken = set(taken), set(taken)
    ours = device_ops._expand_call(call, fn, ours_taken, refs)
    theirs = _reference(call, fn, theirs_taken)
    assert [n.SerializeToString() for n in ours] == [n.SerializeToString() for n in theirs]
    assert ours == theirs and ours_taken == theirs_taken
    # the plan made once serves every call
    plan = device_ops._body_plan(fn, refs)
    again = device_ops._expand_call(call, fn, set(taken), refs, plan)
    assert again == ours
    assert device_ops._expand_call(call, fn, set(taken)) == ours  # without refs: every node's attributes looked at


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 70_000])
def test_records_carry_the_length_as_protobuf_writes_it(n):
    node = onnx.NodeProto()
    node.name = "x" * n  # set, even empty: written
    assert device_ops._record(3, b"x" * n) == node.SerializeToString()
