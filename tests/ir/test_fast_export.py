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
