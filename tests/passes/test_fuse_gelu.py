import math

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.passes import fuse_gelu
from graphpass.testing import assert_equivalent, make_model, ops


def _gelu_model(opset, half_first=False, mul_form=False):
    inits = {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    if mul_form:
        inits["k"] = np.array(1 / math.sqrt(2), np.float32)
        scale = helper.make_node("Mul", ["x", "k"], ["d"])
    else:
        inits["k"] = np.array(math.sqrt(2), np.float32)
        scale = helper.make_node("Div", ["x", "k"], ["d"])
    nodes = [scale, helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"])]
    if half_first:
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["a", "h"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    return make_model(nodes, {"x": [2, 16]}, {"y": [2, 16]}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset, domain", [(13, "graphpass.ascend"), (20, "")])
@pytest.mark.parametrize("half_first, mul_form", [(False, False), (True, False), (False, True)])
def test_gelu_subgraph_becomes_one_op(opset, domain, half_first, mul_form, tmp_path):
    model = _gelu_model(opset, half_first, mul_form)
    graph = gp.load(model).graph
    assert fuse_gelu(graph).stats["fired"] == 1
    assert ops(graph) == ["Gelu"] and (graph.nodes[0].domain or "") == domain
    assert graph.nodes[0].outputs[0].name == "y"
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-6)
    gp.save(graph, tmp_path / "p.onnx")
    assert_equivalent(model, onnx.load(tmp_path / "p.onnx"), rtol=1e-5, atol=1e-6)


def test_intermediate_read_elsewhere_blocks_the_fusion():
    model = _gelu_model(13)
    model.graph.output.append(helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2, 16]))
    graph = gp.load(model).graph
    assert not fuse_gelu(graph).modified


def _with(model, name, value, shape=()):
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(np.full(shape, value, np.float32), name))
    return model


@pytest.mark.parametrize("mul_form, name, value", [
    (False, "k", 1.4142),                                        # sqrt 2 to 5 digits: within the old 1e-4
    (False, "k", np.nextafter(np.float32(math.sqrt(2)), np.float32(2))),  # one ulp off
    (True, "k", np.nextafter(np.float32(1 / math.sqrt(2)), np.float32(0))),
    (False, "half", 0.50001),
    (False, "one", 1.00001),
])
def test_near_miss_constants_are_not_gelu(mul_form, name, value):
    model = _with(_gelu_model(20, mul_form=mul_form), name, value)
    assert not fuse_gelu(gp.load(model).graph).modified


def test_constants_rounded_as_the_type_holds_them_match():
    # exporters write float32(sqrt 2) and float32(1/sqrt 2): exactly those match
    for mul_form, value in ((False, np.float32(math.sqrt(2))), (True, np.float32(1 / math.sqrt(2)))):
        model = _with(_gelu_model(20, mul_form=mul_form), "k", value)
        assert fuse_gelu(gp.load(model).graph).stats["fired"] == 1


def test_one_element_constant_of_higher_rank_is_not_gelu():
    # x [2,16] * 0.5 of shape [1,1,1] is [1,2,16]: Gelu(x) would drop a dimension
    model = _with(_gelu_model(20), "half", 0.5, (1, 1, 1))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 16]))
    assert not fuse_gelu(gp.load(model).graph).modified


def test_one_plus_erf_read_elsewhere_blocks_the_fusion():
    for half_first in (False, True):
        model = _gelu_model(20, half_first=half_first)
        model.graph.output.append(helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, 16]))
        graph = gp.load(model).graph
        assert not fuse_gelu(graph).modified and "Gelu" not in ops(graph)


def test_half_times_x_times_something_else_is_not_gelu():
    # (x * 0.5) * z, z no 1 + erf term; (x * 0.5) * (1 + erf(w / sqrt 2)) with w not x
    model = make_model([helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["z", "h"], ["y"])],
                       {"x": [2, 16], "z": [2, 16]}, {"y": [2, 16]}, initializers={"half": np.array(0.5, np.float32)})
    assert not fuse_gelu(gp.load(model).graph).modified
    for half_first in (False, True):
        model = _gelu_model(20, half_first=half_first)
        for n in model.graph.node:
            if n.op_type in ("Div", "Mul") and "k" in n.input:
                n.input[0] = "w"
        model.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2, 16]))
        graph = gp.load(model).graph
        assert not fuse_gelu(graph).modified and "Gelu" not in ops(graph)


def test_a_final_mul_of_another_domain_is_not_gelu():
    model = _gelu_model(20)
    model.graph.node[-1].domain = "custom"
    model.opset_import.append(helper.make_opsetid("custom", 1))
    graph = gp.load(model).graph
    assert not fuse_gelu(graph).modified and "Gelu" not in ops(graph)


# issue 26: the other exported spellings --------------------------------------------------

def _dynamo_order_model(opset):
    """x * (0.5 * (1 + erf(x / sqrt 2))): the torch.onnx dynamo exporter's order (ViT, BERT)."""
    inits = {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32),
             "k": np.array(math.sqrt(2), np.float32)}
    nodes = [helper.make_node("Div", ["x", "k"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["half", "a"], ["h"]),
             helper.make_node("Mul", ["x", "h"], ["y"])]
    return make_model(nodes, {"x": [2, 16]}, {"y": [2, 16]}, initializers=inits, opset=opset)


def _tanh_model(opset, cube="pow", half="x_first", k=0.044715):
    """GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    inits = {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32), "three": np.array(3.0, np.float32),
             "k": np.array(k, np.float32), "c": np.array(math.sqrt(2 / math.pi), np.float32)}
    nodes = [helper.make_node("Pow", ["x", "three"], ["x3"])] if cube == "pow" else [
        helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"])]
    nodes += [helper.make_node("Mul", ["x3", "k"], ["kx3"]), helper.make_node("Add", ["x", "kx3"], ["i"]),
              helper.make_node("Mul", ["c", "i"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
              helper.make_node("Add", ["t", "one"], ["a"])]
    if half == "x_first":
        nodes += [helper.make_node("Mul", ["x", "half"], ["xh"]), helper.make_node("Mul", ["xh", "a"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    return make_model(nodes, {"x": [2, 16]}, {"y": [2, 16]}, initializers=inits, opset=opset)


def _gelu_feeds():
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32) * 4
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40]
    return {"x": x}


@pytest.mark.parametrize("opset, domain", [(18, "graphpass.ascend"), (20, "")])
def test_dynamo_order_gelu_is_fused(opset, domain):
    model = _dynamo_order_model(opset)
    graph = gp.load(model).graph
    assert fuse_gelu(graph).stats["fired"] == 1
    assert ops(graph) == ["Gelu"] and (graph.nodes[0].domain or "") == domain
    assert_equivalent(model, gp.to_proto(graph), _gelu_feeds(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset, op, domain", [(18, "GeluTanh", "graphpass.ascend"), (20, "Gelu", "")])
@pytest.mark.parametrize("cube, half", [("pow", "x_first"), ("mul", "last")])
def test_tanh_gelu_is_fused(opset, op, domain, cube, half):
    model = _tanh_model(opset, cube, half)
    graph = gp.load(model).graph
    assert fuse_gelu(graph).stats["fired"] == 1
    assert ops(graph) == [op] and (graph.nodes[0].domain or "") == domain
    if opset >= 20:
        assert graph.nodes[0].attrs["approximate"] == "tanh"
    out = gp.to_proto(graph, emit="device")
    onnx.checker.check_model(out, full_check=True)
    assert_equivalent(model, gp.to_proto(graph), _gelu_feeds(), rtol=1e-5, atol=1e-6)


def test_tanh_gelu_with_a_near_miss_constant_is_not_fused():
    graph = gp.load(_tanh_model(18, k=0.0447)).graph
    assert not fuse_gelu(graph).modified


def test_the_portable_form_adds_no_node_for_a_bodys_constants():
    """A fused op inlined back (emit='portable') brings its body's constants as initializers, one
    per value, not as Constant nodes: two fused GELUs of an opset-13 model do not leave more nodes
    than the model had (bert.dynamo grew 128 -> 129 before)."""
    first = _gelu_model(13)
    second = [helper.make_node(n.op_type, [i.replace("x", "y") if i == "x" else i + "2" if i in "dea" or i == "m" else i
                                           for i in n.input], [o + "2" if o != "y" else "z" for o in n.output])
              for n in first.graph.node]
    model = make_model(list(first.graph.node) + second, {"x": [2, 16]}, {"z": [2, 16]},
                       initializers={i.name: onnx.numpy_helper.to_array(i) for i in first.graph.initializer}, opset=13)
    graph = gp.load(model).graph
    assert fuse_gelu(graph).stats["fired"] == 2
    portable = gp.to_proto(graph)
    onnx.checker.check_model(portable, full_check=True)
    kinds = [n.op_type for n in portable.graph.node]
    assert "Constant" not in kinds and len(kinds) <= len(model.graph.node)
    values = [onnx.numpy_helper.to_array(i).tobytes() + bytes([i.data_type]) for i in portable.graph.initializer]
    assert len(values) == len(set(values))  # one initializer per value
    assert_equivalent(model, portable, rtol=0, atol=0)  # the body's ops, the same constants: bitwise
