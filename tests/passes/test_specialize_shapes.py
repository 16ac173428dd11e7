import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.testing import assert_equivalent, make_model, ops


def _dynamic_flatten_model():
    # y = x.view(x.size(0), -1), written the way the TorchScript exporter writes it
    return make_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
         helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"])],
        {"x": ["N", 3, 4]}, {"y": ["N", 12]},
        initializers={"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
                      "minus1": np.array([-1], np.int64)},
    )


def test_fixes_dynamic_dims_and_lets_folding_remove_the_shape_chain():
    model = _dynamic_flatten_model()
    graph = gp.load(model).graph
    assert graph.inputs[0].shape[0] == "N"  # symbolic dims keep their names
    result = gp.optimize(graph, passes=["specialize_shapes", "fold_constants", "eliminate_dead_nodes"],
                         input_shapes={"x": [2, 3, 4]})
    first = result.report.passes[0]
    assert first.name == "specialize_shapes" and first.modified and first.stats["inputs_fixed"] == 1
    assert graph.inputs[0].shape == [2, 3, 4]
    assert ops(graph) == ["Reshape"]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    assert_equivalent(model, gp.to_proto(graph), feeds=feeds, exact=True)


def test_no_input_shapes_means_no_change():
    graph = gp.load(_dynamic_flatten_model()).graph
    result = gp.optimize(graph, passes=["specialize_shapes"])
    assert not result.report.passes[0].modified
    assert result.report.passes[0].stats == {"inputs_fixed": 0}  # nothing fixed, nothing re-inferred
    assert ops(graph)[0] == "Shape"


@pytest.mark.parametrize(
    "shapes, message",
    [({"nope": [1, 3, 4]}, "not a graph input"),
     ({"x": [2, 3]}, "rank 2"),
     ({"x": [2, 5, 4]}, "fixed to 3"),
     ({"x": [0, 3, 4]}, "positive")],
)
def test_bad_input_shapes_are_usage_errors(shapes, message):
    with pytest.raises(UsageError, match=message):
        gp.load(_dynamic_flatten_model(), input_shapes=shapes).graph
    graph = gp.load(_dynamic_flatten_model()).graph
    with pytest.raises(UsageError, match=message):
        gp.optimize(graph, passes=["specialize_shapes"], input_shapes=shapes)


def test_batch_of_one_is_specialized_and_downstream_shapes_follow():
    """A dim fixed to 1 is a valid specialization; the Reshape's output shape is re-inferred
    (found by benchmarks/mutation.py: no test fixed a dim to 1 or looked past the input)."""
    graph = gp.load(_dynamic_flatten_model()).graph
    result = gp.optimize(graph, passes=["specialize_shapes"], input_shapes={"x": [1, 3, 4]})
    first = result.report.passes[0]
    assert first.modified and first.stats["inputs_fixed"] == 1 and first.stats["shapes_updated"] >= 1
    assert graph.inputs[0].shape == [1, 3, 4]
    assert graph.outputs[0].shape == [1, 12]


def test_an_equal_shape_is_left_alone():
    graph = gp.load(_dynamic_flatten_model()).graph
    gp.optimize(graph, passes=["specialize_shapes"], input_shapes={"x": [2, 3, 4]})
    result = gp.optimize(graph, passes=["specialize_shapes"], input_shapes={"x": [2, 3, 4]})
    assert not result.report.passes[0].modified
    assert result.report.passes[0].stats == {"inputs_fixed": 0, "shapes_updated": 0}  # no re-inference


def test_a_dim_fixed_to_one_conflicts_with_another_value():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, "C"]}, {"y": [1, "C"]})
    with pytest.raises(UsageError, match="dimension 0 is fixed to 1"):
        gp.optimize(model, passes=["specialize_shapes"], input_shapes={"x": [2, 3]})
