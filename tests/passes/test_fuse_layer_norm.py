import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.passes import fuse_layer_norm
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(5)


def _ln_model(opset, affine=True, axis=-1):
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    if opset >= 18:
        inits["axes"] = np.array([axis], np.int64)
        mean = helper.make_node("ReduceMean", ["x", "axes"], ["mu"])
        var = helper.make_node("ReduceMean", ["sq", "axes"], ["var"])
    else:
        mean = helper.make_node("ReduceMean", ["x"], ["mu"], axes=[axis])
        var = helper.make_node("ReduceMean", ["sq"], ["var"], axes=[axis])
    nodes = [mean, helper.make_node("Sub", ["x", "mu"], ["d"]), helper.make_node("Pow", ["d", "two"], ["sq"]), var,
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n" if affine else "y"])]
    if affine:
        inits["gamma"] = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
        inits["beta"] = RNG.standard_normal(8).astype(np.float32)
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["ns"]), helper.make_node("Add", ["ns", "beta"], ["y"])]
    return make_model(nodes, {"x": [2, 5, 8]}, {"y": [2, 5, 8]}, initializers=inits, opset=opset)


@pytest.mark.parametrize("opset, op, domain", [(13, "LayerNorm", "graphpass.ascend"), (17, "LayerNormalization", ""),
                                               (18, "LayerNormalization", "")])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_subgraph_becomes_one_op(opset, op, domain, affine, tmp_path):
    model = _ln_model(opset, affine)
    graph = gp.load(model).graph
    assert fuse_layer_norm(graph).stats["fired"] == 1
    assert ops(graph) == [op] and (graph.nodes[0].domain or "") == domain
    assert graph.nodes[0].attrs["epsilon"] == pytest.approx(1e-5)
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-4, atol=1e-5)
    gp.save(graph, tmp_path / "p.onnx")
    assert_equivalent(model, onnx.load(tmp_path / "p.onnx"), rtol=1e-4, atol=1e-5)


def test_normalizing_another_axis_is_not_fused():
    graph = gp.load(_ln_model(13, axis=1)).graph
    assert not fuse_layer_norm(graph).modified


def _set(model, name, value):
    for t in model.graph.initializer:
        if t.name == name:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value, np.float32), name))
    return model


def test_epsilon_is_taken_from_the_graph_exactly():
    graph = gp.load(_ln_model(17)).graph
    fuse_layer_norm(graph)
    assert graph.nodes[0].attrs["epsilon"] == float(np.float32(1e-5))


def test_near_miss_exponent_is_not_layer_norm():
    for two in (2.0001, np.nextafter(np.float32(2), np.float32(3))):
        assert not fuse_layer_norm(gp.load(_set(_ln_model(17), "two", two)).graph).modified


@pytest.mark.parametrize("name, shape, left", [("gamma", (1, 8), []), ("beta", (1, 1, 8), []), ("gamma", (), []),
                                               ("gamma", (5, 8), ["Add", "Mul"]), ("beta", (1, 1, 1, 8), ["Add"])])
def test_scale_and_bias_must_broadcast_along_the_last_axis_only(name, shape, left):
    model = _set(_ln_model(17), name, RNG.uniform(0.5, 1.5, shape))
    if len(shape) == 4:  # a rank-4 bias makes the output 4-D
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 5, 8]))
    graph = gp.load(model).graph
    assert fuse_layer_norm(graph).modified
    if not left:
        assert ops(graph) == ["LayerNormalization"]
        assert list(graph.nodes[0].inputs[1].shape) == [8] and list(graph.nodes[0].inputs[2].shape) == [8]
    else:  # the normalization fuses without the operand that does not fit, which stays as it was
        assert sorted(ops(graph)) == sorted(left + ["LayerNormalization"])
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-4, atol=1e-5)


def test_a_runtime_gamma_is_not_folded_into_the_layer_norm():
    # gamma is a graph input: the normalization may fuse, the runtime Mul/Add stays outside
    model = _ln_model(17)
    init = next(t for t in model.graph.initializer if t.name == "gamma")
    model.graph.initializer.remove(init)
    model.graph.input.append(helper.make_tensor_value_info("gamma", onnx.TensorProto.FLOAT, [8]))
    graph = gp.load(model).graph
    fuse_layer_norm(graph)
    assert "Mul" in ops(graph)
    feeds = {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32), "gamma": RNG.uniform(0.5, 1.5, 8).astype(np.float32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, rtol=1e-4, atol=1e-5)


def test_a_one_element_gamma_is_folded_as_a_vector():
    model = _set(_ln_model(17), "gamma", np.array([1.25], np.float32))
    graph = gp.load(model).graph
    assert fuse_layer_norm(graph).stats["fired"] == 1 and ops(graph) == ["LayerNormalization"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].values, np.full(8, 1.25, np.float32))
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-4, atol=1e-5)


def _node(model, output):
    return next(n for n in model.graph.node if output in n.output)


def _keepdims_0(model):  # mu of [8, 8] broadcasts against x [8, 8, 8] along the wrong axes
    _node(model, "mu").attribute.append(helper.make_attribute("keepdims", 0))
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 8, 8]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 8, 8]))
    return model


def _no_axes(model):  # opset 18 without axes: a mean over every axis
    for out in ("mu", "var"):
        del _node(model, out).input[1:]
    return model


def _var_on_axis_1(model):
    _node(model, "var").attribute[0].ints[:] = [1]
    return model


def _read_elsewhere(name):
    def edit(model):
        model.graph.node.append(helper.make_node("Neg", [name], [f"{name}_neg"]))
        model.graph.output.append(helper.make_tensor_value_info(f"{name}_neg", onnx.TensorProto.FLOAT, None))
        return model
    return edit


def _divide_by_two(model):  # (x - mean) / 2: no Sqrt
    _node(model, "y" if not any(n.output[0] == "n" for n in model.graph.node) else "n").input[1] = "two"
    return model


def _runtime_eps(model):
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "eps"))
    model.graph.input.append(helper.make_tensor_value_info("eps", onnx.TensorProto.FLOAT, []))
    return model


def _pow_broadcasting(model):  # an exponent of rank 4 makes the square 4-D
    _set(model, "two", np.full((1, 1, 1, 1), 2.0, np.float32))
    return model


def _unknown_shape(model):
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["a", "b", 8]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("opset, edit", [
    (17, _keepdims_0), (18, _no_axes), (17, _var_on_axis_1), (17, _read_elsewhere("sd")), (17, _read_elsewhere("ve")),
    (17, _read_elsewhere("var")), (17, _read_elsewhere("mu")), (17, _read_elsewhere("sq")), (17, _divide_by_two),
    (17, _runtime_eps), (17, _pow_broadcasting), (17, _unknown_shape)],
    ids=["keepdims0", "no-axes", "var-axis-1", "sd-shared", "ve-shared", "var-shared", "mu-shared", "sq-shared",
         "no-sqrt", "runtime-eps", "pow-broadcasts", "unknown-shape"])
def test_near_misses_of_the_layer_norm_shape_are_not_fused(opset, edit):
    model = edit(_ln_model(opset))
    graph = gp.load(model).graph
    assert not fuse_layer_norm(graph).modified and "LayerNormalization" not in ops(graph)


def test_a_scale_and_shift_without_a_normalization_is_not_matched():
    model = make_model([helper.make_node("Mul", ["x", "g"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                       {"x": [2, 8]}, {"y": [2, 8]},
                       initializers={"g": np.ones(8, np.float32), "b": np.zeros(8, np.float32)})
    graph = gp.load(model).graph
    assert not fuse_layer_norm(graph).modified and ops(graph) == ["Mul", "Add"]


def test_variance_as_d_times_d_is_fused():
    """issue 26: exporters also write (x - mu) ** 2 as Mul(d, d); fuse_layer_norm took only Pow."""
    model = _ln_model(18)
    for n in model.graph.node:
        if n.op_type == "Pow":
            n.op_type = "Mul"
            n.input[1] = n.input[0]
    graph = gp.load(model).graph
    assert fuse_layer_norm(graph).stats["fired"] == 1
    assert ops(graph) == ["LayerNormalization"]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-4, atol=1e-5)


def test_d_times_another_tensor_is_no_variance():
    model = _ln_model(18)
    for n in model.graph.node:
        if n.op_type == "Pow":
            n.op_type = "Mul"
            n.input[1] = "x"  # (x - mu) * x: not a variance
    graph = gp.load(model).graph
    assert not fuse_layer_norm(graph).modified
