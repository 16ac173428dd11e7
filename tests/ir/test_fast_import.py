"""graphpass.ir.fast_import builds exactly what onnx-graphsurgeon's importer builds: the same
classes, fields (in the same order), values, and the same sharing of tensor objects between
nodes, graphs and bodies (node attributes aside: a dict, not an OrderedDict, same items); on every model of onnx's backend test data (node conformance cases and
model-zoo architectures), the exporter corpus and the suite's own files."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx.backend.test.case.node import collect_testcases

from _files import FILES, ONNX_DATA, REPO  # noqa: E402 - tests/ir/_files.py
from graphpass.ir import fast_import

_ONNX, _REPO, _FILES = ONNX_DATA, REPO, FILES


class _Dump:
    """A structural listing of an imported graph: objects numbered in the order first met."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.keep: list = []  # keeps numbered objects alive (ids stay unique)

    def ref(self, obj) -> int:
        k = self.ids.get(id(obj))
        if k is None:
            k = self.ids[id(obj)] = len(self.ids)
            self.keep.append(obj)
        return k

    def value(self, v):
        if isinstance(v, gs.Graph):
            return ("graph", self.graph(v))
        if isinstance(v, gs.Tensor):
            return ("tensor", self.tensor(v))
        if isinstance(v, gs.Node.AttributeRef):
            return ("ref", v.name, repr(v.type))
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, tuple(self.value(x) for x in v))
        if isinstance(v, float):
            return ("f", v.hex() if v == v else "nan")
        if isinstance(v, np.ndarray):
            return ("a", str(v.dtype), v.shape, v.tobytes())
        return (type(v).__name__, repr(v))

    def tensor(self, t: gs.Tensor):
        k = self.ref(t)
        fields = []
        for name, v in t.__dict__.items():
            if name in ("inputs", "outputs"):
                fields.append((name, type(v).__name__, tuple(self.ref(x) for x in v)))
            elif name == "_values":
                if isinstance(v, gs.ir.tensor.LazyValues):
                    fields.append((name, "lazy", tuple(v.shape), repr(v.dtype), v.nbytes, v.tensor.name,
                                   v.tensor.data_type, type(v.shape).__name__))
                else:
                    fields.append((name, type(v).__name__, repr(getattr(v, "shape", None))))
            elif name == "shape":
                fields.append((name, type(v).__name__, None if v is None else tuple(v)))
            else:
                fields.append((name, repr(v)))
        return (k, type(t).__name__, tuple(fields))

    def node(self, n: gs.Node):
        fields = []
        for name, v in n.__dict__.items():
            if name in ("inputs", "outputs"):
                fields.append((name, type(v).__name__, tuple(self.tensor(x) for x in v)))
            elif name == "attrs":  # fast_import's are plain dicts (gs's OrderedDicts): same items, same order
                fields.append((name, tuple((a, self.value(x)) for a, x in v.items())))
            else:
                fields.append((name, repr(v)))
        return (self.ref(n), tuple(fields))

    def graph(self, g: gs.Graph):
        head = tuple((k, repr(v)) for k, v in g.__dict__.items()
                     if k not in ("nodes", "inputs", "outputs", "functions", "import_domains"))
        domains = tuple((d.domain, d.version) for d in (g.import_domains or ()))
        shared = self.ref(g.__dict__["_functions"]) if "_functions" in g.__dict__ else None  # one list for a model's graphs
        return (head, domains, tuple(self.tensor(t) for t in g.inputs), tuple(self.tensor(t) for t in g.outputs),
                tuple(self.node(n) for n in g.nodes), len(g.functions or ()), shared)


def _import(fn, model: onnx.ModelProto):
    try:
        return _Dump().graph(fn(model))
    except Exception as e:  # both importers must fail alike
        return ("error", type(e).__name__)


_CASES = sorted(collect_testcases(None), key=lambda c: c.name)


def test_the_corpus_is_there():
    assert len(_CASES) > 1000 and len(_FILES) > 100, (len(_CASES), len(_FILES))


def test_same_objects_as_gs_on_every_node_case():
    differ = [c.name for c in _CASES if _import(fast_import.import_onnx, c.model) != _import(gs.import_onnx, c.model)]
    assert not differ, differ


@pytest.mark.parametrize("path", _FILES, ids=[os.path.relpath(p, _ONNX if str(p).startswith(str(_ONNX)) else _REPO)
                                              for p in _FILES])
def test_same_objects_as_gs(path):
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:
        pytest.skip(f"onnx cannot read it: {type(e).__name__}")
    ours = _import(fast_import.import_onnx, model)
    theirs = _import(gs.import_onnx, model)
    assert ours == theirs


def test_shared_and_unusual_forms():
    """Outer-scope tensors shared into a body, value_info repeated with more facts, an unnamed
    optional output, a node reading a tensor nobody declared, a sparse initializer."""
    h = onnx.helper
    body = h.make_graph(
        [h.make_node("Add", ["x", "w"], ["y"])], "body", [], [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    sparse = h.make_sparse_tensor(h.make_tensor("sv", onnx.TensorProto.FLOAT, [1], [3.0]),
                                  h.make_tensor("si", onnx.TensorProto.INT64, [1], [1]), [2])
    g = h.make_graph(
        [h.make_node("If", ["c"], ["o"], then_branch=body, else_branch=body),
         h.make_node("Dropout", ["o"], ["d", ""]),
         h.make_node("Add", ["d", "undeclared"], ["z"])],
        "g",
        [h.make_tensor_value_info("c", onnx.TensorProto.BOOL, []), h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [h.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        initializer=[h.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])],
        value_info=[h.make_tensor_value_info("o", onnx.TensorProto.FLOAT, None),
                    h.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [2]),
                    h.make_tensor_value_info("d", onnx.TensorProto.UNDEFINED, None)],
        sparse_initializer=[sparse],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    ours = _import(fast_import.import_onnx, model)
    assert ours == _import(gs.import_onnx, model)
    assert ours[0] != "error"


def test_a_loaded_model_holds_no_part_of_the_parse(monkeypatch):
    """After graphpass.load, no weight, opset import, kept type or default initializer is a part of
    the parsed ModelProto (protobuf allocates a message's parts in one arena: one part kept
    alive keeps every node and value_info of the parse in memory). A part of a message is the
    same Python object while something holds it, so a part the graph kept would be found again."""
    import graphpass as gp
    from graphpass.ir import serialize

    parsed = []
    real = serialize._load_proto

    def spy(*a, **k):
        out = real(*a, **k)
        parsed.append(out[0])
        return out

    monkeypatch.setattr(serialize, "_load_proto", spy)
    path = _REPO / "tests" / "data" / "exporters" / "resnet18.torchscript.onnx"
    model = gp.load(path)
    proto = parsed[0]
    held = set()
    for g in [model.graph]:
        held.update(id(o) for o in g.import_domains or ())
        for n in g.nodes:
            for t in list(n.inputs) + [v for v in n.attrs.values() if isinstance(v, gs.Constant)]:
                v = t.__dict__.get("_values")
                if isinstance(v, gs.ir.tensor.LazyValues):
                    held.add(id(v.tensor))
    assert len(held) > 10
    parts = list(proto.graph.initializer) + list(proto.opset_import)
    parts += [a.t for n in proto.graph.node for a in n.attribute if a.HasField("t")]
    assert parts and not {id(p) for p in parts} & held


def test_the_lists_are_wired_as_gs_wires_them():
    """Each node's and tensor's lists know their owner and the other side's field (what keeps
    both sides in step on every later edit), as gs's own importer sets them."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    w = onnx.numpy_helper.from_array(np.ones(2, np.float32), "w")
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["t"]), onnx.helper.make_node("Relu", ["t"], ["y"])],
        "g", [x], [y], [w]))
    ours, theirs = fast_import.import_onnx(model), gs.import_onnx(model)
    for a, b in zip(ours.nodes, theirs.nodes):
        for la, lb in ((a.inputs, b.inputs), (a.outputs, b.outputs)):
            assert type(la) is type(lb) and la.field_name == lb.field_name and la.parent_obj is a
        for ta, tb in zip(list(a.inputs) + list(a.outputs), list(b.inputs) + list(b.outputs)):
            for la, lb in ((ta.inputs, tb.inputs), (ta.outputs, tb.outputs)):
                assert type(la) is type(lb) and la.field_name == lb.field_name and la.parent_obj is ta
    add, relu = ours.nodes
    t = add.outputs[0]
    assert list(t.inputs) == [add] and list(t.outputs) == [relu]
    relu.inputs[0] = add.inputs[0]  # an edit keeps both sides in step
    assert list(t.outputs) == [] and relu in ours.inputs[0].outputs


def test_values_of_one_type_get_their_own_shape_lists():
    """Types are read once per distinct TypeProto: each tensor still gets a list of its own (a
    pass that edits one shape must not edit the other's)."""
    vis = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["N", 3, None]) for n in ("a", "b")]
    g = fast_import.import_graph(onnx.helper.make_graph([], "g", vis, vis[1:], value_info=[]))
    a, b = g.inputs
    assert a.shape == b.shape == ["N", 3, None] and type(a.shape) is list and a.shape is not b.shape
    a.shape[0] = 1
    assert b.shape == ["N", 3, None]
    again = fast_import.import_graph(onnx.helper.make_graph([], "g", vis[:1], [], value_info=[]))
    assert again.inputs[0].shape == ["N", 3, None]
