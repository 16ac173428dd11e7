"""validate's one-walk check (validate._looks_valid) against the checks as written (_check_all).

_looks_valid decides nothing itself: True must mean every check passes (else a model the checks
refuse would load), and every model it does not follow goes to the checks, which raise the first
problem with its message. Held on the exporter corpus and onnx's test models (valid: True, so the
fast path is the one that runs), on thousands of mutated protobufs, and on hand-made faults."""

from __future__ import annotations

import glob
import os
import random

import onnx
import pytest
from onnx import TensorProto, helper

from graphpass.errors import BadModelError
from graphpass.fuzzing import mutate_bytes
from graphpass.ir import validate as V
from _files import ALL_ONNX_DATA, ONNX_DATA, loaded  # noqa: E402 - tests/ir/_files.py

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "..", "data")


def _default(model: onnx.ModelProto):
    opsets = {o.domain or "": o.version for o in model.opset_import}
    return opsets.get("", opsets.get("ai.onnx"))


def _slow_ok(model: onnx.ModelProto) -> bool:
    try:
        V._check_all(model, "m", _default(model))
    except BadModelError:
        return False
    return True


def _models():
    return loaded(sorted(glob.glob(os.path.join(DATA, "exporters", "*.onnx"))) + ALL_ONNX_DATA)


def test_valid_models_take_the_one_walk():
    seen = agree = 0
    for path, m in _models():
        slow = _slow_ok(m)
        fast = V._looks_valid(m, _default(m))
        assert not (fast and not slow), path
        seen += 1
        agree += fast == slow
    assert seen > 150
    assert agree == seen  # no valid model of the corpora falls back to the slow checks


def _mutants(n: int):
    light = str(ONNX_DATA / "light")
    seeds = [open(os.path.join(light, f), "rb").read() for f in ("light_squeezenet.onnx", "light_bvlc_alexnet.onnx")]
    seeds += [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(DATA, "exporters", "*.torchscript.onnx")))[:4]]
    rng = random.Random(7)
    for _ in range(n):
        data = rng.choice(seeds)
        kind = rng.choice(["bitflip", "bitflip", "overwrite"])
        yield mutate_bytes(data, kind, rng)


def test_mutated_models_never_pass_the_one_walk_alone():
    parsed = refused = 0
    for data in _mutants(3000):
        m = onnx.ModelProto()
        try:
            m.ParseFromString(data)
        except Exception:  # noqa: BLE001 - not a protobuf any more
            continue
        parsed += 1
        slow = _slow_ok(m)
        refused += not slow
        assert not (V._looks_valid(m, _default(m)) and not slow)
    assert parsed > 1000 and refused > 100


def _raw(name, dims, data: bytes) -> onnx.TensorProto:
    return onnx.TensorProto(name=name, dims=dims, data_type=TensorProto.FLOAT, raw_data=data)


def _model(nodes, inputs=None, outputs=None, inits=(), vis=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                          initializer=list(inits), value_info=list(vis))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _faults():
    relu = helper.make_node("Relu", ["x"], ["y"], name="r")
    yield "undefined input", _model([helper.make_node("Relu", ["nope"], ["y"])])
    yield "produced twice", _model([relu, helper.make_node("Relu", ["x"], ["y"], name="r2")])
    yield "output produced by nothing", _model([helper.make_node("Relu", ["x"], ["z"])])
    yield "bad op type", _model([helper.make_node("Re lu", ["x"], ["y"])])
    yield "attribute type", _model([helper.make_node("Softmax", ["x"], ["y"], axis=1.5)])
    yield "constant values", _model([helper.make_node("Constant", [], ["y"])], inputs=[])
    yield "duplicate initializer", _model([relu], inits=[helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])] * 2)
    yield "short raw data", _model([relu], inits=[_raw("w", [4], b"\0" * 8)])
    yield "typed data count", _model([relu], inits=[onnx.TensorProto(name="w", dims=[3], data_type=TensorProto.FLOAT, float_data=[1.0, 2.0])])
    yield "dim out of range", _model([relu], vis=[helper.make_tensor_value_info("q", TensorProto.FLOAT, [2 ** 40])])
    yield "untyped input", _model([relu], inputs=[onnx.ValueInfoProto(name="x")])
    body = helper.make_graph([helper.make_node("Relu", ["missing"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    yield "body reads nothing", _model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                                       inputs=[cond])
    tensor_attr = helper.make_node("Constant", [], ["y"], value=_raw("v", [4], b"\0"))
    yield "constant tensor data", _model([tensor_attr], inputs=[])
    yield "no default opset", helper.make_model(helper.make_graph([relu], "g", [helper.make_tensor_value_info("x", 1, [2])],
                                                                  [helper.make_tensor_value_info("y", 1, [2])]),
                                                opset_imports=[helper.make_opsetid("custom", 1)])
    bad_name = _model([relu])
    bad_name.graph.node[0].ParseFromString(bad_name.graph.node[0].SerializeToString()
                                           .replace(b"\n\x01x", b"\n\x01\xff"))  # an input name of invalid UTF-8
    yield "name not text", bad_name


@pytest.mark.parametrize("case", [c for c, _ in _faults()])
def test_each_fault_is_left_to_the_checks(case):
    m = dict(_faults())[case]
    assert not _slow_ok(m), case
    assert not V._looks_valid(m, _default(m))
    with pytest.raises(BadModelError) as fast:
        V.validate(m, "m")
    with pytest.raises(BadModelError) as slow:
        V._check_all(m, "m", _default(m))
    assert str(fast.value) == str(slow.value)


def test_first_of_several_faults_is_the_checks_first():
    """A model with a fault of _check_content (a bad attribute type) before, in node order, one
    of _check_graph (an undefined input): the message names the structural one, as before."""
    m = _model([helper.make_node("Softmax", ["x"], ["t"], axis=1.5), helper.make_node("Relu", ["nope"], ["y"])])
    with pytest.raises(BadModelError, match="reads 'nope'"):
        V.validate(m, "m")


def test_the_graphs_validation_lists_are_graph_protos():
    """validated_graphs: the graphs of graph_protos, in its order (the loader hands them on to
    the sparse densifying and the import); None where the checks ran as written."""
    from graphpass.ir.graph import graph_protos

    nested = 0
    for path, m in _models():
        try:
            graphs = V.validated_graphs(m, "m")
        except BadModelError:
            continue
        expected = list(graph_protos(m.graph))
        assert graphs is not None, path
        assert len(graphs) == len(expected) and all(a is b or a == b for a, b in zip(graphs, expected)), path
        nested += len(graphs) > 1
    assert nested >= 2
    # bodies in bodies, two per node: depth first, each graph before its bodies
    def branch(name, inner=None):
        nodes = [helper.make_node("If", ["c"], [name + "_o"], then_branch=inner, else_branch=inner)] if inner else \
            [helper.make_node("Identity", ["x"], [name + "_o"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(name + "_o", TensorProto.FLOAT, [2])])
    deep = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch("a", branch("a1")),
                                    else_branch=branch("b", branch("b1")))],
                  inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                          helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
    graphs = V.validated_graphs(deep, "m")
    assert [g.name for g in graphs] == [g.name for g in graph_protos(deep.graph)] == \
        ["g", "b", "b1", "b1", "a", "a1", "a1"]  # make_node sorts attributes: else_branch first
    broken = _model([helper.make_node("Relu", ["nope"], ["y"])])
    with pytest.raises(BadModelError):
        V.validated_graphs(broken, "m")


def test_what_the_walk_saw_is_every_node_domain_and_attribute_type():
    """GraphList.node_domains / attr_types (what the loader skips walks on: a device-domain node,
    a TYPE_PROTO attribute) are those of every node of every graph graph_protos lists."""
    from graphpass.ir.graph import graph_protos

    seen = with_domains = 0
    for path, m in _models():
        try:
            graphs = V.validated_graphs(m, "m")
        except BadModelError:
            continue
        nodes = [n for g in graph_protos(m.graph) for n in g.node]
        assert isinstance(graphs, V.GraphList), path
        assert graphs.node_domains == {n.domain for n in nodes if n.domain not in ("", "ai.onnx")}, path
        assert graphs.attr_types == {a.type for n in nodes for a in n.attribute}, path
        seen += 1
        with_domains += bool(graphs.node_domains)
    assert seen > 150 and with_domains > 0


def test_a_type_attribute_in_a_body_is_kept_through_load_and_save():
    """The loader remembers TYPE_PROTO attributes (gs cannot hold them) only where validation's
    walk saw one: one inside an If body is seen and kept."""
    import graphpass as gp
    from graphpass.ir import serialize

    opt = helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    has = helper.make_node("OptionalHasElement", ["o"], ["h"])
    body = helper.make_graph([opt, has], "then", [], [helper.make_tensor_value_info("h", TensorProto.BOOL, [])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                   inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   outputs=[helper.make_tensor_value_info("y", TensorProto.BOOL, [])], opset=18)
    graphs = V.validated_graphs(model, "m")
    assert onnx.AttributeProto.TYPE_PROTO in graphs.attr_types
    m = gp.load(model.SerializeToString())
    inner = m.graph.nodes[0].attrs["then_branch"].nodes[0]
    assert [a.name for a in inner.__dict__[serialize._RAW_ATTRS_KEY]] == ["type"]
    back = gp.to_proto(m, emit="device")
    attr = back.graph.node[0].attribute
    assert [a.type for b in attr for n in b.g.node for a in n.attribute] == [onnx.AttributeProto.TYPE_PROTO] * 2
