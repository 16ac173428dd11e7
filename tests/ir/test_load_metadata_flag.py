"""Validation's walk notes whether any node, initializer, input, output or value info of any
graph has metadata_props (GraphList.metadata; a sparse initializer counts too); the loader reads
annotations (annotations.read_from_proto) only then. The note is exact on the corpus and on
annotations placed in every spot read_from_proto looks, bodies included."""

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from _files import FILES, loaded  # noqa: E402 - tests/ir/_files.py
from graphpass.ir import annotations, serialize, validate
from graphpass.ir.graph import graph_protos, iter_graphs


def _has_metadata(m):
    for g in graph_protos(m.graph):
        if len(g.sparse_initializer):
            return True
        for field in (g.node, g.initializer, g.input, g.output, g.value_info):
            if any(len(x.metadata_props) for x in field):
                return True
    return False


def test_the_note_is_exact_on_the_corpus():
    seen = with_metadata = 0
    for path, m in loaded(FILES):
        try:
            graphs = validate.validated_graphs(m, path)
        except Exception:  # noqa: BLE001 - a model validation refuses
            continue
        if graphs is None:
            continue
        seen += 1
        assert graphs.metadata == _has_metadata(m), path
        with_metadata += graphs.metadata
    assert seen > 100 and with_metadata > 0


def _model():
    then = h.make_graph([h.make_node("Relu", ["x"], ["t"], name="inner")], "then", [],
                        [h.make_tensor_value_info("t", T.FLOAT, [2])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"], name="inner2")], "else", [],
                         [h.make_tensor_value_info("e", T.FLOAT, [2])])
    nodes = [h.make_node("Add", ["x", "w"], ["a"], name="add"), h.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
             h.make_node("Cast", ["s"], ["c"], to=T.BOOL),
             h.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])],
                     initializer=[h.make_tensor("w", T.FLOAT, [2], [1.0, 2.0])],
                     value_info=[h.make_tensor_value_info("a", T.FLOAT, [2])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _spots(m):
    g = m.graph
    then = g.node[3].attribute[0].g if g.node[3].attribute[0].name == "then_branch" else g.node[3].attribute[1].g
    return {"node": g.node[0], "initializer": g.initializer[0], "input": g.input[0], "output": g.output[0],
            "value_info": g.value_info[0], "body node": then.node[0], "body output": then.output[0]}


@pytest.mark.parametrize("spot", ["none", "node", "initializer", "input", "output", "value_info", "body node",
                                  "body output"])
def test_an_annotation_in_each_spot_is_noted_and_loaded(spot):
    m = _model()
    if spot != "none":
        _spots(m)[spot].metadata_props.add(key="graphpass.note", value=spot)
    graphs = validate.validated_graphs(m, "m")
    assert graphs is not None and graphs.metadata == (spot != "none")
    graph = serialize.load(m.SerializeToString())
    objects = {id(x): x for g in iter_graphs(graph) for x in [*g.nodes, *g.tensors().values()]}  # (a body sees x too)
    found = [annotations.get(x, "graphpass.note") for x in objects.values()]
    assert [f for f in found if f] == ([] if spot == "none" else [spot])
