"""The load's one-walk helpers give what the walks they replaced gave: external._all_tensors is
onnx's _get_all_tensors (the same messages, in order), and inference._light_copy is the copy
node by node, on the exporter corpus and onnx's test models (bodies, functions, Constants)."""

from __future__ import annotations

import glob
import os

import onnx
from onnx import external_data_helper

from _files import ALL_ONNX_DATA, loaded  # noqa: E402 - tests/ir/_files.py
from graphpass.ir import external, inference

HERE = os.path.dirname(__file__)


def _models():
    return loaded(sorted(glob.glob(os.path.join(HERE, "..", "data", "**", "*.onnx"), recursive=True)) + ALL_ONNX_DATA)


def _light_copy_node_by_node(model: onnx.ModelProto) -> onnx.ModelProto:
    """The light copy as it was written before (each node on its own; make_tensor_value_info)."""
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4), producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    for n in src.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            copy = dst.node.add()
            copy.CopyFrom(n)
            for a in copy.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    inference._drop_inferable_value_info(g)
        else:
            dst.node.append(n)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    if len(src.value_info):
        inferable = {o for n in src.node if n.domain in ("", "ai.onnx") for o in n.output}
        dst.value_info.extend(vi for vi in src.value_info if vi.name not in inferable)
    dst.sparse_initializer.extend(src.sparse_initializer)
    inputs = {i.name for i in src.input}
    for t in src.initializer:
        if inference._numel(t) * inference._itemsize(t) > 1024 or (
                t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL):
            if t.name not in inputs:
                dst.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            dst.initializer.append(t)
    return light


def _with_function() -> onnx.ModelProto:
    """A local function whose body holds a Constant and an If whose branch has an initializer
    (onnx lists the Constant's tensor, not the branch's initializer), called from the graph."""
    h, T = onnx.helper, onnx.TensorProto
    branch = h.make_graph([h.make_node("Identity", ["w"], ["o"])], "branch", [],
                          [h.make_tensor_value_info("o", T.FLOAT, [1])], initializer=[h.make_tensor("w", T.FLOAT, [1], [2.0])])
    body = [h.make_node("Constant", [], ["k"], value=h.make_tensor("kv", T.FLOAT, [1], [1.0])),
            h.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch),
            h.make_node("Add", ["k", "b"], ["y"])]
    fn = h.make_function("local", "F", ["c"], ["y"], body, [h.make_opsetid("", 17)])
    g = h.make_graph([h.make_node("F", ["c"], ["y"], domain="local"),
                      h.make_node("Constant", [], ["z"], value=h.make_tensor("zv", T.FLOAT, [1], [3.0]))], "g",
                     [h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1]), h.make_tensor_value_info("z", T.FLOAT, [1])],
                     initializer=[h.make_tensor("i", T.FLOAT, [1], [4.0])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], functions=[fn])


def test_all_tensors_is_onnxs_list():
    seen = with_functions = 0
    for path, m in [*_models(), ("function", _with_function())]:
        ours = external._all_tensors(m)
        theirs = list(external_data_helper._get_all_tensors(m))
        assert len(ours) == len(theirs), path
        for a, b in zip(ours, theirs):
            assert a == b, path
        if ours:  # the same messages: a change through one is seen through the other
            ours[0].doc_string = "probe"
            assert theirs[0].doc_string == "probe", path
        seen += 1
        with_functions += len(m.functions) > 0
    assert seen > 150 and with_functions > 0


def test_light_copy_is_the_node_by_node_copy():
    seen = with_bodies = 0
    for path, m in _models():
        expected = _light_copy_node_by_node(m).SerializeToString()
        assert inference._light_copy(m).SerializeToString() == expected, path
        holds = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                    for n in m.graph.node for a in n.attribute)
        if not holds:  # what from_proto passes when its graph list has no body: the nodes are not looked at
            assert inference._light_copy(m, bodies=False).SerializeToString() == expected, path
        seen += 1
        with_bodies += holds
    assert seen > 150 and with_bodies > 0
