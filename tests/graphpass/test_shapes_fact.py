"""Shapes are a fact graphpass keeps true (issue 20): the exporter's value_info never wins over
shape inference, --input-shape / --dim replace it, and shapes are re-inferred after passes.

The models are hand-written the way torch's TorchScript exporter writes them: a dynamic batch
``batch_size``, ``torch.chunk`` as two Slices whose bounds come from ``Shape``, a channel
shuffle ``view(b, g, c // g, h, w)`` with every dim taken from ``x.size()``, and value_info
with the exporter's own dim names for the tensors it could not size.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.errors import UsageError
from graphpass.ir import shapes as S
from graphpass.testing import assert_equivalent, check_full, make_model, ops

C, HW = 8, 4
INT_MAX = np.iinfo(np.int64).max


def _i(v):
    return np.array(v, np.int64)


def _chunk_shuffle_model(value_info: bool = True, extra_inputs: bool = False) -> onnx.ModelProto:
    """x -> chunk(2, dim=1) -> (a, relu(b)) -> cat -> channel shuffle (groups 2) -> y."""
    n = helper.make_node
    nodes = [
        # torch.chunk(x, 2, 1): the split point is Shape(x)[1] / 2
        n("Shape", ["x"], ["s"]), n("Gather", ["s", "one"], ["c"], axis=0),
        n("Add", ["c", "one"], ["c1"]), n("Div", ["c1", "two"], ["half"]),
        n("Unsqueeze", ["half", "ax0"], ["half1"]),
        n("Slice", ["x", "zero1", "half1", "ax1"], ["a"]),
        n("Slice", ["x", "half1", "big1", "ax1"], ["b"]),
        n("Relu", ["b"], ["rb"]),
        n("Concat", ["a", "rb"], ["cat"], axis=1),
        # x.view(b, 2, c // 2, h, w) with b, c, h, w = cat.size()
        n("Shape", ["cat"], ["s2"]),
        n("Gather", ["s2", "zero"], ["nb"], axis=0), n("Gather", ["s2", "one"], ["nc"], axis=0),
        n("Gather", ["s2", "two"], ["nh"], axis=0), n("Gather", ["s2", "three"], ["nw"], axis=0),
        n("Div", ["nc", "two"], ["cg"]),
        n("Unsqueeze", ["nb", "ax0"], ["nb1"]), n("Unsqueeze", ["cg", "ax0"], ["cg1"]),
        n("Unsqueeze", ["nh", "ax0"], ["nh1"]), n("Unsqueeze", ["nw", "ax0"], ["nw1"]),
        n("Concat", ["nb1", "two1", "cg1", "nh1", "nw1"], ["shape5"], axis=0),
        n("Reshape", ["cat", "shape5"], ["r5"]),
        n("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        n("Concat", ["nb1", "minus1", "nh1", "nw1"], ["shape4"], axis=0),
        n("Reshape", ["t5", "shape4"], ["y"]),
    ]
    inits = {"zero": _i(0), "one": _i(1), "two": _i(2), "three": _i(3), "ax0": _i([0]), "ax1": _i([1]),
             "zero1": _i([0]), "big1": _i([INT_MAX]), "two1": _i([2]), "minus1": _i([-1])}
    vi = []
    if value_info:  # what the exporter wrote: its own names for every dim it could not size
        def v(name, dims, elem=TensorProto.FLOAT):
            vi.append(helper.make_tensor_value_info(name, elem, dims))
        v("a", ["batch_size", "Slice_a_dim_1", HW, HW])
        v("b", ["batch_size", "Slice_b_dim_1", HW, HW])
        v("rb", ["batch_size", "Relu_rb_dim_1", HW, HW])
        v("cat", ["batch_size", "Concat_cat_dim_1", HW, HW])
        v("r5", ["Reshape_r5_dim_0", "Reshape_r5_dim_1", "Reshape_r5_dim_2", "Reshape_r5_dim_3", "Reshape_r5_dim_4"])
        v("t5", ["Transpose_t5_dim_0", "Transpose_t5_dim_1", "Transpose_t5_dim_2", "Transpose_t5_dim_3",
                 "Transpose_t5_dim_4"])
        v("half", [], TensorProto.INT64)
    inputs = {"x": ["batch_size", C, HW, HW]}
    outputs = {"y": ["Reshape_y_dim_0", "Reshape_y_dim_1", "Reshape_y_dim_2", "Reshape_y_dim_3"]}
    if extra_inputs:  # a second input sharing the batch dim
        nodes.append(n("Relu", ["m"], ["ym"]))
        inputs["m"] = ["batch_size", 3]
        outputs["ym"] = ["batch_size", 3]
    return make_model(nodes, inputs, outputs, initializers=inits, value_info=vi)


def _feeds(batch: int, extra: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((batch, C, HW, HW)).astype(np.float32)}
    feeds["x"][0, 0, 0, :3] = [np.nan, -0.0, np.inf]
    if extra:
        feeds["m"] = rng.standard_normal((batch, 3)).astype(np.float32)
    return feeds


PIPELINE = ["specialize_shapes", "fold_constants", "eliminate_dead_nodes", "fuse_channel_shuffle"]


def _run(model, **kw):
    result = gp.optimize(model, passes=PIPELINE, target="none", **kw)
    return result, gp.to_proto(result.model)


@pytest.mark.parametrize("style", ["names", "traced"])
def test_input_shape_on_exporter_value_info_folds_as_much_as_without_it(style):
    """The Done-when item of issue 20, on a small graph: the exporter's value_info (its own dim
    names, or the numbers it traced at batch 1) changes nothing once --input-shape fixed the
    input: the same nodes, the same shapes (before: the traced numbers stayed)."""
    runs = {}
    for name, make in (("with", _chunk_shuffle_model if style == "names" else _traced_at_batch_one),
                       ("without", lambda: _chunk_shuffle_model(value_info=False))):
        result, out = _run(make(), input_shapes={"x": [2, C, HW, HW]})
        runs[name] = (ops(result.model.graph), {t.name: t.shape for n in result.model.graph.nodes for t in n.outputs})
        assert_equivalent(make(), out, feeds=_feeds(2), exact=True)
    assert runs["with"] == runs["without"]
    assert runs["with"][0] == ["Slice", "Slice", "Relu", "Concat", "Gather"]  # the shuffle fused
    assert runs["with"][1]["cat"] == [2, C, HW, HW]


def test_no_tensor_keeps_a_stale_shape_after_folding():
    """After fold_constants made the Slices static, every shape is re-inferred: none keeps the
    exporter's dim names or onnx's unk__ (before: 'a' stayed ['unk__0', ...])."""
    result, out = _run(_chunk_shuffle_model(), input_shapes={"x": [1, C, HW, HW]})
    graph = result.model.graph
    assert S.count_unresolved(graph) == 0
    for t in [t for n in graph.nodes for t in n.outputs]:
        assert all(isinstance(d, int) for d in t.shape), (t.name, t.shape)
    declared = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
                for vi in list(out.graph.value_info) + list(out.graph.output)}
    assert declared["a"] == [1, C // 2, HW, HW] and declared["y"] == [1, C, HW, HW]
    check_full(out)


def test_manager_reinfers_shapes_after_a_round_that_left_them_stale():
    """A pass that changes the graph without re-inferring (here CSE merging equal constants)
    leaves the exporter's names; the manager infers shapes again at the end of the round."""
    graph = gp.load(_chunk_shuffle_model(), input_shapes={"x": [2, C, HW, HW]}).graph
    gp.optimize(graph, passes=["fold_constants"], target="none")
    assert S.count_unresolved(graph) == 0
    assert graph.outputs[0].shape == [2, C, HW, HW]


def test_with_static_inputs_the_declared_numbers_are_kept():
    """All inputs static: the exporter traced the only shapes there are, so a number inference
    cannot tell (a Slice whose bounds come from Shape) is taken from the value_info and kept
    through a refresh; with a dynamic input it is not (see the traced-at-batch-1 tests)."""
    model = _chunk_shuffle_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    graph = gp.load(model).graph
    gp.optimize(graph, passes=["eliminate_common_subexpressions"], target="none")
    a = next(t for n in graph.nodes for t in n.outputs if t.name == "a")
    assert a.shape[2:] == [HW, HW]
    graph = gp.load(_traced_at_batch_one()).graph
    a = next(t for n in graph.nodes for t in n.outputs if t.name == "a")
    assert a.shape[0] == "batch_size"  # not the traced 1 (the h, w come from the Slice rule)


@pytest.mark.parametrize("where", ["load", "pass"])
def test_dim_fixes_a_symbol_on_every_input_and_tensor(where):
    model = _chunk_shuffle_model(extra_inputs=True)
    if where == "load":
        result, out = _run(model, dims={"batch_size": 3})
    else:
        result, out = _run(gp.load(model), dims={"batch_size": 3})
    graph = result.model.graph
    assert [t.shape for t in graph.inputs] == [[3, C, HW, HW], [3, 3]]
    assert [t.shape for t in graph.outputs] == [[3, C, HW, HW], [3, 3]]
    assert "Gather" in ops(graph) and "Transpose" not in ops(graph)
    assert S.given_shapes(graph)["dims"] == {"batch_size": 3}
    assert_equivalent(model, out, feeds=_feeds(3, extra=True), exact=True)


def test_input_shape_fixes_a_shared_symbol_on_the_other_inputs_too():
    result, _ = _run(_chunk_shuffle_model(extra_inputs=True), input_shapes={"x": [4, C, HW, HW]})
    assert [t.shape for t in result.model.graph.inputs] == [[4, C, HW, HW], [4, 3]]


def test_minus_one_keeps_a_dim_dynamic():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3, "H", "W"]}, {"y": ["N", 3, "H", "W"]})
    graph = gp.load(model, input_shapes={"x": [1, 3, -1, -1]}).graph
    assert graph.inputs[0].shape == [1, 3, "H", "W"]
    assert graph.outputs[0].shape == [1, 3, "H", "W"]
    graph = gp.load(model).graph
    gp.optimize(graph, passes=["specialize_shapes"], input_shapes={"x": [-1, 3, 5, -1]}, target="none")
    assert graph.inputs[0].shape == ["N", 3, 5, "W"]


@pytest.mark.parametrize("kw, message", [
    ({"dims": {"batch": 1}}, "no symbolic dim of a graph input .*batch_size"),
    ({"dims": {"batch_size": 0}}, "must be in 1..2"),
    ({"dims": {"batch_size": -1}}, "must be in 1..2"),
    ({"dims": {"batch_size": 1.5}}, "positive integer"),
    ({"dims": {"batch_size": 1}, "input_shapes": {"x": [2, C, HW, HW]}}, "is 2, but the dim 'batch_size' is given as 1"),
    ({"input_shapes": {"x": [2, C, HW, HW], "m": [3, 3]}}, "'batch_size'.* is 3, but the shape of input 'x' sets 'batch_size' to 2"),
    ({"input_shapes": {"x": [-2, C, HW, HW]}}, "positive"),
])
def test_bad_dims_are_usage_errors(kw, message):
    model = _chunk_shuffle_model(extra_inputs=True)
    with pytest.raises(UsageError, match=message):
        gp.load(model, **kw)
    with pytest.raises(UsageError, match=message):
        gp.optimize(gp.load(model), passes=["specialize_shapes"], target="none", **kw)


def test_dims_given_again_after_load_are_no_change_and_a_new_value_conflicts():
    m = gp.load(_chunk_shuffle_model(), dims={"batch_size": 2})
    result = gp.optimize(m, passes=["specialize_shapes"], dims={"batch_size": 2}, target="none")
    assert not result.report.passes[0].modified
    with pytest.raises(UsageError, match="fixed to 2 when the model was loaded"):
        gp.optimize(m, passes=["specialize_shapes"], dims={"batch_size": 4}, target="none")


# -- the CLI: --dim, -1, and what the messages say ----------------------------------------------

def _nonzero_model() -> onnx.ModelProto:
    """y's length is data-dependent (NonZero): no input shape can resolve it."""
    n = helper.make_node
    return make_model([n("Relu", ["x"], ["r"]), n("NonZero", ["r"], ["nz"]),
                       n("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT), n("Relu", ["nzf"], ["y"])],
                      {"x": ["batch", 3, 8, 8]}, {"y": [4, "nnz"]})


def test_cli_dim_and_minus_one_optimize_and_verify(tmp_path, capsys):
    from graphpass.cli import main

    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_chunk_shuffle_model(extra_inputs=True), src)
    assert main(["optimize", str(src), "-o", str(out), "--dim", "batch_size=2", "--verify", "-q"]) == 0
    written = onnx.load(out)
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in written.graph.input] == [[2, C, HW, HW], [2, 3]]
    assert "Transpose" not in [n.op_type for n in written.graph.node]
    assert main(["optimize", str(src), "-o", str(out), "--input-shape", "m:-1,3", "--verify", "-q"]) == 0
    assert onnx.load(out).graph.input[1].type.tensor_type.shape.dim[0].dim_param == "batch_size"


@pytest.mark.parametrize("args, message", [
    (["--dim", "batch"], "--dim 'batch': expected NAME=VALUE"),
    (["--dim", "batch_size=two"], "must be an integer"),
    (["--dim", "batch_size=0"], "--dim: 'batch_size' must be in 1..2^31, got 0"),
    (["--dim", "nope=1"], "--dim names 'nope', which is no symbolic dim of a graph input"),
    (["--dim", "batch_size=1", "--input-shape", "x:2,8,4,4"], "--input-shape x: dimension 0 ('batch_size') is 2"),
])
@pytest.mark.parametrize("verb", ["optimize", "cost"])
def test_cli_bad_dims_are_one_line_exit_2(tmp_path, capsys, verb, args, message):
    from graphpass.cli import main

    src = tmp_path / "m.onnx"
    onnx.save(_chunk_shuffle_model(extra_inputs=True), src)
    extra = ["-o", str(tmp_path / "o.onnx")] if verb == "optimize" else []
    assert main([verb, str(src), *extra, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_cost_says_which_dims_it_assumed_and_stops_once_they_are_fixed(tmp_path, capsys):
    from graphpass.cli import main

    src = tmp_path / "m.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["batch", 3, 8, 8]},
                         {"y": ["batch", 3, 8, 8]}), src)
    assert main(["cost", str(src), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["assumed_dims"] == {"batch": 1}
    assert any("symbolic dim 'batch' taken as 1 (fix it with --dim batch=VALUE" in a for a in report["assumptions"])
    for flags in (["--dim", "batch=4"], ["--input-shape", "x:4,3,8,8"]):
        assert main(["cost", str(src), "--format", "json", *flags]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["assumed_dims"] == {} and not any("batch" in a for a in report["assumptions"])
    assert main(["cost", str(src)]) == 0
    assert "assumed dims: batch=1" in capsys.readouterr().out


def test_the_input_shape_hint_is_not_given_to_whoever_passed_it(tmp_path, capsys):
    """Issue 20: the message told users to pass --input-shape when they had; now it says what is
    still unresolved instead."""
    from graphpass.cli import main

    src = tmp_path / "m.onnx"
    onnx.save(_nonzero_model(), src)
    assert main(["cost", str(src), "--format", "json"]) == 0
    before = json.loads(capsys.readouterr().out)["assumptions"]
    assert any("--input-shape" in a for a in before)
    assert main(["cost", str(src), "--format", "json", "--input-shape", "x:2,3,8,8"]) == 0
    report = json.loads(capsys.readouterr().out)
    dims = [a for a in report["assumptions"] if a.startswith("symbolic dim")]
    assert dims and all("fix it with" not in a and "unresolved although --input-shape/--dim fixed x" in a for a in dims)
    assert "batch" not in report["assumed_dims"]
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--input-shape", "x:2,3,8,8"]) == 0
    text = capsys.readouterr().out
    assert "fix it with --input-shape" not in text and "fix the inputs with" not in text


def test_diff_says_which_dims_the_estimates_assumed(tmp_path):
    from graphpass.diff import diff_models, to_json, to_text

    n = helper.make_node
    a = make_model([n("Relu", ["x"], ["r"]), n("Relu", ["r"], ["y"])], {"x": ["batch", 3, 8, 8]}, {"y": ["batch", 3, 8, 8]})
    b = make_model([n("Relu", ["x"], ["y"])], {"x": ["batch", 3, 8, 8]}, {"y": ["batch", 3, 8, 8]})
    d = diff_models(a, b, target="ascend310p3")
    assert json.loads(to_json(d))["cost"]["assumed_dims"] == {"before": {"batch": 1}, "after": {"batch": 1}}
    assert "the estimates assume symbolic dims batch=1" in to_text(d, color=False)
    static = make_model([n("Relu", ["x"], ["y"])], {"x": [1, 3, 8, 8]}, {"y": [1, 3, 8, 8]})
    static2 = make_model([n("Relu", ["x"], ["r"]), n("Relu", ["r"], ["y"])], {"x": [1, 3, 8, 8]}, {"y": [1, 3, 8, 8]})
    d = diff_models(static2, static, target="ascend310p3")
    assert "assumed_dims" not in d.cost and "assume symbolic dims" not in to_text(d, color=False)


def _traced_at_batch_one() -> onnx.ModelProto:
    """The exporter traced at batch 1 and wrote the sizes it saw for tensors whose batch is
    dynamic (x is ``batch_size``): numbers shape inference cannot confirm."""
    m = _chunk_shuffle_model(value_info=False)
    m.graph.value_info.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, C // 2, HW, HW])
                              for name in ("a", "b", "rb"))
    m.graph.value_info.append(helper.make_tensor_value_info("cat", TensorProto.FLOAT, [1, C, HW, HW]))
    return m


@pytest.mark.parametrize("passes", [["fold_constants", "eliminate_dead_nodes"], PIPELINE])
def test_a_number_the_exporter_traced_is_not_folded_into_a_dynamic_model(passes):
    """Before: the declared [1, 8, 4, 4] of 'cat' won over inference's unknown, Shape(cat) was
    folded to it and the model failed at batch 2 (Reshape to [1, 2, 4, 4, 4])."""
    model = _traced_at_batch_one()
    result = gp.optimize(model, passes=passes, target="none")
    out = gp.to_proto(result.model)
    for batch in (1, 2):
        assert_equivalent(model, out, feeds=_feeds(batch), exact=True)


def test_input_shape_replaces_traced_numbers():
    model = _traced_at_batch_one()
    result, out = _run(model, input_shapes={"x": [2, C, HW, HW]})
    shapes = {t.name: t.shape for n in result.model.graph.nodes for t in n.outputs}
    assert shapes["a"] == [2, C // 2, HW, HW] and shapes["cat"] == [2, C, HW, HW]
    declared = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in out.graph.value_info}
    assert declared["cat"] == [2, C, HW, HW]
    assert_equivalent(model, out, feeds=_feeds(2), exact=True)


def test_shapes_are_reinferred_after_folding_with_a_dynamic_batch():
    """corpus finding (ShuffleNetV2, TorchScript, dynamic batch): once the chunk's bounds are
    folded to constants, inference can size the Slices again; before, nothing re-inferred
    (only a shape that was None triggered it) and they stayed ['unk__0', 'unk__1', ...], the
    channels lost for every pass after."""
    n = helper.make_node
    model = make_model(
        [n("Add", ["four", "zero_s"], ["half"]), n("Unsqueeze", ["half", "ax0"], ["half1"]),
         n("Slice", ["x", "zero1", "half1", "ax1"], ["a"]), n("Slice", ["x", "half1", "big1", "ax1"], ["b"]),
         n("Relu", ["b"], ["rb"]), n("Concat", ["a", "rb"], ["y"], axis=1)],
        {"x": ["batch_size", C, HW, HW]}, {"y": ["batch_size", C, HW, HW]},
        initializers={"four": _i(C // 2), "zero_s": _i(0), "ax0": _i([0]), "ax1": _i([1]), "zero1": _i([0]),
                      "big1": _i([INT_MAX])})
    graph = gp.load(model).graph
    assert S.count_unresolved(graph) > 0
    gp.optimize(graph, passes=["fold_constants"], target="none")
    shapes = {t.name: t.shape for nd in graph.nodes for t in nd.outputs}
    assert shapes["a"] == ["batch_size", C // 2, HW, HW] and shapes["rb"] == ["batch_size", C // 2, HW, HW]
    assert S.count_unresolved(graph) == 0
    assert_equivalent(model, gp.to_proto(graph), feeds=_feeds(3), exact=True)


# -- the real-exporter corpus (tests/data/exporters, from the corpus branch) ---------------------

CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "exporters")


def _strip_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    from graphpass.ir.graph import graph_protos

    for g in graph_protos(model.graph):
        del g.value_info[:]
    return model


@pytest.mark.parametrize("name", ["shufflenet_v2.dynamo.onnx", "nms_detector.dynamo.onnx", "gpt2.dynamo.onnx"])
def test_corpus_input_shape_folds_as_much_with_the_exporters_value_info_as_without(name):
    """Issue 20's Done-when item on real exports (the dynamo exporter writes value_info for
    nearly every tensor); --dim with the same values folds as much as --input-shape."""
    manifest = os.path.join(CORPUS, "manifest.json")
    if not os.path.exists(os.path.join(CORPUS, name)):
        pytest.skip("the exporter corpus is not in this tree")
    entry = next(e for e in json.load(open(manifest))["files"] if e["file"] == name)
    path = os.path.join(CORPUS, name)
    shapes = {k: v["shape"] for k, v in entry["example_inputs"].items()}
    assert len(onnx.load(path, load_external_data=False).graph.value_info) > 50
    left = []
    for src in (path, _strip_value_info(onnx.load(path))):
        result = gp.optimize(src, pipeline="neutral", target="none", input_shapes=shapes)
        left.append(ops(result.model.graph))
    dims = {d: shapes[i["name"]][k] for i in entry["inputs"] for k, d in enumerate(i["shape"]) if isinstance(d, str)}
    left.append(ops(gp.optimize(path, pipeline="neutral", target="none", dims=dims).model.graph))
    assert left[0] == left[1] == left[2]


def test_own_rule_slice_with_computed_bounds_keeps_the_other_dims():
    """onnx gives up on a Slice whose bounds are computed (all four dims unknown); graphpass's
    rule: dims off the sliced axes are the input's, and inference carries them on (Relu)."""
    n = helper.make_node
    model = make_model(
        [n("Shape", ["x"], ["s"]), n("Gather", ["s", "one"], ["c"], axis=0), n("Div", ["c", "two"], ["h"]),
         n("Unsqueeze", ["h", "ax0"], ["h1"]), n("Slice", ["x", "zero1", "h1", "ax1"], ["a"]),
         n("Relu", ["a"], ["y"])],
        {"x": ["batch_size", C, HW, HW + 1]}, {"y": None},
        initializers={"one": _i(1), "two": _i(2), "ax0": _i([0]), "ax1": _i([-3]), "zero1": _i([0])})
    graph = gp.load(model).graph
    shapes = {t.name: t.shape for nd in graph.nodes for t in nd.outputs}
    assert shapes["a"][0] == "batch_size" and shapes["a"][2:] == [HW, HW + 1]
    assert not isinstance(shapes["a"][1], int)  # the sliced axis stays unknown
    assert shapes["y"][0] == "batch_size" and shapes["y"][2:] == [HW, HW + 1]
    result = gp.optimize(graph, passes=["fold_constants", "eliminate_dead_nodes"], target="none")
    assert_equivalent(model, gp.to_proto(result.model), feeds={"x": _feeds(3)["x"][..., :1].repeat(HW + 1, -1)},
                      exact=True)


def test_own_rule_does_not_guess_without_constant_axes():
    """axes fed at run time: any axis may be sliced, so no dim is copied."""
    n = helper.make_node
    model = make_model(
        [n("Slice", ["x", "zero1", "one1", "ax"], ["y"])],
        {"x": ["N", 4, 4], "ax": (TensorProto.INT64, [1])}, {"y": None},
        initializers={"zero1": _i([0]), "one1": _i([1])})
    graph = gp.load(model).graph
    y = graph.outputs[0]
    assert y.shape is None or not any(isinstance(d, int) or d == "N" for d in y.shape)


@pytest.mark.parametrize("where", ["load", "pass"])
def test_a_traced_number_on_a_graph_output_is_sized_again(where):
    """The exporter declared y as [1, 3] (traced at batch 1) while x's batch is dynamic; with
    the batch fixed to 8 the output is [8, 3], not the stale [1, 3]."""
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["a"]), n("Relu", ["a"], ["y"])], {"x": ["N", 3]}, {"y": [1, 3]})
    if where == "load":
        graph = gp.load(model, input_shapes={"x": [8, 3]}).graph
    else:
        graph = gp.load(model).graph
        gp.optimize(graph, passes=["specialize_shapes"], input_shapes={"x": [8, 3]}, target="none")
    assert graph.outputs[0].shape == [8, 3]
    out = gp.to_proto(graph)
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [8, 3]
    check_full(out)


def test_a_value_info_whose_dtype_lies_is_reported_with_its_dtype():
    """A value_info of the right shape and a wrong dtype was reported as "declared [batch,4],
    inferred [batch,4]": the message named no difference."""
    m = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                   {"x": (TensorProto.FLOAT, ["batch", 4])}, {"y": (TensorProto.FLOAT, ["batch", 4])})
    m.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT16, ["batch", 4]))
    import logging

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # the CLI's -q/-v in earlier tests set levels; listen on the logger itself
    logger = logging.getLogger("graphpass.ir.inference")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        gp.load(m)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    text = " ".join(r.getMessage() for r in records if "contradicted" in r.getMessage())
    assert "'r'" in text and "float16" in text and "float" in text.replace("float16", ""), text
