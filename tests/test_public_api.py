"""The public API takes a model in any form, and never changes a model it only reads (issue 19).

A new user's script (load, optimize, save, verify, diff, estimate) runs unchanged whether the
model is a path, bytes, an onnx.ModelProto or a graphpass.Model; every reader leaves what it
was given as it was: file bytes, proto bytes, and for a Model or gs.Graph its fingerprint, its
node order and what it exports.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.check import precision as P
from graphpass.check import verify as V
from graphpass.bisect import bisect
from graphpass.diff import diff_models
from graphpass.ir import model_io
from graphpass.ir.graph import fingerprint, iter_graphs
from graphpass.testing import make_model

FORMS = ["path", "bytes", "proto", "model"]
RNG = np.random.default_rng(19)


def _model() -> onnx.ModelProto:
    """x -> Identity -> Conv -> Relu -> Add(b) -> y: eliminate_identity and the Conv fusions fire."""
    nodes = [
        helper.make_node("Identity", ["x"], ["xi"], name="id"),
        helper.make_node("Conv", ["xi", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "b"], ["y"], name="add"),
    ]
    m = make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                   initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
                                 "b": RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)})
    m.metadata_props.add(key="author", value="issue 19")
    m.doc_string = "a public API test model"
    return m


def _source(form: str, tmp_path, proto: onnx.ModelProto | None = None):
    proto = proto if proto is not None else _model()
    if form == "path":
        path = tmp_path / "in.onnx"
        path.write_bytes(proto.SerializeToString())
        return str(path)
    if form == "bytes":
        return proto.SerializeToString()
    if form == "proto":
        return proto
    if form == "graph":
        return gp.load(proto).graph
    return gp.load(proto)


def _graph_of(source):
    return source.graph if isinstance(source, gp.Model) else source


def _state(source):
    """Everything a reader must leave as it was."""
    if isinstance(source, str):
        with open(source, "rb") as f:
            return ("file", f.read())
    if isinstance(source, bytes):
        return ("bytes", bytes(source))
    if isinstance(source, onnx.ModelProto):
        return ("proto", source.SerializeToString())
    graph = _graph_of(source)
    order = [[(id(n), n.name) for n in g.nodes] for g in iter_graphs(graph)]
    exported = model_io.to_proto(graph, emit="device").SerializeToString()
    return ("ir", fingerprint(graph), order, exported)


@pytest.mark.parametrize("form", FORMS)
def test_a_new_users_script_works_with_every_form(form, tmp_path):
    src = _source(form, tmp_path)
    model = gp.load(src)
    assert isinstance(model, gp.Model) and model.opset("") == 17
    assert model.metadata_props == {"author": "issue 19"} and model.doc_string == "a public API test model"

    result = gp.optimize(src)
    assert isinstance(result.model, gp.Model) and result.graph is result.model.graph
    assert [r.name for r in result.report.passes if r.modified]  # something fired
    if form == "model":
        assert result.model is src  # a Model is optimized in place and returned

    saved = gp.save(result.model, tmp_path / "out.onnx")
    also = result.model.save(tmp_path / "out2.onnx")
    assert saved.read_bytes() == also.read_bytes()  # one default (portable) for both
    assert result.model.to_proto().SerializeToString() == gp.to_proto(result.model).SerializeToString()
    onnx.checker.check_model(str(saved), full_check=True)
    assert gp.load(saved).metadata_props == {"author": "issue 19"}

    for candidate in (str(saved), saved.read_bytes(), onnx.load(str(saved)), result.model):
        assert V.verify_models(src, candidate).ok
    assert V.verify_models(src, result.model, all_tensors=True).ok

    d = diff_models(src, result.model)
    assert d.equivalent == (form == "model")  # a Model was optimized in place: it is the result
    if form != "model":
        assert d.removed  # the Identity at least

    est = gp.estimate(src)
    assert est.total_us is not None and est.total_us > 0
    assert gp.estimate(result.model, target="ascend910b2").target == "ascend910b2"

    report = P.analyze(src, check=False)
    assert report.tensors  # every float32 activation was observed


@pytest.mark.parametrize("form", FORMS + ["graph"])
@pytest.mark.parametrize("reader", ["to_proto", "save", "snapshot", "copy", "load", "verify", "verify_all", "diff",
                                    "estimate", "precision", "bisect"])
def test_readers_never_change_what_they_read(form, reader, tmp_path):
    src = _source(form, tmp_path)
    graph = _graph_of(src) if form in ("model", "graph") else None
    if graph is not None:
        graph.nodes.reverse()  # a valid graph whose nodes are not in topological order
    if reader in ("snapshot", "copy") and graph is None:
        pytest.skip("only the IR forms are snapshot or copied")
    before = _state(src)
    if reader == "to_proto":
        out = gp.to_proto(src)
        onnx.checker.check_model(out, full_check=True)
    elif reader == "save":
        gp.save(src, tmp_path / "s.onnx")
    elif reader == "snapshot":
        model_io.snapshot(graph)
    elif reader == "copy":
        twin = gp.as_model(src).copy()
        assert twin.graph is not graph and fingerprint(twin.graph) != fingerprint(graph)
        assert twin.metadata_props == gp.as_model(src).metadata_props
        assert twin.to_proto().SerializeToString() == gp.to_proto(src).SerializeToString()
        twin.graph.nodes.clear()
    elif reader == "load":
        gp.load(src)
    elif reader == "verify":
        assert V.verify_models(src, src).ok
    elif reader == "verify_all":
        assert V.verify_models(src, src, all_tensors=True).ok
    elif reader == "diff":
        assert diff_models(src, src).equivalent
    elif reader == "estimate":
        assert gp.estimate(src).total_us > 0
    elif reader == "precision":
        P.analyze(src, check=False)
    elif reader == "bisect":
        assert bisect(src, tmp_path / "b").first_bad is None
    assert _state(src) == before


def test_export_keeps_the_callers_node_order():
    """Regression: to_proto, save and snapshot toposorted the caller's graph in place."""
    graph = model_io.load(_model())
    graph.nodes.reverse()
    order = [n.name for n in graph.nodes]
    model_io.to_proto(graph)
    assert [n.name for n in graph.nodes] == order
    model_io.snapshot(graph)
    assert [n.name for n in graph.nodes] == order


def test_diff_does_not_change_a_proto_it_reads():
    """Regression: diff imported the caller's proto with from_proto (which changes it) for costs."""
    proto = _model()
    before = proto.SerializeToString()
    diff_models(proto, proto)
    assert proto.SerializeToString() == before


def test_verify_and_precision_take_paths(tmp_path):
    """Regression: verify_models(path, path, all_tensors=True) and precision.analyze(path) raised TypeError."""
    path = _source("path", tmp_path)
    assert V.verify_models(path, path, all_tensors=True).ok
    assert P.analyze(path, check=False).tensors


@pytest.mark.parametrize("form", ["path", "bytes", "proto"])
@pytest.mark.parametrize("entry", ["load", "optimize", "save", "verify", "diff", "estimate", "precision", "bisect"])
def test_an_invalid_model_is_refused_the_same_way_everywhere(form, entry, tmp_path):
    bad = _model()
    bad.graph.node[1].input[0] = "nowhere"  # Conv reads a tensor nothing produces
    src = _source(form, tmp_path, bad)
    good = _model()
    call = {
        "load": lambda: gp.load(src),
        "optimize": lambda: gp.optimize(src),
        "save": lambda: gp.save(src, tmp_path / "o.onnx"),
        "verify": lambda: V.verify_models(good, src),
        "diff": lambda: diff_models(good, src),
        "estimate": lambda: gp.estimate(src),
        "precision": lambda: P.analyze(src, check=False),
        "bisect": lambda: bisect(src, tmp_path / "b"),
    }[entry]
    with pytest.raises(gp.BadModelError, match="reads 'nowhere', which no node, graph input or initializer produces"):
        call()


@pytest.mark.parametrize("entry", [gp.load, gp.optimize, gp.to_proto, gp.estimate, gp.as_model,
                                   lambda m: V.verify_models(m, m), lambda m: diff_models(m, m),
                                   lambda m: P.analyze(m)])
def test_something_that_is_not_a_model_is_a_type_error(entry):
    with pytest.raises(TypeError, match="expected a model: a path, bytes, an onnx.ModelProto or a graphpass.Model"):
        entry(42)


def test_model_facts_live_on_the_model_not_in_graph_stashes():
    model = gp.load(_model(), max_memory="1G")
    graph = model.graph
    assert set(k for k in graph.__dict__ if k.startswith("_gp")) == {"_gp_model"}
    assert graph.__dict__["_gp_model"] is model  # the one documented back-reference
    assert model_io.opset_of(graph) == 17 and model_io.budget(graph) is model.budget
    assert model.budget.limit == 1 << 30 and model.budget.held > 0
    model.meta["note"] = "in memory only"
    model.metadata_props["stage"] = "optimized"
    model.opset_imports["com.example"] = 1
    out = model.to_proto()
    assert {p.key: p.value for p in out.metadata_props} == {"author": "issue 19", "stage": "optimized"}
    assert {o.domain: o.version for o in out.opset_import}["com.example"] == 1
    assert "in memory only" not in out.SerializeToString().decode("latin-1")


def test_to_proto_and_save_share_the_portable_default(tmp_path):
    """Device ops (a fused Conv+Relu) are inlined by default by both, kept with emit='device'."""
    model = gp.optimize(_model(), target="none").model  # no cost veto: the fused op stays (issue 21)
    device_ops = {n.op_type for n in model.to_proto(emit="device").graph.node}
    assert any(op.startswith("Fused") or op == "ConvRelu" for op in device_ops) or "graphpass.ascend" in {
        n.domain for n in model.to_proto(emit="device").graph.node}
    portable = model.to_proto()
    assert all(n.domain in ("", "ai.onnx") for n in portable.graph.node)
    saved = onnx.load(str(model.save(tmp_path / "m.onnx")))
    assert [n.op_type for n in saved.graph.node] == [n.op_type for n in portable.graph.node]
    with pytest.raises(gp.UsageError, match="emit must be 'portable' or 'device'"):
        model.to_proto(emit="npu")


def test_annotations_land_on_their_nodes_when_an_unsorted_graph_is_exported():
    """Regression (of this change): export sorts a copy of the order, and the annotations written
    after gs's export must pair proto nodes with gs nodes in that same sorted order."""
    from graphpass.ir import annotations as A

    model = gp.load(_model())
    for n in model.graph.nodes:
        A.set_engine(n, "AICORE" if n.name == "relu" else "AICPU")
    model.graph.nodes.reverse()
    out = model.to_proto(emit="device")
    engines = {n.name: {p.key: p.value for p in n.metadata_props}.get("graphpass.engine") for n in out.graph.node}
    assert engines == {"id": "AICPU", "conv": "AICPU", "relu": "AICORE", "add": "AICPU"}


@pytest.mark.parametrize("option", [{"input_shapes": {"x": [1, 3, 8, 8]}}, {"max_memory": "1G"},
                                    {"shape_inference": False}, {"freeze_initializer_inputs": True}])
def test_load_options_with_a_loaded_model_are_refused_not_ignored(option):
    model = gp.load(_model())
    assert gp.load(model) is model and gp.as_model(model.graph) is model
    with pytest.raises(gp.UsageError, match="load options apply when a model is read"):
        gp.load(model, **option)


@pytest.mark.parametrize("argument", ["passes", "disable", "enable"])
def test_a_pass_list_given_as_one_string_is_a_clear_type_error(argument):
    # optimize(passes="fold_constants") read the string letter by letter: "unknown pass 'f'"
    with pytest.raises(TypeError, match=rf"{argument} is a list of pass names.*\['fold_constants'\]"):
        gp.optimize(_model(), **{argument: "fold_constants"})


@pytest.mark.parametrize("value", [3, "size_limit=1", [("size_limit", 1)]])
def test_options_of_a_pass_that_are_not_a_mapping_are_a_clear_type_error(value):
    # options={"fold_constants": 3} raised TypeError("'int' object is not iterable")
    with pytest.raises(TypeError, match=r"options\['fold_constants'\] is .*a mapping of option names to values"):
        gp.optimize(_model(), options={"fold_constants": value})
