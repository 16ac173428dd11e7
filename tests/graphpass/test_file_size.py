"""The written file does not grow (issue 20): weights read in several graphs stored once, no
value_info the input did not have, folding that grows only under --fold-growing, identical
initializers shared; the neutral pipeline on every light model and committed corpus file."""

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import graphpass as gp
from graphpass.cli import main
from graphpass.testing import assert_equivalent, check_full, ort_run

from conftest import LIGHT_DIR, LIGHT_MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "exporters", "**", "*.onnx"), recursive=True))


def _initializer_names(model: onnx.ModelProto) -> list[str]:
    from graphpass.ir.graph import graph_protos

    return [t.name for g in graph_protos(model.graph) for t in g.initializer]


def _if_model(weight_in_main: bool = True, const_nodes: bool = True) -> onnx.ModelProto:
    """z = If(sum(x) > 0, x @ Wt @ W, x @ We @ W) @ W, W (64 KiB) read in both bodies; V (the
    same in both bodies) a weight of the main graph that only the bodies read."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((128, 128)).astype(np.float32)
    V = rng.standard_normal((128,)).astype(np.float32)

    def body(tag):
        nodes, inits = [], []
        w = rng.standard_normal((128, 128)).astype(np.float32)
        if const_nodes and tag == "then":
            nodes.append(helper.make_node("Constant", [], [f"{tag}_w"], value=nh.from_array(w, f"{tag}_w")))
        else:
            inits.append(nh.from_array(w, f"{tag}_w"))
        nodes += [helper.make_node("MatMul", ["x", f"{tag}_w"], [f"{tag}_a"]),
                  helper.make_node("MatMul", [f"{tag}_a", "W"], [f"{tag}_b"]),
                  helper.make_node("Add", [f"{tag}_b", "V"], [f"{tag}_y"])]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", T.FLOAT, None)],
                                 initializer=inits)

    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=body("then"), else_branch=body("else"))]
    nodes.append(helper.make_node("MatMul", ["y", "W"], ["z"]) if weight_in_main else helper.make_node("Relu", ["y"], ["z"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 128])],
                          [helper.make_tensor_value_info("z", T.FLOAT, [4, 128])],
                          initializer=[nh.from_array(W, "W"), nh.from_array(V, "V"),
                                       nh.from_array(np.array(0, np.float32), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _same_outputs_both_branches(before, after):
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    for sign in (1.0, -1.0):
        feeds = {"x": np.abs(x) * sign}
        a, b = ort_run(before, feeds), ort_run(after, feeds)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("weight_in_main", [True, False])
def test_a_weight_read_in_both_if_branches_is_written_once_and_valid(tmp_path, weight_in_main):
    """Before: gs wrote W into each body's initializers; save left the body copies of a weight
    over 1 KiB as data-less headers (an invalid model), to_proto stored it three times."""
    model = _if_model(weight_in_main)
    src = tmp_path / "if.onnx"
    onnx.save(model, src)
    loaded = gp.load(str(src))
    for written in (gp.to_proto(loaded), None):
        if written is None:
            loaded.save(tmp_path / "out.onnx")
            written = onnx.load(tmp_path / "out.onnx")
        names = _initializer_names(written)
        assert sorted(names) == sorted(set(names)), names
        assert names.count("W") == 1 and names.count("V") == 1
        check_full(written)
        _same_outputs_both_branches(model, written)
    assert os.path.getsize(tmp_path / "out.onnx") <= os.path.getsize(src) * 1.01  # the bodies' output shapes


def test_the_neutral_pipeline_on_if_bodies_does_not_grow_the_file(tmp_path):
    src = tmp_path / "if.onnx"
    onnx.save(_if_model(), src)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    assert os.path.getsize(out) <= os.path.getsize(src) * 1.01
    _same_outputs_both_branches(onnx.load(src), onnx.load(out))


def test_value_info_is_written_only_for_what_the_input_declared(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])],
                          value_info=[helper.make_tensor_value_info("b", T.FLOAT, None)])
    src = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    gp.load(src).save(tmp_path / "o.onnx")
    out = onnx.load(tmp_path / "o.onnx")
    assert [vi.name for vi in out.graph.value_info] == ["b"]
    assert [d.dim_value for d in out.graph.value_info[0].type.tensor_type.shape.dim] == [2, 3]  # what is known now


def _weight_fill_model():
    """A light-model weight fill: ConstantOfShape([64, 64], 0.02) -> MatMul."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], value=helper.make_tensor("v", T.FLOAT, [1], [0.02])),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 64])],
                          initializer=[nh.from_array(np.array([64, 64], np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_weight_fill_folds_only_under_fold_growing(tmp_path):
    src = tmp_path / "fill.onnx"
    onnx.save(_weight_fill_model(), src)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    kept = onnx.load(out)
    assert [n.op_type for n in kept.graph.node] == ["ConstantOfShape", "MatMul"]
    assert os.path.getsize(out) <= os.path.getsize(src)
    grown = tmp_path / "grown.onnx"
    assert main(["optimize", str(src), "-o", str(grown), "--pipeline", "neutral", "-q", "--fold-growing"]) == 0
    folded = onnx.load(grown)
    assert [n.op_type for n in folded.graph.node] == ["MatMul"]
    assert os.path.getsize(grown) > 64 * 64 * 4
    assert_equivalent(onnx.load(src), folded, exact=True)
    # the limit still caps a growing fold
    capped = tmp_path / "capped.onnx"
    assert main(["optimize", str(src), "-o", str(capped), "--pipeline", "neutral", "-q", "--fold-growing",
                 "--fold-size-limit", "1024"]) == 0
    assert [n.op_type for n in onnx.load(capped).graph.node] == ["ConstantOfShape", "MatMul"]


def _light_and_corpus():
    return [os.path.join(LIGHT_DIR, n) for n in LIGHT_MODELS] + CORPUS


def _stored_bytes(path: str) -> int:
    """The model file plus every external data file it names."""
    total = os.path.getsize(path)
    m = onnx.load(path, load_external_data=False)
    from onnx.external_data_helper import _get_all_tensors

    files = {e.value for t in _get_all_tensors(m) for e in t.external_data if e.key == "location"}
    return total + sum(os.path.getsize(os.path.join(os.path.dirname(path), f)) for f in files)


@pytest.mark.parametrize("path", _light_and_corpus(), ids=os.path.basename)
def test_the_neutral_pipeline_never_grows_a_real_model_by_more_than_one_percent(path, tmp_path):
    out = tmp_path / "out.onnx"
    assert main(["optimize", path, "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    before, after = _stored_bytes(path), _stored_bytes(str(out))
    assert after <= before * 1.01, (before, after)


@pytest.mark.parametrize("value", ["-1", "-1048576"])
def test_a_negative_fold_size_limit_is_one_line_exit_2(tmp_path, capsys, value):
    """--fold-size-limit -1 was taken (as 'fold nothing that grows') without a word."""
    src = tmp_path / "fill.onnx"
    onnx.save(_weight_fill_model(), src)
    out = tmp_path / "out.onnx"
    with pytest.raises(SystemExit) as e:  # argparse's own one-line error
        main(["optimize", str(src), "-o", str(out), "--fold-growing", "--fold-size-limit", value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fold-size-limit" in err[0], err
    assert not out.exists()
