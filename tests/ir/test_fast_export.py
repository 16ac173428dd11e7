"""graphpass.ir.fast_export writes the very message onnx-graphsurgeon's exporter writes (the
serialized bytes compared) on every model of onnx's backend test data (node conformance cases
and model-zoo architectures), the exporter corpus and the suite's own files, as imported and
after the default pipeline rewrote them (device ops, their local functions, annotations)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
import pytest

from onnx.backend.test.case.node import collect_testcases

import graphpass
from _files import FILES, ONNX_DATA, REPO  # noqa: E402 - tests/ir/_files.py
from graphpass.ir import fast_export, fast_import
from graphpass.ir.serialize import _types_hidden

_ONNX, _REPO, _FILES = ONNX_DATA, REPO, FILES


def _bytes(export, graph):
    try:
        return export(graph).SerializeToString()
    except Exception as e:  # noqa: BLE001 - both exporters must fail alike
        return ("error", type(e).__name__)


def _both(graph: gs.Graph) -> tuple[bytes, bytes]:
    with _types_hidden(graph):
        theirs = _bytes(lambda g: gs.export_onnx(g, do_type_check=False), graph)
        ours = _bytes(fast_export.export_onnx, graph)
    return theirs, ours


def _load(path: str):
    try:
        return graphpass.load(path)
    except graphpass.GraphpassError as e:  # the suite's deliberately broken files
        pytest.skip(f"not loadable: {e}")


@pytest.mark.parametrize("path", _FILES, ids=lambda p: str(Path(p).relative_to(Path(p).parents[1])))
def test_the_same_bytes_as_graphsurgeons_exporter(path):
    model = _load(path)
    theirs, ours = _both(model.graph)
    assert ours == theirs


@pytest.mark.parametrize("path", [p for p in _FILES if "/exporters/" in p or "/light/" in p],
                         ids=lambda p: Path(p).name)
def test_the_same_bytes_after_the_default_pipeline(path):
    model = _load(path)
    graphpass.optimize(model)
    theirs, ours = _both(model.graph)
    assert ours == theirs


def test_the_same_bytes_on_every_node_case():
    cases = collect_testcases(None)
    assert len(cases) > 1000
    differ, exported = [], 0
    for case in cases:
        try:
            graph = fast_import.import_onnx(case.model)
        except Exception:  # noqa: BLE001 - what gs cannot import is not exported either
            continue
        theirs, ours = _both(graph)
        exported += isinstance(ours, bytes)
        if ours != theirs:
            differ.append(case.name)
    assert not differ, differ
    assert exported > 1000, exported


def test_a_body_is_written_into_its_attribute():
    then = gs.Graph(nodes=[], inputs=[], outputs=[gs.Constant("c", values=__import__("numpy").ones(2, "float32"))],
                    name="then")
    other = gs.Graph(nodes=[], inputs=[], outputs=[gs.Constant("d", values=__import__("numpy").zeros(2, "float32"))],
                     name="else")
    cond = gs.Variable("cond", dtype=__import__("numpy").bool_, shape=[])
    y = gs.Variable("y", dtype=__import__("numpy").float32, shape=[2])
    g = gs.Graph(nodes=[gs.Node("If", inputs=[cond], outputs=[y], attrs={"then_branch": then, "else_branch": other})],
                 inputs=[cond], outputs=[y], opset=17)
    theirs, ours = _both(g)
    assert ours == theirs
    m = onnx.ModelProto.FromString(ours)
    assert [a.name for a in m.graph.node[0].attribute] == ["then_branch", "else_branch"]
    assert m.graph.node[0].attribute[0].g.name == "then"


def _value_info_graph(tensors):
    """A graph whose inputs, outputs and value_info are ``tensors`` (each read by an Identity)."""
    import numpy as np

    nodes, outs = [], []
    for i, t in enumerate(tensors):
        o = gs.Variable(f"o{i}", dtype=np.float32, shape=[1])
        nodes.append(gs.Node("Identity", inputs=[t], outputs=[o]))
        outs.append(o)
    mid = [gs.Variable(f"m{i}", dtype=t.dtype, shape=t.shape) for i, t in enumerate(tensors) if isinstance(t, gs.Variable)]
    for i, m in enumerate(mid):
        nodes.append(gs.Node("Identity", inputs=[tensors[i]], outputs=[m]))
    return gs.Graph(nodes=nodes, inputs=[t for t in tensors if isinstance(t, gs.Variable)], outputs=outs + list(tensors),
                    opset=17)


def test_value_infos_the_same_bytes_for_every_kind_of_type_and_shape():
    import ml_dtypes
    import numpy as np

    kinds = [
        gs.Variable("none_shape", dtype=np.float32, shape=None),
        gs.Variable("scalar", dtype=np.float32, shape=[]),
        gs.Variable("named", dtype=np.int64, shape=["N", 3, None]),
        gs.Variable("tuple", dtype=np.dtype("float16"), shape=(2, 3)),
        gs.Variable("bools", dtype=np.float32, shape=[True, 2]),  # an int subclass: gs writes 1
        gs.Variable("no_dtype", dtype=None, shape=[2]),
        gs.Variable("onnx_int", dtype=onnx.TensorProto.BFLOAT16, shape=[4]),
        gs.Variable("bf16", dtype=np.dtype(ml_dtypes.bfloat16), shape=[4]),
        gs.Variable("fnuz", dtype=np.dtype(ml_dtypes.float8_e4m3fnuz), shape=[4]),  # gs's own mapping kept
        gs.Variable("seq", dtype=np.float32, shape=[2], type="sequence_type"),
        gs.Variable("sparse", dtype=np.float32, shape=[2, 2], type="sparse_tensor_type"),
        gs.Variable("numpy_dim", dtype=np.float32, shape=[np.int64(2)]),  # gs refuses it: both fail alike
        gs.Constant("const", values=np.zeros((2, 0), np.int8)),
    ]
    for t in kinds:
        theirs, ours = _both(_value_info_graph([t]))
        assert ours == theirs, t.name
    theirs, ours = _both(_value_info_graph([t for t in kinds if t.name in ("none_shape", "scalar", "named", "const")]))
    assert isinstance(ours, bytes) and ours == theirs
    m = onnx.ModelProto.FromString(ours)
    scalar = next(vi for vi in m.graph.input if vi.name == "scalar")
    assert scalar.type.tensor_type.HasField("shape") and len(scalar.type.tensor_type.shape.dim) == 0
    none = next(vi for vi in m.graph.input if vi.name == "none_shape")
    assert not none.type.tensor_type.HasField("shape")
    assert _both(_value_info_graph([kinds[-2]]))[1] == ("error", "ValueError")


def test_attributes_the_same_bytes_for_every_kind_of_value():
    """The plain values written in place (int, float, str, lists of ints or of floats) and every
    other kind (gs decides) give gs's bytes, or fail as gs fails."""
    import numpy as np

    values = [0, -3, 2 ** 40, 1.5, -0.0, float("nan"), float("inf"), 1e-45, "", "relu", "ünï", [1, 2, 3], [2 ** 62],
              [0.5, -0.0], [1, 2.5], [2.5, 1], [], [True, False], True, np.int64(3), np.float32(0.1), b"bytes",
              ["a", "b"], (1, 2), np.array([1, 2]), np.float32, [np.int64(1), 2], 2 ** 70, [2 ** 70], "\ud800",
              [1.0, float("nan")]]
    x = gs.Variable("x", dtype=np.float32, shape=[1])
    for i, v in enumerate(values):
        y = gs.Variable("y", dtype=np.float32, shape=[1])
        g = gs.Graph(nodes=[gs.Node("Custom", domain="my", inputs=[x], outputs=[y], attrs={"a": v, "b": 1})],
                     inputs=[x], outputs=[y], opset=17)
        theirs, ours = _both(g)
        assert ours == theirs, (i, v)


def _pruned(model: onnx.ModelProto, keep: set[str], annotated: set[str]) -> bytes:
    from graphpass.ir.graph import graph_protos

    for g in graph_protos(model.graph):
        vis = [vi for vi in g.value_info if vi.name in keep or vi.name in annotated]
        del g.value_info[:]
        g.value_info.extend(vis)
    return model.SerializeToString()


@pytest.mark.parametrize("path", [p for p in _FILES if "/exporters/" in p and "dynamo" in p], ids=lambda p: Path(p).name)
def test_value_infos_writes_what_pruning_keeps(path):
    """export_onnx(graph, value_infos): the full export with value_info kept for the names given
    and the annotated tensors only (serialize's save prunes to those), in the same order."""
    from graphpass.ir import annotations

    model = _load(path)
    graphpass.optimize(model)
    g = model.graph
    from graphpass.ir.graph import iter_graphs

    tensors = [t for sub in iter_graphs(g) for t in sub.tensors().values()]
    keep = set(sorted({t.name for t in tensors})[::3])
    annotated = {t.name for t in tensors if t.__dict__.get(annotations._KEY) is not None}
    full = fast_export.export_onnx(g)
    assert fast_export.export_onnx(g, keep).SerializeToString() == _pruned(full, keep, annotated)
    assert len(full.graph.value_info) > len(fast_export.export_onnx(g, set()).graph.value_info)


def test_value_infos_with_a_shared_name_writes_every_one():
    """Two distinct tensors of one name: gs's map (with its warning) and every value_info, as
    gs writes it."""
    x = gs.Variable("x", dtype="float32", shape=[2])
    a = gs.Variable("t", dtype="float32", shape=[2])
    b = gs.Variable("t", dtype="float32", shape=[2])
    y = gs.Variable("y", dtype="float32", shape=[2])
    nodes = [gs.Node("Relu", inputs=[x], outputs=[a]), gs.Node("Relu", inputs=[a], outputs=[b]),
             gs.Node("Relu", inputs=[b], outputs=[y])]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)
    full = fast_export.export_onnx(graph).SerializeToString()
    assert fast_export.export_onnx(graph, set()).SerializeToString() == full
    assert full == gs.export_onnx(graph, do_type_check=False).SerializeToString()


_TWO_NEW_DOMAINS = """
import sys
import numpy as np, onnx_graphsurgeon as gs
from graphpass.ir import fast_export
x = gs.Variable("x", dtype=np.float32, shape=[2])
mid, y = gs.Variable("m", dtype=np.float32, shape=[2]), gs.Variable("y", dtype=np.float32, shape=[2])
nodes = [gs.Node("OpB", inputs=[x], outputs=[mid], domain="zz.second"),
         gs.Node("OpA", inputs=[mid], outputs=[y], domain="aa.first")]
graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=17)
sys.stdout.write(fast_export.export_onnx(graph).SerializeToString().hex())
"""


def test_two_new_domains_are_imported_in_the_same_order_whatever_the_hash_seed():
    # gs's update_import_domains iterates a set of domain names: with string hashing randomized
    # per process, a model whose nodes use two domains it does not import came out with its
    # opset_import in either order (different bytes from the same input, run to run)
    import subprocess
    import sys

    outs = set()
    for seed in range(8):
        done = subprocess.run([sys.executable, "-c", _TWO_NEW_DOMAINS], capture_output=True, text=True,
                              env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)}, check=True)
        outs.add(done.stdout)
    assert len(outs) == 1
    model = onnx.ModelProto.FromString(bytes.fromhex(outs.pop()))
    assert [o.domain for o in model.opset_import] == ["", "aa.first", "zz.second"]
