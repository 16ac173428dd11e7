"""Issue 16 item 9: a model's own function in the graphpass.ascend domain is never taken for ours.

A model may define ``graphpass.ascend::FusedConvRelu`` itself (hand-written, or from another
tool) with another body. A fusion that emits a call to graphpass's device op must not resolve
to the model's function, in the device form or the portable (inlined) form.
"""

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.testing import assert_equivalent, make_model


def _model_with_own_device_function() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    own = helper.make_function(
        "graphpass.ascend", "FusedConvRelu", ["X", "W", "B"], ["Y"],
        [helper.make_node("Conv", ["X", "W", "B"], ["c"]), helper.make_node("Sigmoid", ["c"], ["Y"])],
        [helper.make_opsetid("", 17)])
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
         helper.make_node("FusedConvRelu", ["x", "w", "b"], ["z"], domain="graphpass.ascend")],
        {"x": [1, 3, 8, 8]}, {"y": [1, 4, 6, 6], "z": [1, 4, 6, 6]},
        {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)},
        functions=[own], extra_opsets={"graphpass.ascend": 1})


@pytest.mark.parametrize("emit", ["device", "portable"])
def test_own_function_in_device_domain_is_not_reused(emit):
    model = _model_with_own_device_function()
    result = gp.optimize(model, target="ascend910a")
    out = gp.to_proto(result.graph, emit=emit)
    # The Conv+Relu still computes Relu and the model's own call still computes Sigmoid.
    assert_equivalent(model, out, exact=False)
    if emit == "device":
        bodies = {(f.domain, f.name): [n.op_type for n in f.node] for f in out.functions}
        assert any("Sigmoid" in ops for ops in bodies.values()), bodies
        assert any("Relu" in ops for ops in bodies.values()) or "Relu" in [n.op_type for n in out.graph.node]


def test_graphpass_own_device_output_keeps_its_domain_when_optimized_again():
    from graphpass.ir.device_ops import DOMAIN, MODEL_OWN_DOMAIN, free_reserved_domain, is_graphpass_body

    rng = np.random.default_rng(1)
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
        {"x": [1, 3, 8, 8]}, {"y": [1, 4, 6, 6]},
        {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
         "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    device = gp.to_proto(gp.optimize(model, target="ascend910a").graph, emit="device")
    ours = [f for f in device.functions if f.domain == DOMAIN]
    assert ours and all(is_graphpass_body(f) for f in ours)
    again = onnx.ModelProto()
    again.CopyFrom(device)
    assert free_reserved_domain(again) == []
    out = gp.to_proto(gp.optimize(device, target="ascend910a").graph, emit="device")
    assert not any(f.domain == MODEL_OWN_DOMAIN for f in out.functions)
    assert_equivalent(model, out)


def test_a_device_domain_node_with_a_subgraph_is_not_taken_for_a_device_op():
    """graphpass's device ops never carry a graph attribute, and the IR's walks skip their
    attributes; a node of the reserved domain that does carry one (not graphpass's) is moved to
    the model's own domain at load, so its body is still walked (and kept)."""
    from graphpass.ir.device_ops import MODEL_OWN_DOMAIN
    from graphpass.ir.graph import iter_graphs

    body = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "body", [],
                             [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    node = helper.make_node("Wrapped", ["x"], ["z"], domain="graphpass.ascend", body=body)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("graphpass.ascend", 1)])
    m = gp.load(model.SerializeToString())
    assert [n.domain for n in m.graph.nodes] == [MODEL_OWN_DOMAIN]
    assert len(list(iter_graphs(m.graph))) == 2
