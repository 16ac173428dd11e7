"""FormatOracle: the roles of a whole graph at once are the roles node by node."""

import onnx
import pytest

import graphpass as gp
from graphpass.cost_model import create

CM = create("ascend910a")


@pytest.mark.parametrize("name", ["light_resnet50.onnx", "light_inception_v2.onnx", "light_shufflenet.onnx"])
def test_roles_of_a_graph_are_the_role_keys_and_memoized_roles(light_path, name):
    graph = gp.optimize(onnx.load(light_path(name)), passes=["fold_batchnorm", "fuse_conv_activation"]).graph
    oracle = CM.format_oracle(graph)
    got = list(oracle.roles(graph.nodes))
    assert len(got) == len(graph.nodes)
    fresh = CM.format_oracle(graph)  # node by node, on an oracle of its own
    kinds = set()
    for node, (key, role) in zip(graph.nodes, got):
        assert key == fresh.role_key(node)
        assert role == fresh.role(node, copy=False, key=key)
        assert role is oracle.role(node, copy=False)  # the oracle's memoized role, not a copy
        kinds.add(role.kind)
    assert {"fixed", "choice"} <= kinds  # Conv and the format-agnostic ops around it
    # one role per key: nodes of equal keys share the object
    by_key = {}
    for key, role in got:
        assert by_key.setdefault(key, role) is role


def test_roles_of_an_unhashable_node_are_made_apart(light_path):
    graph = gp.load(onnx.load(light_path("light_squeezenet.onnx"))).graph
    oracle = CM.format_oracle(graph)
    relu = next(n for n in graph.nodes if n.op == "Relu")
    relu.outputs[0].dtype = [relu.outputs[0].dtype]  # an unhashable part: role_key gives None
    assert oracle.role_key(relu) is None
    got = dict(zip(map(id, graph.nodes), oracle.roles(graph.nodes)))
    key, role = got[id(relu)]
    assert key is None and role == CM.format_oracle(graph).role(relu)
    assert role is not oracle.role(relu, copy=False)  # not memoized: made for the node
