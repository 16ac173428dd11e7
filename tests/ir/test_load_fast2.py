"""The load's and save's shortcuts of issue 22 (round 2) give what the walks they replace gave:
_release_proto from the import's list of Constants copies the weights the walk over every
node's tensors copied; shape inference's check of the node outputs reads validation's list of
them; a fused op's portable expansion leaves a body node without attribute references as it is;
the streaming writer's batched records are the bytes of one record at a time."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from _files import FILES, loaded  # noqa: E402 - tests/ir/_files.py
from graphpass.ir import device_ops, external, fast_import, inference, serialize, validate
from graphpass.ir.graph import graph_protos, iter_graphs

HERE = os.path.dirname(__file__)
h, T = onnx.helper, onnx.TensorProto


def _nested() -> onnx.ModelProto:
    """An If whose branches read an outer weight and hold a weight of their own, a Constant node,
    a weight that is a graph output, and a weight nothing reads."""
    w = onnx.numpy_helper.from_array(np.arange(300, dtype=np.float32), "w")
    own = onnx.numpy_helper.from_array(np.full(300, 2.0, np.float32), "own")
    branch = h.make_graph([h.make_node("Add", ["w", "own"], ["o"])], "branch", [],
                          [h.make_tensor_value_info("o", T.FLOAT, [300])], initializer=[own])
    nodes = [h.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch),
             h.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.ones(300, np.float32), "kv")),
             h.make_node("Add", ["b", "k"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [300]), h.make_tensor_value_info("out_w", T.FLOAT, [2])],
                     initializer=[w, onnx.numpy_helper.from_array(np.zeros(2, np.float32), "out_w"),
                                  onnx.numpy_helper.from_array(np.zeros(5, np.float32), "unused")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _parts(m: onnx.ModelProto) -> set[int]:
    """ids of the parse's tensor messages (a part is the same Python object while held)."""
    parts = []
    for g in graph_protos(m.graph):
        parts += list(g.initializer)
        parts += [a.t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    return {id(p) for p in parts}


def _released(model: onnx.ModelProto, fast: bool):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    made = fast_import.Made()
    graph = fast_import.import_onnx(m, made)
    serialize._release_proto(graph, kept_types=False, made=made if fast else None)
    parts = _parts(m)
    lazy = {}
    for g in iter_graphs(graph):
        tensors = list(g.inputs) + list(g.outputs)
        for n in g.nodes:
            tensors += list(n.inputs) + list(n.outputs)
            tensors += [v for v in (n.attrs or {}).values() if isinstance(v, gs.Constant)]
        for t in tensors:
            v = t.__dict__.get("_values")
            if isinstance(v, gs.ir.tensor.LazyValues):
                lazy[id(t)] = (t.name, v.tensor.SerializeToString(), id(v.tensor) in parts)
    return made, sorted(lazy.values())


def test_release_from_the_import_list_copies_what_the_walk_copies():
    """Every weight the graph holds is its own copy either way (none a part of the parse), with
    the same bytes; the import's list is complete unless gs imported a part."""
    seen = complete = 0
    models = list(loaded(FILES)) + [("nested", _nested())]
    for path, m in models:
        try:
            made, fast = _released(m, True)
        except Exception:  # noqa: BLE001 - a file the importer refuses is no case here
            continue
        _, walk = _released(m, False)
        if made.complete:
            complete += 1
            assert fast == walk, path
            assert not any(in_parse for _, _, in_parse in fast), path
        seen += 1
    assert seen > 100 and complete > 100


def test_release_from_the_list_leaves_an_unread_weight_with_the_parse():
    made, held = _released(_nested(), True)
    # w, out_w, unused, each branch's own, the Constant node's kv
    assert made.complete and len(made) == 6 and len(made.attributes) == 1
    names = [name for name, _, in_parse in held]
    assert sorted(set(names)) == ["kv", "out_w", "own", "w"] and not any(in_parse for _, _, in_parse in held)
    unused = next(c for c in made if c.name == "unused")
    assert not unused.outputs  # nothing reads it: left to go with the parse


def test_the_import_list_is_incomplete_where_gs_imports():
    sparse = h.make_sparse_tensor(h.make_tensor("sv", T.FLOAT, [1], [1.0]), h.make_tensor("si", T.INT64, [1], [0]), [3])
    g = h.make_graph([h.make_node("Identity", ["sv"], ["y"])], "g", [], [h.make_tensor_value_info("y", T.FLOAT, [3])],
                     sparse_initializer=[sparse])
    made = fast_import.Made()
    fast_import.import_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), made)
    assert not made.complete


def test_validation_lists_the_main_graphs_node_outputs():
    seen = 0
    for path, m in loaded(FILES):
        try:
            graphs = validate.validated_graphs(m, path)
        except Exception:  # noqa: BLE001 - a model validation refuses
            continue
        if graphs is None:
            continue
        expected = [o for n in m.graph.node for o in n.output]
        assert graphs.outputs == expected, path
        seen += 1
    assert seen > 100


@pytest.mark.parametrize("shape", [[1, 3], ["N", 3], None])
def test_unknown_shapes_with_the_outputs_given(shape):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["N", 3])], [h.make_tensor_value_info("z", T.FLOAT, None)],
                     value_info=[h.make_tensor_value_info("y", T.FLOAT, shape)])
    outputs = [o for n in g.node for o in n.output]
    assert inference._has_unknown_shapes(g, outputs) == inference._has_unknown_shapes(g)
    assert inference._has_unknown_shapes(g, outputs)  # z has no shape
    g.output[0].CopyFrom(h.make_tensor_value_info("z", T.FLOAT, ["N", 3]))
    assert inference._has_unknown_shapes(g, outputs) == inference._has_unknown_shapes(g) == (shape is None)


@pytest.mark.parametrize("activation", sorted(device_ops.FUSED_CONV))
@pytest.mark.parametrize("annotated", [False, True])
def test_expansion_with_the_refs_plan_is_the_same(activation, annotated):
    fn = device_ops.fused_conv_function(activation, 17)
    call = h.make_node(fn.name, ["x", "w", "b"], ["y"], name="conv1", domain=device_ops.DOMAIN, pads=[1, 1, 1, 1],
                       group=1, **({"alpha": 0.1} if activation == "LeakyRelu" else {}))
    if annotated:
        call.metadata_props.add(key="graphpass.engine", value="AI_CORE")
    refs = [any(a.ref_attr_name for a in b.attribute) for b in fn.node]
    ours = device_ops._expand_call(call, fn, {"y"}, refs)
    theirs = device_ops._expand_call(call, fn, {"y"})
    assert [n.SerializeToString() for n in ours] == [n.SerializeToString() for n in theirs]
    assert all(len(n.metadata_props) == annotated for n in ours)
    assert any(a.name == "pads" for n in ours for a in n.attribute)


def test_batched_records_are_the_bytes_of_one_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"w{k}")
             for k, n in enumerate([300, 5, 70_000, 400, 1, 300_000])]
    nodes = [h.make_node("Add", ["x" if k == 0 else f"t{k - 1}", f"w{k}"], [f"t{k}"]) for k in range(len(inits))]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1])],
                     [h.make_tensor_value_info(f"t{len(inits) - 1}", T.FLOAT, None)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    originals = {}
    for t in inits:
        originals[t.name] = onnx.numpy_helper.to_array(t) if t.name != "w2" else t
        model.graph.initializer.append(external._header(t))
    out = {}
    for batch in (1, 1 << 20, 1 << 40):
        monkeypatch.setattr(external, "_WRITE_BATCH", batch)
        m = onnx.ModelProto()
        m.CopyFrom(model)
        external._write_streaming(m, dict(originals), tmp_path / f"{batch}.onnx")
        out[batch] = (tmp_path / f"{batch}.onnx").read_bytes()
    assert out[1] == out[1 << 20] == out[1 << 40]
    back = onnx.load_from_string(out[1])
    assert [t.name for t in back.graph.initializer] == [t.name for t in inits]
    for t, b in zip(inits, back.graph.initializer):
        assert np.array_equal(onnx.numpy_helper.to_array(t), onnx.numpy_helper.to_array(b))


def _annotated_models():
    import graphpass as gp
    from graphpass.ir import annotations

    for path in sorted(glob.glob(os.path.join(HERE, "..", "data", "exporters", "*.torchscript.onnx")))[:6]:
        m = gp.load(path)
        g = m.graph
        tensors = [t for n in g.nodes for t in list(n.inputs) + list(n.outputs)]
        for k, t in enumerate(tensors[::7]):
            annotations.set(t, annotations.FORMAT, "NC1HWC0" if k % 2 else "ND")
        annotations.set(g.inputs[0], annotations.FORMAT, "NCHW")
        annotations.set(g.outputs[0], annotations.FORMAT, "ND")
        yield path, m


def test_annotations_written_from_the_exports_maps_are_the_walks(monkeypatch):
    """The same bytes whether write_to_proto reads the export's map of the tensors or walks the
    nodes for it (graph inputs, intermediates, weights and outputs annotated)."""
    from graphpass.ir import annotations

    seen = 0
    for path, m in _annotated_models():
        ours = serialize.to_proto(m.graph, emit="device").SerializeToString()
        real = annotations.write_to_proto
        monkeypatch.setattr(annotations, "write_to_proto", lambda g, p, maps=None: real(g, p, None))
        theirs = serialize.to_proto(m.graph, emit="device").SerializeToString()
        monkeypatch.setattr(annotations, "write_to_proto", real)
        assert ours == theirs, path
        assert b"NC1HWC0" in ours
        seen += 1
    assert seen >= 3


def test_the_export_maps_every_graph_without_clashing_names():
    from graphpass.ir import annotations, fast_export

    graph = fast_import.import_onnx(_nested())
    maps: dict = {}
    fast_export.export_onnx(graph, None, maps)
    assert len(maps) == 3  # the main graph and both branches
    for g in iter_graphs(graph):
        assert maps[id(g)][0] is g and maps[id(g)][1] == annotations._graph_tensors(g)
        assert list(maps[id(g)][1]) == list(annotations._graph_tensors(g))


def _typed_models():
    """Values of sequence and optional types: a graph input, a value_info, a graph output, one in
    an If branch, and a value_info whose name is a weight's (the import passes over it)."""
    seq = h.make_tensor_sequence_value_info
    x = h.make_tensor_value_info("x", T.FLOAT, [2])
    cons = h.make_node("SequenceConstruct", ["x", "x"], ["s"])
    at = h.make_node("SequenceAt", ["s", "i"], ["y"])
    i = h.make_tensor("i", T.INT64, [], [0])
    y = h.make_tensor_value_info("y", T.FLOAT, [2])
    yield "value_info", h.make_graph([cons, at], "g", [x], [y], [i], value_info=[seq("s", T.FLOAT, [2])])
    yield "output", h.make_graph([cons], "g", [x], [seq("s", T.FLOAT, [2])])
    yield "input", h.make_graph([h.make_node("SequenceAt", ["s", "i"], ["y"])], "g", [seq("s", T.FLOAT, [2])], [y], [i])
    opt = h.make_value_info("o", h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2])))
    yield "optional", h.make_graph([h.make_node("Optional", ["x"], ["o"]), h.make_node("OptionalGetElement", ["o"], ["y"])],
                                   "g", [x], [y], value_info=[opt])
    branch = h.make_graph([h.make_node("SequenceConstruct", ["x"], ["bs"]), h.make_node("SequenceAt", ["bs", "i"], ["bo"])],
                          "b", [], [h.make_tensor_value_info("bo", T.FLOAT, [2])], value_info=[seq("bs", T.FLOAT, [2])])
    yield "body", h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], "g",
                               [x, h.make_tensor_value_info("c", T.BOOL, [])], [y], [i])
    yield "weight", h.make_graph([h.make_node("Identity", ["i"], ["y"])], "g", [], [h.make_tensor_value_info("y", T.INT64, [])],
                                 [i], value_info=[h.make_value_info("i", h.make_sequence_type_proto(h.make_tensor_type_proto(T.INT64, [])))])


def test_the_import_notes_every_type_remember_types_keeps():
    """Where the import saw no value type other than a tensor's (and imported every part
    itself), _remember_types finds none to keep; every model with a sequence or optional value
    is noted."""
    models = list(loaded(FILES)) + [(name, h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
                                    for name, g in _typed_models()]
    seen = noted = 0
    for path, m in models:
        made = fast_import.Made()
        try:
            graph = fast_import.import_onnx(m, made)
        except Exception:  # noqa: BLE001 - a file the importer refuses is no case here
            continue
        kept = serialize._remember_types(m.graph, graph)
        if made.complete and not made.other_types:
            assert not kept, path
        if kept:
            assert made.other_types or not made.complete, path
            noted += 1
        seen += 1
    assert seen > 150 and noted == 6


def _stray_tensor() -> onnx.ModelProto:
    """An INT attribute that also holds a tensor with external data (onnx lists it)."""
    g = h.make_graph([h.make_node("Flatten", ["x"], ["y"], axis=1)], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 2])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    t = g.node[0].attribute[0].t
    t.name, t.data_type = "w", T.FLOAT
    t.data_location = T.EXTERNAL
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_validation_tells_a_model_without_external_tensors():
    """Where validation's walk says no tensor may be external, the loader's list of external
    tensors is empty without its walk; every model with external data is flagged."""
    seen = flagged = 0
    for path, m in list(loaded(FILES)) + [("stray", _stray_tensor())]:
        try:
            graphs = validate.validated_graphs(m, path)
        except Exception:  # noqa: BLE001 - a model validation refuses
            continue
        if graphs is None or len(m.functions):
            continue
        on_disk = list(external._external_tensors(m))
        if not graphs.external:
            assert not on_disk, path
        if on_disk:
            assert graphs.external, path
            flagged += 1
        seen += 1
    assert seen > 100 and flagged > 10
