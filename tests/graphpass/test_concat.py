"""`graphpass concat`: two models joined, outputs of the first feeding inputs of the second (issue 25,
auto_optimizer's concat_graph). Every onnx light model and every model of the exporter corpus is
cut in two with extract and joined back: the join computes the original's tensors bit for bit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphpass.check.verify import _expose_all, make_inputs, random_nodes, run, session
from graphpass.cli import main
from graphpass.concat import concat, parse_io_map
from graphpass.errors import UsageError
from graphpass.extract import extract
from graphpass.ir import serialize
from graphpass.ir.model import as_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
import _corpus  # noqa: E402
from test_evaluate_extract import MODELS, _cut, _files, _ids, run_as_fp16_runs  # noqa: E402

F = TensorProto.FLOAT


@pytest.mark.parametrize("path", MODELS, ids=_ids(MODELS))
def test_a_model_cut_in_two_and_joined_back_computes_the_same(tmp_path, path):
    original = onnx.load(str(path))
    if random_nodes(original):
        pytest.skip("random ops: the tensors differ per run")  # pragma: no cover
    cut, outs = _cut(path)
    inputs = [i.name for i in as_model(path).graph.inputs]
    crossing = [c for c in cut if c not in inputs]  # what the first part computes for the second
    if not crossing:
        pytest.skip("the cut crosses only graph inputs")  # pragma: no cover
    first = tmp_path / "first.onnx"
    second = tmp_path / "second.onnx"
    serialize.save(extract(path, inputs, crossing).graph, first)
    serialize.save(extract(path, cut, outs).graph, second)
    joined = tmp_path / "joined.onnx"
    assert main(["concat", str(first), str(second), "--io-map", ",".join(f"{c}:{c}" for c in crossing),
                 "-o", str(joined), "-q"]) == 0
    model = onnx.load(str(joined))
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == outs
    entry = next((e for e in _corpus.exported() if e["file"] == path.name), None)
    feeds = _corpus.feeds_for(entry) if entry else make_inputs(original, seed=0)[0]
    exposed, _ = _expose_all(original)
    full = {**feeds, **run_as_fp16_runs(exposed, feeds)}
    # a graph input the second part reads too is an input of the join twice (the second's prefixed)
    join_feeds = {i.name: full[i.name.removeprefix("b/")] for i in model.graph.input}
    got = run_as_fp16_runs(model, join_feeds)
    for n in outs:
        a, b = np.asarray(full[n]), np.asarray(got[n])
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), n


def _model(path: Path, nodes, ins, outs, inits=(), opset=17, external=False):
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info(n, F, s) for n, s in ins],
                          [helper.make_tensor_value_info(n, F, s) for n, s in outs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data",
                  size_threshold=0)
    else:
        onnx.save(m, str(path))
    return path


def test_a_model_joined_to_itself_gets_its_names_prefixed_and_runs_twice(tmp_path):
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 8, "w")
    p = _model(tmp_path / "m.onnx", [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                                     helper.make_node("Tanh", ["a"], ["y"], name="t")],
               [("x", [1, 4])], [("y", [1, 4])], [w])
    m = concat(p, p, "y:x")
    names = [t.name for t in m.graph.inputs + m.graph.outputs]
    assert names == ["x", "b/y"]
    assert sorted(n.name for n in m.graph.nodes) == ["b/mm", "b/t", "mm", "t"]
    out = tmp_path / "twice.onnx"
    serialize.save(m.graph, out)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    once = np.tanh(x @ (np.arange(16, dtype=np.float32).reshape(4, 4) / 8))
    got = run(session(str(out)), {"x": x})["b/y"]
    want = run(session(str(p)), {"x": run(session(str(p)), {"x": x})["y"]})["y"]
    assert got.tobytes() == want.tobytes() and np.allclose(got, np.tanh(once @ (np.arange(16).reshape(4, 4) / 8)), atol=1e-5)


def test_unconnected_outputs_and_inputs_stay_and_keep_outputs_keeps_the_connected(tmp_path):
    a = _model(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"])],
               [("x", [2])], [("r", [2]), ("n", [2])])
    b = _model(tmp_path / "b.onnx", [helper.make_node("Add", ["p", "q"], ["s"])], [("p", [2]), ("q", [2])], [("s", [2])])
    m = concat(a, b, [("r", "p")])
    assert [t.name for t in m.graph.inputs] == ["x", "q"] and [t.name for t in m.graph.outputs] == ["s", "n"]
    m = concat(a, b, [("r", "p")], keep_outputs=True)
    assert [t.name for t in m.graph.outputs] == ["s", "r", "n"]


def test_external_data_of_both_models_is_written_external(tmp_path):
    w1 = numpy_helper.from_array(np.full((64, 64), 0.5, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((64, 64), -0.25, np.float32), "w2")
    a = _model(tmp_path / "a" / "a.onnx", [helper.make_node("MatMul", ["x", "w1"], ["h"])], [("x", [1, 64])],
               [("h", [1, 64])], [w1], external=True)
    b = _model(tmp_path / "b" / "b.onnx", [helper.make_node("MatMul", ["h", "w2"], ["y"])], [("h", [1, 64])],
               [("y", [1, 64])], [w2], external=True)
    dst = tmp_path / "out" / "j.onnx"
    dst.parent.mkdir()
    assert main(["concat", str(a), str(b), "--io-map", "h:h", "-o", str(dst), "-q"]) == 0
    j = onnx.load(str(dst), load_external_data=False)
    assert all(i.data_location == TensorProto.EXTERNAL for i in j.graph.initializer)
    assert os.path.exists(str(dst) + ".data")
    x = np.ones((1, 64), np.float32)
    assert np.array_equal(run(session(str(dst)), {"x": x})["y"], np.full((1, 64), 0.5 * 64 * -0.25 * 64, np.float32))


@pytest.mark.parametrize("io_map, message", [
    ("nope:p", "'nope' is not an output of the first model"),
    ("r:nope", "'nope' is not an input of the second model"),
    ("r:p,n:p", "input 'p' of the second model is fed twice"),
    ("r", "io map entry 'r' is not OUTPUT:INPUT"),
    (",", "at least one OUTPUT:INPUT pair"),
    ("i:p", "'i' is int64 but 'p' takes float32"),
    ("w:p", "'w' has shape [3] but 'p' takes [2]"),
])
def test_bad_io_maps_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, io_map, message):
    a = _model(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"]),
                                     helper.make_node("Shape", ["x"], ["i"]), helper.make_node("Concat", ["x", "z"], ["w"], axis=0)],
               [("x", [2]), ("z", [1])], [("r", [2]), ("n", [2]), ("w", [3])])
    model = onnx.load(str(a))
    model.graph.output.append(helper.make_tensor_value_info("i", TensorProto.INT64, [1]))
    onnx.save(model, str(a))
    b = _model(tmp_path / "b.onnx", [helper.make_node("Add", ["p", "q"], ["s"])], [("p", [2]), ("q", [2])], [("s", [2])])
    before = _files(tmp_path)
    assert main(["concat", str(a), str(b), "--io-map", io_map, "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert _files(tmp_path) == before


def test_two_opset_versions_are_refused_with_the_way_out(tmp_path, capsys):
    a = _model(tmp_path / "a.onnx", [helper.make_node("Relu", ["x"], ["r"])], [("x", [2])], [("r", [2])], opset=13)
    b = _model(tmp_path / "b.onnx", [helper.make_node("Neg", ["p"], ["s"])], [("p", [2])], [("s", [2])], opset=17)
    assert main(["concat", str(a), str(b), "--io-map", "r:p", "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert "default domain at opset 13 and 17" in err and "version_converter" in err


def test_parse_io_map_forms():
    assert parse_io_map("a:b, c:d") == [("a", "b"), ("c", "d")]
    assert parse_io_map(["a:b"]) == [("a", "b")] == parse_io_map([("a", "b")])
    with pytest.raises(UsageError):
        parse_io_map("a:b:c")
