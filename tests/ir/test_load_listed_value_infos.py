"""The loader imports the inferred value infos from shape inference's list (lean from_proto:
inference.infer_shapes_listed, fast_import's value_infos) instead of copying them into the
model and reading them back: the same graph, object by object, as the copy-and-read import,
on every model of the corpus and every node case of onnx's test data; the list is made only
where it may be (no body, no value_info of the model's own, nothing unknown, tensor types)."""

from __future__ import annotations

import os

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.backend.test.case.node import collect_testcases

from _files import FILES, ONNX_DATA, REPO  # noqa: E402 - tests/ir/_files.py
from test_fast_import import _Dump  # noqa: E402 - tests/ir/test_fast_import.py
from graphpass.ir import inference, serialize


def _both(monkeypatch, source):
    """The graph dumps of a lean load and of a load that copies the value infos, and whether
    the lean one imported from a list."""
    real = serialize.from_proto
    listed = []
    real_infer = serialize.infer_shapes_listed

    def spy(*a, **k):
        out = real_infer(*a, **k)
        listed.append(out[1] is not None)
        return out

    def dump(lean):
        monkeypatch.setattr(serialize, "from_proto", lambda *a, **k: real(*a, **{**k, "lean": lean}))
        try:
            return _Dump().graph(serialize.load(source))
        except Exception as e:  # noqa: BLE001 - both must fail alike
            return ("error", type(e).__name__, str(e))
        finally:
            monkeypatch.setattr(serialize, "from_proto", real)

    monkeypatch.setattr(serialize, "infer_shapes_listed", spy)
    lean = dump(True)
    used = any(listed)
    copied = dump(False)
    return lean, copied, used


@pytest.mark.parametrize("path", FILES, ids=[os.path.relpath(p, ONNX_DATA if str(p).startswith(str(ONNX_DATA)) else REPO)
                                             for p in FILES])
def test_the_same_graph_as_the_copied_value_infos(path, monkeypatch):
    lean, copied, _ = _both(monkeypatch, path)
    assert lean == copied


def test_the_same_graph_on_every_node_case(monkeypatch):
    used = 0
    for case in sorted(collect_testcases(None), key=lambda c: c.name):
        data = case.model.SerializeToString()
        lean, copied, listed = _both(monkeypatch, data)
        assert lean == copied, case.name
        used += listed
    assert used > 500  # the list is what most loads import from


def test_when_the_list_is_made():
    def model(value_info=(), out_type=None, op="Relu"):
        g = h.make_graph([h.make_node(op, ["x"], ["a"]), h.make_node("Relu", ["a"], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["N", 3])],
                         [out_type or h.make_tensor_value_info("y", T.FLOAT, None)], value_info=list(value_info))
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    inferred, listed = inference.infer_shapes_listed(model(), bodies=False, listed=True)
    assert listed == [("a", *inference.fast_import.tensor_type(inferred.graph.value_info[0].type))]
    assert listed[0][2] == ("N", 3)
    assert inference.infer_shapes_listed(model(), bodies=False)[1] is None  # not asked
    # a shape inference cannot tell: the list is not made (the data-propagation path decides)
    assert inference.infer_shapes_listed(model(op="NonZero"), bodies=False, listed=True)[1] is None


@pytest.mark.parametrize("path", [p for p in FILES if "exporters" in p][:12] + [p for p in FILES if "light" in p][:6],
                         ids=os.path.basename)
def test_the_same_graph_with_input_shapes_fixed(path, monkeypatch):
    """With --input-shape the loader infers on a copy with the inputs fixed: the list serves it too."""
    model = onnx.load(path, load_external_data=False)
    shapes = {}
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
    real_load = serialize.load
    monkeypatch.setattr(serialize, "load", lambda source: real_load(source, input_shapes=shapes or None))
    try:
        lean, copied, _ = _both(monkeypatch, path)
    finally:
        monkeypatch.setattr(serialize, "load", real_load)
    assert lean == copied
