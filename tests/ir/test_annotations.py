"""graphpass.ir.annotations: setting None removes an annotation (it stored the string "None")."""

from __future__ import annotations

from onnx import helper

import graphpass as gp
from graphpass.ir import annotations as A
from graphpass.ir.journal import Journal
from graphpass.testing import make_model


def _graph():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 4]}, {"y": [1, 4]})
    return gp.load(model).graph


def test_setting_none_removes_the_annotation_and_it_is_not_saved():
    graph = _graph()
    y = graph.outputs[0]
    A.set_format(y, "NC1HWC0")
    assert A.get_format(y) == "NC1HWC0"
    A.set_format(y, None)
    assert A.get_format(y) is None
    A.set(graph.nodes[0], A.ENGINE, None)  # never set: nothing made
    assert A.stored_meta(graph.nodes[0]) is None
    A.set_format(graph.inputs[0], "ND")
    proto = gp.to_proto(graph)
    props = [(p.key, p.value) for vi in proto.graph.value_info for p in vi.metadata_props]
    props += [(p.key, p.value) for vi in proto.graph.output for p in vi.metadata_props]
    props += [(p.key, p.value) for vi in proto.graph.input for p in vi.metadata_props]
    assert (A.FORMAT, "ND") in props  # the kept annotation is written where annotations go
    assert all(v != "None" for _, v in props) and (A.FORMAT, "NC1HWC0") not in props

def test_removing_an_annotation_is_undone_by_the_journal():
    graph = _graph()
    y = graph.outputs[0]
    A.set_format(y, "NC1HWC0")
    journal = Journal(graph)
    journal.start()
    A.set_format(y, None)
    assert A.get_format(y) is None
    journal.rollback()
    assert A.get_format(y) == "NC1HWC0"
