"""`graphpass evaluate` (which rewrites would fire, nothing written) and `graphpass extract`
(the subgraph between named tensors, runnable, equal to the original's tensors): on every onnx
light model and every model of the exporter corpus."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphpass.check.verify import _expose_all, make_inputs, random_nodes, run, session
from graphpass.cli import main
from graphpass.evaluate import evaluate, evaluate_model, expand_paths
from graphpass.extract import extract
from graphpass.ir.graph import node_dependencies
from graphpass.ir.model import as_model
from graphpass.testing import make_model as _make_model


def make_model(nodes, inputs, outputs):
    """(op, inputs, outputs[, attrs]) tuples and (name, shape) lists: a checked float32 model."""
    return _make_model([onnx.helper.make_node(n[0], n[1], n[2], **(n[3] if len(n) > 3 else {})) for n in nodes],
                       dict(inputs), dict(outputs))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
import _corpus  # noqa: E402  (the corpus' manifest and its valid inputs: token ids within the vocabulary)

LIGHT = sorted((Path(onnx.__file__).parent / "backend/test/data/light").glob("*.onnx"))
CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "exporters"
CORPUS = sorted(CORPUS_DIR.glob("*.onnx"))
MODELS = LIGHT + CORPUS


def _ids(paths):
    return [p.stem for p in paths]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --- evaluate -------------------------------------------------------------------------------

def test_evaluate_lists_the_rewrites_and_writes_nothing(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(make_model([("Identity", ["x"], ["a"]), ("Relu", ["a"], ["y"])], inputs=[("x", [2, 3])],
                         outputs=[("y", [2, 3])]), str(model))
    before = _files(tmp_path)
    assert main(["evaluate", str(model), "--format", "json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["status"] == "ok" and r["nodes_before"] == 2 and r["nodes_after"] == 1
    fired = {w["pass"]: w for w in r["rewrites"]}
    assert fired["eliminate_identity"]["nodes_removed"] == 1 and fired["eliminate_identity"]["applications"] == 1
    assert "fold_batchnorm" not in fired
    assert _files(tmp_path) == before  # no output, no temporary


def test_evaluate_folder_goes_on_after_a_bad_model_and_exits_2(tmp_path, capsys):
    good = tmp_path / "a" / "good.onnx"
    good.parent.mkdir()
    onnx.save(make_model([("Relu", ["x"], ["y"])], inputs=[("x", [2])], outputs=[("y", [2])]), str(good))
    (tmp_path / "b.onnx").write_bytes(b"not a model")
    assert main(["evaluate", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "b.onnx: bad-model: " in out and "good.onnx: nodes 1 -> 1" in out
    assert "2 model(s): 1 evaluated, 1 failed; nothing written" in out


@pytest.mark.parametrize("args, message", [
    (["/no/such/model.onnx"], "no such file or folder"),
    (["{tmp}/*.nothing"], "no file matches"),
    (["{tmp}"], "no .onnx file in folder"),
    (["{model}", "--passes", "no_such_pass"], "no_such_pass"),
    (["{model}", "--target", "no_such_target"], "no_such_target"),
])
def test_evaluate_bad_arguments_are_one_line_exit_2(tmp_path, capsys, args, message):
    model = tmp_path / "m.onnx"
    onnx.save(make_model([("Relu", ["x"], ["y"])], inputs=[("x", [2])], outputs=[("y", [2])]), str(model))
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [a.format(tmp=empty, model=model) for a in args]
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_expand_paths_dedups_and_orders(tmp_path):
    for n in ("b.onnx", "a.onnx", "sub/c.onnx"):
        (tmp_path / n).parent.mkdir(exist_ok=True)
        (tmp_path / n).write_bytes(b"")
    got = expand_paths([tmp_path, tmp_path / "a.onnx", str(tmp_path / "*.onnx")])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == ["a.onnx", "b.onnx", "sub/c.onnx"]


def test_evaluate_every_corpus_and_light_model():
    results = list(evaluate(MODELS))
    assert len(results) == len(MODELS)
    bad = [(r["model"], r["error"]) for r in results if r["status"] != "ok"]
    assert not bad
    assert any(r["rewrites"] for r in results)
    for r in results:  # the gain is the estimates' (a Loop whose trip count shape folding reveals may cost more)
        if r["cost_before_us"]:
            assert r["gain_pct"] == pytest.approx(100 * (r["cost_before_us"] - r["cost_after_us"]) / r["cost_before_us"])
        assert sum(w["nodes_removed"] for w in r["rewrites"]) == r["nodes_before"] - r["nodes_after"], r["model"]


def test_evaluate_model_never_raises_on_a_bad_model(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"\x08\x07garbage")
    r = evaluate_model(p)
    assert r["status"] == "bad-model" and r["exit_code"] == 2 and r["error"]


# --- extract --------------------------------------------------------------------------------

def _cut(path: Path) -> tuple[list[str], list[str]]:
    """A typed output two thirds of the way in (or the nearest after it that depends on more than
    constants) and the tensors that cross the cut a third of the way in."""
    g = as_model(path).graph
    nodes = list(g.nodes)
    pos = {id(n): i for i, n in enumerate(nodes)}
    producer = {id(t): n for n in nodes for t in n.outputs}
    i = len(nodes) // 3
    order = list(range(2 * len(nodes) // 3, len(nodes))) + list(range(2 * len(nodes) // 3 - 1, i, -1))
    for j in order:
        out = nodes[j].outputs[0] if nodes[j].outputs else None
        if out is None or not out.name or out.dtype is None:
            continue
        inputs: list[str] = []
        seen, stack = set(), [out]
        while stack:
            t = stack.pop()
            if id(t) in seen or not t.name:
                continue
            seen.add(id(t))
            if t.__class__.__name__ == "Constant":
                continue
            n = producer.get(id(t))
            if n is None or pos[id(n)] <= i:
                if t.name not in inputs and t is not out:
                    inputs.append(t.name)
                continue
            stack.extend(node_dependencies(n))
        if inputs:
            return inputs, [out.name]
    raise AssertionError(f"no cut in {path.name}")


@pytest.mark.parametrize("path", MODELS, ids=_ids(MODELS))
def test_extract_equals_the_original_tensors(tmp_path, path):
    ins, outs = _cut(path)
    dst = tmp_path / "sub.onnx"
    assert main(["extract", str(path), "--input-names", ",".join(ins), "--output-names", ",".join(outs),
                 "-o", str(dst), "-q"]) == 0
    sub = onnx.load(str(dst))
    onnx.checker.check_model(sub, full_check=True)
    assert [i.name for i in sub.graph.input] == ins and [o.name for o in sub.graph.output] == outs
    original = onnx.load(str(path))
    assert len(sub.graph.node) < len(original.graph.node)
    exposed, _ = _expose_all(original)
    entry = next((e for e in _corpus.exported() if e["file"] == path.name), None)
    feeds = _corpus.feeds_for(entry) if entry else make_inputs(original, seed=0)[0]
    if random_nodes(original):
        pytest.skip("random ops: the tensors differ per run")  # pragma: no cover
    full = {**feeds, **run_as_fp16_runs(exposed, feeds)}
    got = run_as_fp16_runs(sub, {n: full[n] for n in ins})
    for n in outs:
        a, b = np.asarray(full[n]), np.asarray(got[n])
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), n


def run_as_fp16_runs(model: "onnx.ModelProto | str", feeds) -> dict:
    """Outputs of ``model`` with every float16 tensor rounded to float16 (graphpass's fp16
    emulation): onnxruntime's CPU provider otherwise computes a chain of float16 ops in float32
    and rounds only where a tensor is an output, so exposing a tensor would change the bits."""
    from graphpass.check.fp16 import Emulated

    if isinstance(model, str):
        model = onnx.load(model)
    em = Emulated(model, session)
    return em.outputs(run(em.session, em.feeds(feeds)))


def _chain(tmp_path) -> Path:
    p = tmp_path / "c.onnx"
    onnx.save(make_model([("Relu", ["x"], ["a"]), ("Neg", ["a"], ["b"]), ("Add", ["b", "z"], ["y"])],
                         inputs=[("x", [2]), ("z", [2])], outputs=[("y", [2])]), str(p))
    return p


@pytest.mark.parametrize("ins, outs, message", [
    ("nope", "y", "no tensor named 'nope'"),
    ("a", "nope", "no tensor named 'nope'"),
    ("a", "y", "need 'z', a graph input that is not among the inputs: add it to --input-names"),
    ("a", "a", "named both as an input and as an output"),
    ("a,a", "y", "named twice"),
    (",", "y", "at least one input"),
])
def test_extract_refuses_with_one_line_and_writes_nothing(tmp_path, capsys, ins, outs, message):
    p = _chain(tmp_path)
    before = _files(tmp_path)
    assert main(["extract", str(p), "--input-names", ins, "--output-names", outs, "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert _files(tmp_path) == before


def test_extract_refuses_an_input_whose_producer_is_needed(tmp_path, capsys):
    p = tmp_path / "s.onnx"
    onnx.save(make_model([("Split", ["x"], ["a", "b"], {"axis": 0}), ("Add", ["a", "b"], ["y"])],
                         inputs=[("x", [4])], outputs=[("y", [2])]), str(p))
    assert main(["extract", str(p), "--input-names", "a", "--output-names", "y", "-o", str(tmp_path / "o.onnx")]) == 2
    assert "name that node's inputs instead" in capsys.readouterr().err


def test_extract_keeps_a_subgraphs_captured_tensor(tmp_path):
    """An If branch reads an outer tensor: the node computing it is kept."""
    from onnx import TensorProto, helper

    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    p = tmp_path / "if.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    m = extract(p, "x,c", "y")
    assert sorted(n.op for n in m.graph.nodes) == ["If", "Relu"]


def test_extract_external_data_stays_external(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                           helper.make_node("Neg", ["b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    src = tmp_path / "src" / "m.onnx"
    src.parent.mkdir()
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(src), save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    dst = tmp_path / "out" / "sub.onnx"
    dst.parent.mkdir()
    assert main(["extract", str(src), "--input-names", "x", "--output-names", "b", "-o", str(dst), "-q"]) == 0
    sub = onnx.load(str(dst), load_external_data=False)
    assert [n.op_type for n in sub.graph.node] == ["MatMul", "Relu"]
    assert sub.graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert os.path.exists(str(dst) + ".data")
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    exposed, _ = _expose_all(onnx.load(str(src)))
    want = run(session(exposed), {"x": x})["b"]
    got = run(session(str(dst)), {"x": x})["b"]
    assert got.tobytes() == want.tobytes()
