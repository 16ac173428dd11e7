import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.cost_model import create
from graphpass.passes.framework import PassContext
from graphpass.ir import annotations as A
from graphpass.passes import fuse_conv_activation
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(3)


def _model(act_nodes, bias=True, opset=17, out="y"):
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1])] + act_nodes
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {out: [1, 4, 8, 8]}, initializers=inits, opset=opset)


CASES = {
    "Relu": ([helper.make_node("Relu", ["c"], ["y"])], "FusedConvRelu"),
    "Relu6": ([helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], "FusedConvRelu6"),
    "LeakyRelu": ([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)], "FusedConvLeakyRelu"),
    "HardSwish": ([helper.make_node("HardSwish", ["c"], ["y"])], "FusedConvHardSwish"),
    "SiLU": ([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], "FusedConvSiLU"),
}


@pytest.mark.parametrize("act", sorted(CASES))
def test_fuses_each_activation_and_runs_in_both_forms(act, tmp_path):
    nodes, op = CASES[act]
    model = _model(nodes, bias=act != "LeakyRelu")
    if act == "Relu6":
        model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                        onnx.numpy_helper.from_array(np.array(6, np.float32), "hi")])
    graph = gp.load(model).graph
    result = fuse_conv_activation(graph)
    assert result.stats["fired"] == 1
    fused = graph.nodes[-1]
    assert (fused.domain, fused.op) == ("graphpass.ascend", op) and ops(graph) == [op]
    assert list(fused.attrs["pads"]) == [1, 1, 1, 1] and fused.outputs[0].name == "y" and len(fused.inputs) == 3
    if act == "LeakyRelu":
        assert fused.attrs["alpha"] == pytest.approx(0.2)
    assert A.get(fused, A.PASS) == "fuse_conv_activation" and A.fused_from(fused)[0] == "conv"
    device = gp.to_proto(graph, emit="device")
    assert [f.name for f in device.functions] == [op]
    assert_equivalent(model, device, rtol=1e-5, atol=1e-6)
    gp.save(graph, tmp_path / "p.onnx")
    portable = onnx.load(tmp_path / "p.onnx")
    assert not portable.functions and all(n.domain in ("", "ai.onnx") for n in portable.graph.node)
    assert all(A.PASS in {p.key for p in n.metadata_props} for n in portable.graph.node)
    assert_equivalent(model, portable, rtol=1e-5, atol=1e-6)


def test_clip_that_is_not_relu6_is_refused_with_reason():
    model = _model([helper.make_node("Clip", ["c", "lo", "hi"], ["y"])])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                    onnx.numpy_helper.from_array(np.array(5, np.float32), "hi")])
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_activation(graph, ctx).modified
    assert "Clip(0.0, 5.0) is not Relu6" in ctx.explanations[0].reason


def test_conv_output_read_elsewhere_is_not_fused():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
                        helper.make_node("Neg", ["c"], ["z"])],
                       {"x": [1, 3, 8, 8]}, {"y": [1, 4, 6, 6], "z": [1, 4, 6, 6]},
                       initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model).graph
    assert not fuse_conv_activation(graph).modified


def test_fusion_lowers_the_estimate():
    """Lower where each node is its own kernel; not higher with ATC's own UB fusion, which fuses
    Conv + activation anyway (issue 21: the explicit form gains nothing on the device there)."""
    model = _model(CASES["Relu"][0])
    before = create().estimate(gp.load(model).graph, fusion=False).total_us
    before_ub = create().estimate(gp.load(model).graph).total_us
    graph = gp.load(model).graph
    fuse_conv_activation(graph)
    assert create().estimate(graph, fusion=False).total_us < before
    assert create().estimate(graph).total_us <= before_ub


def test_fusion_inside_a_loop_body_puts_the_function_on_the_model():
    from onnx import TensorProto

    body = helper.make_graph(
        [helper.make_node("Conv", ["acc_in", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 3, 6, 6])],
    )
    model = make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], {"x": [1, 3, 6, 6]}, {"y": [1, 3, 6, 6]},
                       initializers={"n": np.array(2, np.int64), "w": (RNG.standard_normal((3, 3, 3, 3)) * 0.3).astype(np.float32)})
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 1
    device = gp.to_proto(graph, emit="device")
    assert [f.name for f in device.functions] == ["FusedConvRelu"]
    assert_equivalent(model, device, rtol=1e-5, atol=1e-6)


def test_clip_from_negative_zero_is_not_relu6():
    # Clip(x, -0.0, 6) gives -0.0 for x < 0; the fused body's bound is +0.0
    model = _model(CASES["Relu6"][0])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(-0.0, np.float32), "lo"),
                                    onnx.numpy_helper.from_array(np.array(6, np.float32), "hi")])
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_activation(graph, ctx).modified
    assert "-0.0" in ctx.explanations[0].reason


def test_swish_without_a_conv_is_not_matched():
    # Relu -> Sigmoid -> Mul(Relu output, Sigmoid): the Swish shape, but no Conv to fuse into
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
                        helper.make_node("Mul", ["r", "s"], ["y"])], {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5]})
    graph = gp.load(model).graph
    assert not fuse_conv_activation(graph).modified
    assert ops(graph) == ["Relu", "Sigmoid", "Mul"]


def test_a_silu_whose_mul_is_of_another_domain_is_not_fused():
    model = _model([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"], domain="custom")])
    model.opset_import.append(helper.make_opsetid("custom", 1))
    graph = gp.load(model).graph
    assert not fuse_conv_activation(graph).modified and ops(graph) == ["Conv", "Sigmoid", "Mul"]


def test_a_weight_of_unknown_output_channels_is_not_fused():
    # no bias: the -0.0 bias needs the channel count (a graph-input weight of unknown dims)
    for w_shape in (None, ["o", 3, 3, 3]):
        model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                           {"x": [1, 3, 8, 8], "w": (onnx.TensorProto.FLOAT, w_shape)}, {"y": (onnx.TensorProto.FLOAT, None)})
        graph = gp.load(model).graph
        assert not fuse_conv_activation(graph).modified and ops(graph) == ["Conv", "Relu"], w_shape
        model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
                            helper.make_node("Mul", ["c", "s"], ["y"])],
                           {"x": [1, 3, 8, 8], "w": (onnx.TensorProto.FLOAT, w_shape)}, {"y": (onnx.TensorProto.FLOAT, None)})
        graph = gp.load(model).graph
        assert not fuse_conv_activation(graph).modified and ops(graph) == ["Conv", "Sigmoid", "Mul"], w_shape


def test_a_second_dtype_cannot_share_the_fused_body_of_the_first():
    # one FusedConvRelu6 body per model, typed (its Clip bounds) for one dtype
    F16 = onnx.TensorProto.FLOAT16
    nodes, inits = [], {}
    for suffix, dtype in (("32", np.float32), ("16", np.float16)):
        inits[f"w{suffix}"] = RNG.standard_normal((4, 3, 3, 3)).astype(dtype)
        inits[f"lo{suffix}"], inits[f"hi{suffix}"] = np.array(0, dtype), np.array(6, dtype)
        nodes += [helper.make_node("Conv", [f"x{suffix}", f"w{suffix}"], [f"c{suffix}"]),
                  helper.make_node("Clip", [f"c{suffix}", f"lo{suffix}", f"hi{suffix}"], [f"y{suffix}"])]
    model = make_model(nodes, {"x32": [1, 3, 8, 8], "x16": (F16, [1, 3, 8, 8])},
                       {"y32": [1, 4, 6, 6], "y16": (F16, [1, 4, 6, 6])}, initializers=inits)
    graph = gp.load(model).graph
    ctx = PassContext()
    assert fuse_conv_activation(graph, ctx).stats["fired"] == 1
    assert sorted(ops(graph)) == ["Clip", "Conv", "FusedConvRelu6"]
    assert any("body is typed for" in e.reason and "cannot share it" in e.reason for e in ctx.explanations)
    proto = gp.to_proto(graph)
    onnx.checker.check_model(proto, full_check=True)
    assert_equivalent(model, proto, exact=True)


def test_a_conv_without_bias_gets_one_negative_zero_per_output_channel():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                       {"x": [2, 3, 8, 8]}, {"y": [2, 4, 6, 6]},
                       initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 1
    bias = graph.nodes[0].inputs[2].values
    assert bias.shape == (4,) and np.all(bias == 0) and np.all(np.signbit(bias))
    assert_equivalent(model, gp.to_proto(graph, emit="device"), exact=True)


def _clip_model(clip_inputs, inits, opset=17, attrs=None):
    model = _model([helper.make_node("Clip", ["c", *clip_inputs], ["y"], **(attrs or {}))], opset=opset)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in inits.items())
    return model


def test_clip_bounds_that_are_not_both_constant_0_and_6_are_refused_with_reason():
    cases = [
        (_clip_model(["lo"], {"lo": 0}), "Clip(0.0, None) is not Relu6"),
        (_clip_model(["", "hi"], {"hi": 6}), "Clip(None, 6.0) is not Relu6"),
        (_clip_model([], {}), "Clip(None, None) is not Relu6"),
        (_clip_model([], {}, opset=10, attrs={"min": 0.0}), "opset 10 is below 11"),
    ]
    runtime = _clip_model(["lo", "hi"], {"hi": 6})
    runtime.graph.input.append(helper.make_tensor_value_info("lo", onnx.TensorProto.FLOAT, []))
    cases.append((runtime, "Clip bounds are not constants"))
    for model, reason in cases:
        graph = gp.load(model).graph
        ctx = PassContext()
        assert not fuse_conv_activation(graph, ctx).modified and ops(graph) == ["Conv", "Clip"], reason
        assert reason in ctx.explanations[0].reason, (reason, ctx.explanations[0].reason)


def test_clip_6_attributes_at_opset_10_are_refused_only_for_the_opset():
    model = _clip_model([], {}, opset=10, attrs={"min": 0.0, "max": 6.0})
    graph = gp.load(model).graph
    ctx = PassContext()
    assert not fuse_conv_activation(graph, ctx).modified
    assert ctx.explanations[0].reason == "the model's opset 10 is below 11, which the fused body needs"


def test_silu_with_the_sigmoid_first_fuses_and_a_shared_sigmoid_does_not():
    model = _model([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])])
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 1 and ops(graph) == ["FusedConvSiLU"]
    assert_equivalent(model, gp.to_proto(graph, emit="device"), rtol=1e-5, atol=1e-6)
    model = _model([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"]),
                    helper.make_node("Neg", ["s"], ["z"])])
    model.graph.output.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 4, 8, 8]))
    graph = gp.load(model).graph
    assert not fuse_conv_activation(graph).modified and sorted(ops(graph)) == ["Conv", "Mul", "Neg", "Sigmoid"]


def test_a_conv_of_no_known_type_is_refused_with_reason():
    # a graph built in memory with no dtype anywhere: there is no body type to write
    import onnx_graphsurgeon as gs

    x, w = gs.Variable("x", shape=[1, 3, 8, 8]), gs.Variable("w", shape=[4, 3, 3, 3])
    c, y = gs.Variable("c"), gs.Variable("y")
    graph = gs.Graph(nodes=[gs.Node("Conv", inputs=[x, w], outputs=[c]), gs.Node("Relu", inputs=[c], outputs=[y])],
                     inputs=[x, w], outputs=[y], opset=17)
    ctx = PassContext()
    assert not fuse_conv_activation(graph, ctx).modified and ops(graph) == ["Conv", "Relu"]
    assert ctx.explanations[0].reason == "Conv of dtype None (float types only)"


def test_a_conv_without_bias_on_an_input_of_symbolic_shape_is_fused():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                       {"x": ["n", 3, "h", "w"]}, {"y": ["n", 4, "h2", "w2"]},
                       initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 1
    assert graph.nodes[0].inputs[2].values.shape == (4,)
    feeds = {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    assert_equivalent(model, gp.to_proto(graph, emit="device"), feeds=feeds, exact=True)


def test_a_conv_without_bias_on_an_input_of_unknown_rank_is_fused():
    # the -0.0 bias is sized from the weight's output channels, never from the input's shape: here
    # the input is a Reshape to a runtime shape of runtime length (its rank is unknown)
    model = make_model([helper.make_node("Reshape", ["flat", "s"], ["x"]), helper.make_node("Conv", ["x", "w"], ["c"]),
                        helper.make_node("Relu", ["c"], ["y"])],
                       {"flat": [192], "s": (onnx.TensorProto.INT64, ["k"])}, {"y": ["n", 4, "h", "w"]},
                       initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)})
    graph = gp.load(model).graph
    assert graph.nodes[1].inputs[0].shape is None
    assert fuse_conv_activation(graph).stats["fired"] == 1
    bias = graph.nodes[1].inputs[2].values
    assert bias.shape == (4,) and np.all(bias == 0) and np.all(np.signbit(bias))
    feeds = {"flat": np.array([np.nan, -np.inf, -0.0, 1e-45] * 48, np.float32), "s": np.array([2, 3, 4, 8], np.int64)}
    assert_equivalent(model, gp.to_proto(graph, emit="device"), feeds=feeds, exact=True)


def test_bias_less_convs_each_get_their_own_negative_zero_bias_of_the_conv_type():
    """The -0.0 bias is made once per element type and channel count and copied per fusion: each
    fused op has its own array (a write into one changes no other), with the bytes onnx's
    make_tensor gives, for every float type the fusion takes."""
    from onnx import TensorProto
    from graphpass.passes.fusion.fuse_conv_activation import _zero_bias

    for elem in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE):
        want = onnx.numpy_helper.to_array(helper.make_tensor("b", elem, [4], [-0.0] * 4))
        a, b = _zero_bias(elem, 4), _zero_bias(elem, 4)
        assert a is not b and not np.shares_memory(a, b)
        assert a.dtype == want.dtype and a.shape == want.shape and a.tobytes() == want.tobytes()
    nodes, x = [], "x"
    for i in range(2):
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    model = make_model(nodes, {"x": [1, 4, 5, 5]}, {x: [1, 4, 5, 5]},
                       initializers={f"w{i}": RNG.standard_normal((4, 4, 3, 3)).astype(np.float32) for i in range(2)})
    graph = gp.load(model).graph
    assert fuse_conv_activation(graph).stats["fired"] == 2
    b0, b1 = (n.inputs[2].values for n in graph.nodes)
    assert b0 is not b1 and not np.shares_memory(b0, b1) and np.all(np.signbit(b0)) and np.all(b1 == 0)
    assert_equivalent(model, gp.to_proto(graph, emit="device"), exact=True)


def test_the_conv_is_edited_into_the_fused_op_to_the_graph_a_new_node_makes(monkeypatch):
    """The fused op is the Conv edited in place (Match.op(reuse=conv): op, domain, name, attributes,
    inputs, the activation's output; its annotations replaced by the fusion's provenance, which
    names what the Conv was fused from before) where nothing but the activation reads the Conv:
    the same bytes, node order, readers' order, annotations and stats as a new node, for every
    activation (SiLU's Conv output has two readers: a new node), a Conv with and without bias, and
    a Conv folded from a BatchNormalization before. The rollback gives the model back."""
    from graphpass.ir import model_io
    from graphpass.ir.journal import Journal
    from graphpass.passes.framework.rewrite import Match

    def load(model):
        graph = gp.load(model).graph
        A.meta(graph.nodes[0]).update({A.PASS: "fold_batchnorm", A.FUSED_FROM: '["conv", "bn"]', "note": "dropped"})
        return graph, graph.nodes[0]

    for act in sorted(CASES):
        nodes, _ = CASES[act]
        model = _model([*nodes, helper.make_node("Neg", ["x"], ["n"], name="side")], bias=act != "Relu")
        model.graph.output.extend([helper.make_tensor_value_info("n", onnx.TensorProto.FLOAT, [1, 3, 8, 8])])
        if act == "Relu6":
            model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                            onnx.numpy_helper.from_array(np.array(6, np.float32), "hi")])
        graph, conv = load(model)  # the rollback of an application that edited the Conv
        before = model_io.to_proto(graph, emit="device").SerializeToString()
        with Journal(graph) as j:
            assert fuse_conv_activation(graph, PassContext()).stats["fired"] == 1
            assert (conv.domain == "graphpass.ascend" and any(n is conv for n in graph.nodes)) == (act != "SiLU")
        j.rollback()
        assert model_io.to_proto(graph, emit="device").SerializeToString() == before
        assert graph.nodes[0] is conv and conv.op == "Conv" and A.stored_meta(conv)["note"] == "dropped"
        runs = []
        for reuse in (True, False):
            if not reuse:
                monkeypatch.setattr(Match, "_reusable", lambda self, node: False)
            graph, conv = load(model)
            result = fuse_conv_activation(graph, PassContext())
            fused = next(n for n in graph.nodes if n.domain == "graphpass.ascend")
            assert (fused is conv) == (reuse and act != "SiLU")
            assert A.stored_meta(fused) == {A.PASS: "fuse_conv_activation", A.FUSED_FROM: '["conv", "bn"]'}
            runs.append((gp.to_proto(graph).SerializeToString(), result.stats,
                         [(n.op, n.name, A.stored_meta(n)) for n in graph.nodes],
                         [[r.name for r in t.outputs] for n in graph.nodes for t in n.inputs]))
        monkeypatch.undo()
        assert runs[0] == runs[1]
