"""``graphpass textconv``: deterministic, canonical, line-oriented; never values; hostile files."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphpass.diff.textconv import FORMAT, MAX_DEPTH, textconv
from graphpass.errors import BadModelError
from graphpass.testing import make_model

from gitrepo import conv_bn_model, graphpass_cmd, shuffled


def _run(*args, cwd=None):
    return subprocess.run(graphpass_cmd(*args), capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("canonical", [False, True])
def test_byte_identical_for_the_same_model_saved_in_another_order(tmp_path, canonical):
    m = conv_bn_model(blocks=100)
    m.metadata_props.add(key="b", value="2")
    m.metadata_props.add(key="a", value="1")
    onnx.save(m, tmp_path / "a.onnx")
    onnx.save(shuffled(m, seed=7), tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() != (tmp_path / "b.onnx").read_bytes()
    flag = ["--canonical-names"] if canonical else []
    a, b = _run("textconv", *flag, str(tmp_path / "a.onnx")), _run("textconv", *flag, str(tmp_path / "b.onnx"))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.encode() == b.stdout.encode()
    assert a.stdout.startswith(FORMAT)
    assert len(a.stdout.splitlines()) == 7 + 300 + 500 + 2  # header, one line a node, one an initializer
    assert "float32[1,4,8,8]" in a.stdout.splitlines()[-510]  # shapes inferred where the file has none


def test_branches_tie_break_independent_of_file_order():
    """Two independent branches: the exporter may write either first."""
    n = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["x"], ["b"], name="n"),
         helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    m1 = make_model(n, {"x": [2]}, {"y": [2]})
    m2 = make_model([n[1], n[0], n[2]], {"x": [2]}, {"y": [2]})
    assert textconv(m1) == textconv(m2)
    assert textconv(m1, True) == textconv(m2, True)


def test_canonical_names_make_a_rename_only_re_export_identical():
    def model(prefix):
        nodes = [helper.make_node("Conv", ["x", f"{prefix}w"], [f"{prefix}c"], name=f"{prefix}conv"),
                 helper.make_node("Relu", [f"{prefix}c"], [f"{prefix}r"], name=f"{prefix}relu"),
                 helper.make_node("Sigmoid", [f"{prefix}r"], ["y"], name=f"{prefix}sig")]
        return make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]},
                          {f"{prefix}w": np.ones((2, 2, 1, 1), np.float32)})
    a, b = model("onnx::"), model("/model/block.0/")
    assert textconv(a) != textconv(b)
    assert textconv(a, canonical_names=True) == textconv(b, canonical_names=True)
    text = textconv(b, canonical_names=True)
    assert "/model/block" not in text and "conv0.w1" in text and "relu0" in text
    # graph inputs and outputs keep their names: they are the signature
    assert "input x float32[1,2,4,4]" in text and "-> (y: float32[1,2,4,4])" in text


def test_never_prints_values_and_hashes_by_content(tmp_path):
    w = np.full((3, 3), 1234.5678, np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [3, 3]}, {"y": [3, 3]}, {"w": w})
    text = textconv(m)
    assert "1234" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("init w "))
    # the same values in float_data instead of raw_data, and in external data: the same hash
    typed = onnx.ModelProto()
    typed.CopyFrom(m)
    t = typed.graph.initializer[0]
    t.ClearField("raw_data")
    t.float_data.extend(w.reshape(-1).tolist())
    assert next(ln for ln in textconv(typed).splitlines() if ln.startswith("init w ")) == line
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    ext = textconv(tmp_path / "ext.onnx")
    ext_line = next(ln for ln in ext.splitlines() if ln.startswith("init w "))
    assert ext_line == line.replace(" blake2b:", " external:weights.bin blake2b:")
    # a changed value changes exactly that line
    w2 = w.copy()
    w2[2, 2] = -0.0
    m2 = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [3, 3]}, {"y": [3, 3]}, {"w": w2})
    diff = [(x, y) for x, y in zip(text.splitlines(), textconv(m2).splitlines()) if x != y]
    assert len(diff) == 1 and diff[0][0] == line


def test_external_data_missing_next_to_the_model_still_prints(tmp_path):
    """git hands textconv a temporary copy of an old blob: its external data is not beside it."""
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [3, 3]}, {"y": [3, 3]},
                   {"w": np.ones((3, 3), np.float32)})
    onnx.save(m, tmp_path / "ext.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").unlink()
    p = _run("textconv", str(tmp_path / "ext.onnx"))
    assert p.returncode == 0, p.stderr
    assert "# warning: external data not read" in p.stdout
    assert "init w float32[3,3] external:w.bin hash unavailable" in p.stdout
    assert str(tmp_path) not in p.stdout  # no temp path in the text: it would differ on every run


def test_subgraphs_indented_under_their_node_and_functions_listed():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    f = helper.make_function("my.dom", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                             [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("If", ["c"], ["i"], name="if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Twice", ["i"], ["y"], domain="my.dom", name="tw")]
    m = make_model(nodes, {"x": [2], "c": (TensorProto.BOOL, [])}, {"y": [2]}, functions=[f],
                   extra_opsets={"my.dom": 1})
    lines = textconv(m).splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("If if "))
    assert lines[k + 1] == "  graph else_branch:"
    assert lines[k + 2].startswith("    output e ") and lines[k + 3].startswith("    Neg ")
    assert "  graph then_branch:" in lines
    assert any(ln.startswith("my.dom::Twice (function) tw ") for ln in lines)
    j = lines.index("function my.dom::Twice(a) -> (b)")
    assert lines[j + 1].startswith("  Add (a: ?, a: ?) -> (b: ?)")


def test_schema_defaults_written_out_do_not_show():
    a = make_model([helper.make_node("LeakyRelu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
    b = make_model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.01)], {"x": [2]}, {"y": [2]})
    c = make_model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": [2]}, {"y": [2]})
    assert textconv(a) == textconv(b) != textconv(c)
    assert "alpha=0.20000000298023224" in textconv(c)


def test_hostile_files(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07\x12\xff\xff\xff\xff\x0f")
    p = _run("textconv", str(junk))
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    p = _run("textconv", "--lenient", str(junk))
    assert p.returncode == 0 and "# not an ONNX model" in p.stdout and "8 bytes blake2b:" in p.stdout
    assert str(tmp_path) not in p.stdout
    p = _run("textconv", str(tmp_path))  # a folder
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = _run("textconv", str(tmp_path / "missing.onnx"))
    assert p.returncode == 2 and "no such file" in p.stderr


def test_cycle_and_dangling_inputs_still_print():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2"),
             helper.make_node("Relu", ["nowhere"], ["y"], name="r3")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    text = textconv(m)
    assert "# warning: invalid model" in text and "# cycle" in text
    assert sum(ln.startswith("Relu ") for ln in text.splitlines()) == 3


def _varint(v: int) -> bytes:
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _nested_if_model(depth: int) -> bytes:
    """A model whose If bodies nest ``depth`` deep, written on the wire (onnx.helper cannot build
    one past protobuf's depth limit)."""
    graph = _field(1, _field(4, b"Identity"))
    for _ in range(depth):
        attr = _field(1, b"then_branch") + _varint(20 << 3) + _varint(AttributeProto_GRAPH) + _field(6, graph)
        graph = _field(1, _field(4, b"If") + _field(5, attr))
    return _varint(1 << 3) + _varint(8) + _field(7, graph) + _field(8, _field(2, _varint(17)))


AttributeProto_GRAPH = onnx.AttributeProto.GRAPH


@pytest.mark.parametrize("depth", [20, MAX_DEPTH + 5, 400])
def test_deep_nesting_prints_or_is_refused_in_one_line(tmp_path, depth):
    (tmp_path / "deep.onnx").write_bytes(_nested_if_model(depth))
    p = _run("textconv", str(tmp_path / "deep.onnx"))
    assert "Traceback" not in p.stderr
    if depth == 20:
        assert p.returncode == 0, p.stderr
        assert p.stdout.count("graph then_branch:") == 20
    else:
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8, TensorProto.BOOL,
                                   TensorProto.STRING, TensorProto.FLOAT8E4M3FN, TensorProto.INT4])
def test_every_weight_dtype_prints_a_hash(dtype):
    if dtype == TensorProto.STRING:
        t = helper.make_tensor("w", dtype, [2], [b"a", b"b"])
    elif dtype == TensorProto.BOOL:
        t = helper.make_tensor("w", dtype, [2], [True, False])
    else:
        t = helper.make_tensor("w", dtype, [2], [1, 2])
    g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", dtype, [2])], initializer=[t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    line = next(ln for ln in textconv(m).splitlines() if ln.startswith("init w "))
    assert "[2] blake2b:" in line


def test_names_cannot_break_the_one_line_a_node_form():
    n = helper.make_node("Relu", ["x"], ["a\nb"], name="evil\nname")
    g = helper.make_graph([n, helper.make_node("Identity", ["a\nb"], ["y"])], "g\nx",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.metadata_props.add(key="k\n", value="v\nw")
    lines = textconv(m).splitlines()
    assert 'Relu "evil\\nname" (x: float32[1]) -> ("a\\nb": float32[1])' in lines
    assert len(lines) == 9  # format, ir_version, opset, metadata, graph, input, output, 2 nodes: none split
