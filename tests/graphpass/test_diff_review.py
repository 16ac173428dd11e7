"""graphpass diff as a reviewer relies on it: what it reports on the corpus pairs (names, largest
differences, swaps, renames, function bodies), what it refuses (external data it must not read),
what it cannot compare, and names that would break the DOT and HTML output."""

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphpass.cli import main
from graphpass.diff import diff_models, to_html, to_json, to_text
from graphpass.diff.html import dot_source, dot_string
from graphpass.diff.views import GraphView
from graphpass.errors import BadModelError
from graphpass.testing import make_model

import diff_corpus as corpus


def _case(name):
    return next(c for c in corpus.CASES if c.name == name)


def _diff(tmp_path, name):
    a, b = _case(name).build(tmp_path)
    return diff_models(a, b, target="none")


def test_text_names_every_changed_weight_with_its_largest_difference(tmp_path):
    d = _diff(tmp_path, "big_weight_external_one_value_changed")
    assert d.weights["changed"] == ["w"]
    (w,) = d.weights["details"]
    assert w["elements_differ"] == 1 and w["max_abs_diff"] == pytest.approx(1000.0, rel=1e-6)
    assert w["dtype"] == "float" and w["shape"] == [1024, 1280]
    assert "weight w changed: max abs diff 1000 (1 element differs)" in to_text(d)


def test_two_changed_weights_are_both_named(tmp_path):
    a = corpus.mlp()
    b = corpus.mlp(w=corpus._one_value(corpus.W, 0.25, 3), b=corpus._one_value(corpus.B, -2.0, 1))
    text = to_text(diff_models(a, b, target="none"))
    assert "weight w changed: max abs diff 0.25 (1 element differs)" in text
    assert "weight b changed: max abs diff 2 (1 element differs)" in text


def test_sign_of_zero_nan_and_int64_beyond_float_precision_are_changes():
    d = diff_models(*[corpus.mlp(b=b) for b in (np.zeros(8, np.float32), -np.zeros(8, np.float32))], target="none")
    (w,) = d.weights["details"]
    assert w["elements_differ"] == 8 and w["max_abs_diff"] == 0.0
    nan = corpus.B.copy()
    nan[2] = np.nan
    d = diff_models(corpus.mlp(), corpus.mlp(b=nan), target="none")
    assert d.weights["details"][0]["nonfinite"] == 1 and not d.equivalent

    def reshape(shape):
        return make_model([helper.make_node("Add", ["x", "k"], ["y"])], {"x": (TensorProto.INT64, [1])},
                          {"y": (TensorProto.INT64, [1])}, initializers={"k": np.array(shape, np.int64)})
    d = diff_models(reshape([2**60]), reshape([2**60 + 100]), target="none")
    assert d.weights["changed"] == ["k"] and d.weights["details"][0]["elements_differ"] == 1


def test_dtype_change_of_a_weight_is_named_with_both_types(tmp_path):
    d = _diff(tmp_path, "initializer_dtype_changed")
    (w,) = d.weights["details"]
    assert w["before"] == {"dtype": "float", "shape": [8]} and w["after"] == {"dtype": "double", "shape": [8]}
    assert "weight w: float[8] -> double[8]" in to_text(d)


def test_swapped_outputs_are_reported_as_swaps(tmp_path):
    d = _diff(tmp_path, "outputs_swapped")
    ren = sorted((r["before"], r["after"], r["swapped"]) for r in d.outputs["renamed"])
    assert ren == [("y1", "y2", True), ("y2", "y1", True)]
    assert not d.outputs["added"] and not d.outputs["removed"]
    text = to_text(d)
    assert "graph output y1 now carries what y2 carried (swapped)" in text
    assert "graph output y2 now carries what y1 carried (swapped)" in text


def test_swapped_heads_are_reported_as_swaps_not_as_changed_weights(tmp_path):
    d = _diff(tmp_path, "heads_swapped")
    assert sorted((r["before"], r["after"]) for r in d.outputs["renamed"]) == [("h1", "h2"), ("h2", "h1")]
    assert not d.weights["changed"] and not d.outputs["reordered"]
    assert "another order" not in to_text(d)


def test_duplicate_nodes_listed_in_another_order_are_not_a_swap():
    a = corpus.two_outputs("Relu", "Relu")
    b = corpus._copy(a)
    nodes = list(b.graph.node)[::-1]
    del b.graph.node[:]
    b.graph.node.extend(nodes)
    d = diff_models(a, b, target="none")
    assert d.equivalent, to_text(d)


@pytest.mark.parametrize("name,kind,old,new", [("input_renamed", "inputs", "x", "x2"),
                                               ("output_renamed", "outputs", "y", "y_out")])
def test_input_and_output_renames_are_renames(tmp_path, name, kind, old, new):
    d = _diff(tmp_path, name)
    ch = getattr(d, kind)
    assert ch["renamed"] == [{"before": old, "after": new, "swapped": False}]
    assert not ch["added"] and not ch["removed"]
    assert f"graph {kind[:-1]} renamed: {old} -> {new}" in to_text(d)
    assert json.loads(to_json(d))[kind]["renamed"][0]["after"] == new


def test_function_body_is_diffed_like_a_graph(tmp_path):
    d = _diff(tmp_path, "function_body_changed")
    (f,) = d.functions
    assert f["function"] == "graphpass.ascend::FusedAct" and f["change"] == "body"
    assert [r.label for r in f["diff"].rewrites] == ["Relu → Sigmoid"]
    text = to_text(d)
    assert "function graphpass.ascend::FusedAct: body differs" in text and "Relu → Sigmoid" in text
    assert json.loads(to_json(d))["functions"][0]["diff"]["rewrites"][0]["label"] == "Relu → Sigmoid"


def test_added_removed_and_resigned_functions():
    a = corpus.with_function()
    b = corpus._copy(a)
    b.functions[0].name = "Other"
    d = diff_models(a, b, target="none")
    assert sorted((f["function"], f["change"]) for f in d.functions) == [
        ("graphpass.ascend::FusedAct", "removed"), ("graphpass.ascend::Other", "added")]
    c = corpus._copy(a)
    c.functions[0].attribute.append("alpha")
    assert [f["change"] for f in diff_models(a, c, target="none").functions] == ["signature"]


def test_loop_body_change_is_found_in_the_body(tmp_path):
    d = _diff(tmp_path, "loop_body_changed")
    (s,) = d.subgraphs
    assert s["op"] == "Loop" and s["attribute"] == "body"
    assert [r.label for r in s["diff"].rewrites] == ["Add → Sub"]


def test_split_arity_is_a_change(tmp_path):
    d = _diff(tmp_path, "split_arity_changed")
    assert [(c["op"], c["attribute"], c["before"], c["after"]) for c in d.attribute_changes] == [
        ("Split", "(outputs)", 2, 3)]


def test_storage_only_differences_are_equivalent_in_json(tmp_path):
    for name in ("default_attributes_explicit", "commutative_operands_swapped", "raw_vs_typed_fields"):
        sub = tmp_path / name
        sub.mkdir()
        out = json.loads(to_json(_diff(sub, name)))
        assert out["equivalent"] and not out["attribute_changes"] and not out["summary"]["rewired"], name


def test_default_attribute_of_an_older_opset_is_read_from_that_opset():
    # Softmax's axis default is 1 before opset 13 and -1 from 13: axis=1 written out is the default
    # only in the older opset
    def sm(opset, **kw):
        return make_model([helper.make_node("Softmax", ["x"], ["y"], **kw)], {"x": [2, 3]}, {"y": [2, 3]}, opset=opset)
    assert diff_models(sm(11), sm(11, axis=1), target="none").equivalent
    assert not diff_models(sm(13), sm(13, axis=1), target="none").equivalent


# -- what diff refuses ---------------------------------------------------------------------------

def _external_pair(tmp_path):
    a, b = _case("inline_vs_external").build(tmp_path)
    return a, b, b.parent / "w.bin"


def test_missing_external_file_is_bad_input(tmp_path, capsys):
    a, b, data = _external_pair(tmp_path)
    data.unlink()
    assert main(["diff", str(a), str(b), "--exit-code"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "after model" in err[0] and "missing" in err[0], err
    assert main(["inspect", str(b)]) == 2  # the same refusal as inspect


def test_external_file_outside_the_models_folder_is_bad_input(tmp_path, capsys):
    a, b, data = _external_pair(tmp_path)
    outside = tmp_path / "secret.bin"
    data.rename(outside)
    m = onnx.load(str(b), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../secret.bin"
    onnx.save(m, str(b))
    assert main(["diff", str(a), str(b), "--exit-code"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside the model's folder" in err[0], err
    (b.parent / "link.bin").symlink_to(outside)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "link.bin"
    onnx.save(m, str(b))
    assert main(["diff", str(b), str(a)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "before model" in err[0] and "outside the model's folder" in err[0], err


def test_truncated_external_file_is_bad_input(tmp_path, capsys):
    a, b, data = _external_pair(tmp_path)
    data.write_bytes(data.read_bytes()[:10])
    assert main(["diff", str(a), str(b)]) == 2
    assert "has only 10" in capsys.readouterr().err


def test_in_memory_model_with_external_data_is_bad_input(tmp_path):
    _, b, _ = _external_pair(tmp_path)
    m = onnx.load(str(b), load_external_data=False)
    with pytest.raises(BadModelError, match="after model"):
        diff_models(corpus.mlp(), m, target="none")


# -- what diff cannot compare ----------------------------------------------------------------------

def test_sparse_initializers_are_reported_not_taken_as_equal(tmp_path, capsys):
    def model():
        m = make_model([helper.make_node("Add", ["x", "s"], ["y"])], {"x": [4]}, {"y": [4]})
        values = numpy_helper.from_array(np.array([1.5], np.float32), "s")
        indices = numpy_helper.from_array(np.array([2], np.int64), "s_idx")
        m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
        return m
    onnx.save(model(), tmp_path / "a.onnx")
    onnx.save(model(), tmp_path / "b.onnx")
    assert main(["diff", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--exit-code", "--target", "none"]) == 1
    out = capsys.readouterr().out
    assert "no changes" not in out and "not compared: sparse initializer 's' (before)" in out
    d = diff_models(model(), model(), target="none")
    assert len(d.uncompared) == 2 and json.loads(to_json(d))["uncompared"] == d.uncompared


def test_tensor_of_a_type_numpy_cannot_hold_is_compared_by_its_bytes():
    def model(v):
        m = corpus.mlp()
        t = helper.make_tensor("odd", TensorProto.STRING, [2], [b"a", v])
        m.graph.initializer.append(t)
        return m
    assert diff_models(model(b"b"), model(b"b"), target="none").equivalent
    d = diff_models(model(b"b"), model(b"c"), target="none")
    assert d.weights["changed"] == ["odd"] and d.weights["details"][0]["max_abs_diff"] is None
    assert "weight odd changed (string[2]; values not comparable as numbers)" in to_text(d)


# -- names that break DOT and HTML -----------------------------------------------------------------

NASTY = ['a"b', "<script>alert(1)</script>", "x & y &lt;", "two\nlines", "{brace}", "back\\slash\\N", 'q" URL="x']


def _unquote_dot(s: str) -> str:
    """A DOT quoted string's text as graphviz shows it (escapes \\\\, \\", \\n; entity &amp;)."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\":
            nxt = s[i + 1]
            out.append({"n": "\n", "\\": "\\", '"': '"'}[nxt])
            i += 2
        else:
            assert s[i] != '"', s  # an unescaped quote would end the string
            out.append(s[i])
            i += 1
    return "".join(out).replace("&amp;", "&")


@pytest.mark.parametrize("name", NASTY)
def test_dot_labels_escape_every_name(name):
    assert _unquote_dot(dot_string(name)) == name
    assert "\n" not in dot_string(name)


def _nasty_model(op):
    nodes = [helper.make_node(op, ["x"], ["t0"], name=NASTY[0])]
    for k, name in enumerate(NASTY[1:], 1):
        nodes.append(helper.make_node(op, [f"t{k - 1}"], [f"t{k}"], name=name))
    return make_model(nodes, {"x": [2]}, {f"t{len(NASTY) - 1}": [2]})


def test_dot_source_and_html_page_escape_every_name():
    d = diff_models(_nasty_model("Relu"), _nasty_model("Sigmoid"), target="none")
    g = d.after
    src = dot_source(g, [(i, "core") for i in range(len(g.nodes))], [(i, i + 1) for i in range(len(g.nodes) - 1)], "added")
    labels = re.findall(r'^n\d+ \[label="((?:[^"\\]|\\.)*)", fillcolor="#[0-9a-f]{6}", class="node"\];$', src, re.M)
    assert len(labels) == len(g.nodes)  # every node one well-formed statement
    shown = [_unquote_dot(s).split("\n", 1)[1] for s in labels]
    assert shown == [n.label[-28:] for n in g.nodes]
    page = to_html(d)
    assert page.count("<script>") == 1  # the page's own
    assert "<script>alert" not in page and 'a"b' not in page and 'q" URL' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_graphview_keeps_names_as_given():
    g = GraphView(_nasty_model("Relu").graph)
    assert [n.name for n in g.nodes] == NASTY


@pytest.mark.parametrize("dtype,vals", [(TensorProto.BFLOAT16, [1.5, -2.0, 3.25]), (TensorProto.INT4, [1, -3, 7]),
                                        (TensorProto.UINT4, [1, 3, 15]), (TensorProto.FLOAT8E4M3FN, [1.0, 2.0, -0.5]),
                                        (TensorProto.FLOAT8E5M2, [1.0, 2.0, -0.5]), (TensorProto.FLOAT16, [1.0, np.nan, -0.0]),
                                        (TensorProto.BOOL, [True, False, True]), (TensorProto.UINT64, [2**63, 1, 2]),
                                        (TensorProto.COMPLEX64, [1 + 2j, 3, 4j]), (TensorProto.INT8, [-128, 0, 127])])
def test_every_dtype_compares_by_value_whatever_the_storage(dtype, vals):
    from graphpass.diff.views import largest_difference, weight_digest

    typed = helper.make_tensor("t", dtype, [3], vals, raw=False)
    raw = numpy_helper.from_array(numpy_helper.to_array(typed), "t")
    assert raw.HasField("raw_data") and not typed.HasField("raw_data")
    assert weight_digest(typed) == weight_digest(raw)
    other = helper.make_tensor("t", dtype, [3], [vals[1]] + list(vals[1:]), raw=False)
    assert weight_digest(other) != weight_digest(typed)
    diff = largest_difference(typed, other)
    assert diff["elements_differ"] == 1 and (diff["max_abs_diff"] > 0 or diff["nonfinite"] == 1)


def test_changed_constant_value_is_named_with_its_largest_difference(tmp_path):
    d = _diff(tmp_path, "constant_value_changed")
    (c,) = d.attribute_changes
    assert (c["op"], c["attribute"], c["elements_differ"], c["max_abs_diff"]) == ("Constant", "value", 4, 1.0)
    assert "(max abs diff 1, 4 elements differ)" in to_text(d)


def test_sparse_tensor_attribute_is_reported_not_taken_as_equal():
    def model():
        values = numpy_helper.from_array(np.array([1.5], np.float32), "v")
        indices = numpy_helper.from_array(np.array([2], np.int64), "i")
        sp = helper.make_sparse_tensor(values, indices, [4])
        nodes = [helper.make_node("Constant", [], ["k"], sparse_value=sp), helper.make_node("Add", ["x", "k"], ["y"])]
        return make_model(nodes, {"x": [4]}, {"y": [4]})
    d = diff_models(model(), model(), target="none")
    assert not d.equivalent and any("sparse_value" in u for u in d.uncompared)


def _if_two_outputs(then_outputs):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["o1"]), helper.make_node("Neg", ["x"], ["o2"])], "then", [],
                               [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in then_outputs])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e1"]), helper.make_node("Neg", ["x"], ["e2"])], "else", [],
                               [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("e1", "e2")])
    return make_model([helper.make_node("If", ["c"], ["y", "z"], then_branch=then_g, else_branch=else_g)],
                      {"c": (TensorProto.BOOL, []), "x": [2]}, {"y": [2], "z": [2]})


def test_body_outputs_swapped_inside_an_if_are_a_change():
    d = diff_models(_if_two_outputs(("o1", "o2")), _if_two_outputs(("o2", "o1")), target="none")
    (s,) = d.subgraphs
    assert sorted((r["name"], r["carries"], r["before"]) for r in s["diff"].outputs["rewired"]) == [
        ("o1", "o1", "o2"), ("o2", "o2", "o1")]
    assert "graph output o2 now carries the before graph's o2 instead of o1" in to_text(d)


def test_graph_outputs_in_another_order_are_a_change():
    a = corpus.two_outputs()
    b = corpus._copy(a)
    outs = list(b.graph.output)[::-1]
    del b.graph.output[:]
    b.graph.output.extend(outs)
    d = diff_models(a, b, target="none")
    assert d.outputs["reordered"] == ["y2", "y1"] and not d.outputs["renamed"] and not d.equivalent
    assert "graph outputs in another order: y2, y1" in to_text(d)


def test_equal_weights_listed_in_another_order_are_not_crossed():
    def model(order):
        nodes = [helper.make_node("Add", ["x", "b1"], ["h"]), helper.make_node("Mul", ["h", "b2"], ["y"])]
        m = make_model(nodes, {"x": [4]}, {"y": [4]}, initializers={"b1": np.zeros(4, np.float32), "b2": np.zeros(4, np.float32)})
        inits = [m.graph.initializer[i] for i in order]
        m2 = corpus._copy(m)
        del m2.graph.initializer[:]
        m2.graph.initializer.extend(inits)
        return m2
    d = diff_models(model((0, 1)), model((1, 0)), target="none")
    assert d.equivalent, to_text(d)


def test_html_with_graphviz_feeds_dot_the_escaped_source(tmp_path, monkeypatch):
    """With graphviz installed the page's pictures come from ``dot``: a stand-in ``dot`` records the
    source it is given, which must be the escaped one (every label one well-formed statement)."""
    seen = tmp_path / "seen.dot"
    fake = tmp_path / "dot"
    fake.write_text(f"#!/bin/sh\ncat >> '{seen}'\necho '<svg xmlns=\"http://www.w3.org/2000/svg\"><g class=\"node\"></g></svg>'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    page = to_html(diff_models(_nasty_model("Relu"), _nasty_model("Sigmoid"), target="none"))
    src = seen.read_text()
    labels = re.findall(r'^n\d+ \[label="((?:[^"\\]|\\.)*)", fillcolor="#[0-9a-f]{6}", class="node"\];$', src, re.M)
    assert len(labels) == 2 * len(NASTY)  # both sides, each node once
    assert {_unquote_dot(s).split("\n", 1)[1] for s in labels} == {n[-28:] for n in NASTY}
    assert '<svg class="graph before"' in page and "<script>alert" not in page
