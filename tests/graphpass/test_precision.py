"""graphpass precision: every planted fp16 hazard is found, confirmed under emulated fp16, and its
advice (the keep-list, applied by mixed_precision) removes it (issue 17)."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.check import precision as P
from graphpass.check import verify as V
from graphpass.cli import main
from graphpass.ir.graph import graph_protos
from graphpass.passes import mixed_precision
from graphpass.testing import make_model

from conftest import LIGHT_DIR

RNG = np.random.default_rng(17)


def constant_overflow():
    """A multiplier of 1e5 is inf in fp16; the product (~100) is not."""
    nodes = [helper.make_node("Mul", ["x", "gain"], ["y"], name="gain_mul"),
             helper.make_node("Relu", ["y"], ["out"], name="relu")]
    model = make_model(nodes, {"x": [64]}, {"out": [64]}, initializers={"gain": np.array(1e5, np.float32)})
    return model, {"x": (RNG.standard_normal(64) * 1e-3).astype(np.float32)}


def input_overflow():
    """An input beyond 65504 (raw sensor counts): the Cast to fp16 of its reader makes it inf."""
    nodes = [helper.make_node("Mul", ["x", "half"], ["y"], name="halve"),
             helper.make_node("Relu", ["y"], ["out"], name="relu")]
    model = make_model(nodes, {"x": [64]}, {"out": [64]}, initializers={"half": np.array(1e-3, np.float32)})
    return model, {"x": RNG.uniform(7e4, 9e4, 64).astype(np.float32)}


def constant_underflow():
    """A factor of 1e-9 is 0 in fp16; x (1e4..3e4) times it and rescaled is ~0.1."""
    nodes = [helper.make_node("Mul", ["x", "eps"], ["tiny"], name="eps_mul"),
             helper.make_node("Mul", ["tiny", "big"], ["out"], name="rescale")]
    model = make_model(nodes, {"x": [64]}, {"out": [64]},
                       initializers={"eps": np.array(1e-9, np.float32), "big": np.array(1e4, np.float32)})
    return model, {"x": RNG.uniform(1e4, 3e4, 64).astype(np.float32)}


def activation_overflow():
    """(400 x)^2 passes 65504 for |x| > 0.64; its square root is back in range."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             helper.make_node("Mul", ["a", "a"], ["sq"], name="square"),
             helper.make_node("Sqrt", ["sq"], ["out"], name="root")]
    model = make_model(nodes, {"x": [64]}, {"out": [64]}, initializers={"k": np.array(400, np.float32)})
    return model, {"x": RNG.standard_normal(64).astype(np.float32)}


def absorption():
    """log(1 + t) with t around 2e-4: 1 + t is exactly 1 in fp16, the log all zeros."""
    nodes = [helper.make_node("Mul", ["u", "small"], ["t"], name="to_small"),
             helper.make_node("Add", ["t", "one"], ["one_plus"], name="one_plus"),
             helper.make_node("Log", ["one_plus"], ["l"], name="log1p"),
             helper.make_node("Mul", ["l", "gain"], ["out"], name="rescale")]
    model = make_model(nodes, {"u": [64]}, {"out": [64]},
                       initializers={"small": np.array(1e-4, np.float32), "one": np.array(1.0, np.float32),
                                     "gain": np.array(1e4, np.float32)})
    return model, {"u": RNG.uniform(1, 3, 64).astype(np.float32)}


def subgraph_overflow():
    """The overflow of activation_overflow inside an If branch (the taken one)."""
    then = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["sq"], name="then_square"),
                              helper.make_node("Sqrt", ["sq"], ["r"], name="then_root")], "then", [],
                             [helper.make_tensor_value_info("r", TensorProto.FLOAT, [64])])
    els = helper.make_graph([helper.make_node("Abs", ["a"], ["e"], name="else_abs")], "else", [],
                            [helper.make_tensor_value_info("e", TensorProto.FLOAT, [64])])
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             helper.make_node("If", ["c"], ["out"], name="branch", then_branch=then, else_branch=els)]
    model = make_model(nodes, {"x": [64], "c": (TensorProto.BOOL, [])}, {"out": [64]},
                       initializers={"k": np.array(400, np.float32)})
    return model, {"x": RNG.standard_normal(64).astype(np.float32), "c": np.array(True)}


def loop_overflow():
    """The overflow inside a Loop body (three trips)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"], name="body_cond"),
         helper.make_node("Mul", ["acc", "acc"], ["sq"], name="body_square"),
         helper.make_node("Sqrt", ["sq"], ["acc2"], name="body_root")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cin", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("cout", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc2", TensorProto.FLOAT, [64])])
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             helper.make_node("Loop", ["n", "", "a"], ["out"], name="loop", body=body)]
    model = make_model(nodes, {"x": [64], "n": (TensorProto.INT64, [])}, {"out": [64]},
                       initializers={"k": np.array(400, np.float32)})
    return model, {"x": RNG.standard_normal(64).astype(np.float32), "n": np.array(3, np.int64)}


PLANTED = {  # case -> (hazard kind, hazard, the tensor, nodes the keep-list must hold)
    "constant_overflow": (constant_overflow, "constant", "overflow", "gain", {"gain_mul"}),
    "input_overflow": (input_overflow, "input", "overflow", "x", {"halve"}),
    "constant_underflow": (constant_underflow, "constant", "underflow", "eps", {"eps_mul", "rescale"}),
    "activation_overflow": (activation_overflow, "activation", "overflow", "sq", {"square", "root"}),
    "absorption": (absorption, "absorption", "absorption", "one_plus", {"one_plus", "log1p"}),
    "if_branch": (subgraph_overflow, "activation", "overflow", "sq", {"then_square", "then_root"}),
    "loop_body": (loop_overflow, "activation", "overflow", "sq", {"body_square", "body_root"}),
}


def _emulated_error(model, feeds, keep):
    graph = gp.load(model).graph
    mixed_precision(graph, mode="force_fp16", keep_fp32=list(keep), emulate=True)
    out = gp.to_proto(graph)
    onnx.checker.check_model(out, full_check=True)
    ref, got = V.run(V.session(model), feeds)["out"], V.run(V.session(out), feeds)["out"]
    assert np.all(np.isfinite(ref))
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.max(np.abs(got.astype(np.float64) - ref) / (np.abs(ref) + 1e-3)))


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_planted_hazard_is_flagged_confirmed_and_fixed_by_the_advice(case):
    build, kind, hazard, tensor, chain = PLANTED[case]
    model, feeds = build()
    report = P.analyze(model, feeds=feeds)
    found = [f for f in report.findings if f.tensor == tensor and f.kind == kind and f.hazard == hazard]
    assert found, [(f.kind, f.hazard, f.tensor) for f in report.findings]
    f = found[0]
    assert set(f.keep_fp32) <= set(report.keep_fp32) and chain <= set(report.keep_fp32)
    assert report.checked and f.confirmed, f.evidence
    assert f.fixed, f.fixed_evidence
    # the same, end to end: force_fp16 (emulated) breaks the output, the keep-list repairs it
    assert _emulated_error(model, feeds, []) > 0.1
    assert _emulated_error(model, feeds, report.keep_fp32) < 1e-2


def test_if_branches_before_opset_11_are_judged_too():
    # If-1 wants one shape from both branches: the probes are run on the model converted to opset 11
    model, feeds = subgraph_overflow()
    model.opset_import[0].version = 9
    onnx.checker.check_model(model, full_check=True)
    report = P.analyze(model, feeds=feeds)
    f = next(f for f in report.findings if f.tensor == "sq")
    assert f.graph == "branch/then_branch" and f.confirmed and f.fixed and not report.unobserved


def test_subgraph_tensors_are_judged():
    model, feeds = subgraph_overflow()
    report = P.analyze(model, feeds=feeds, check=False)
    by_name = {t.name: t for t in report.activations}
    assert {"a", "out", "sq", "r", "e"} <= set(by_name)
    assert by_name["sq"].graph == "branch/then_branch" and by_name["sq"].risky
    assert by_name["e"].elements == 0 and report.not_run >= 1  # the branch not taken has no values
    assert report.graphs == 3


def test_absorption_needs_a_small_operand_that_vanishes():
    # t around 2e-3 survives 1 + t in fp16 (ulp(1)/2 = 4.9e-4): not absorbed (only rounded)
    model, feeds = absorption()
    feeds = {"u": feeds["u"] * 10}
    report = P.analyze(model, feeds=feeds)
    assert not [f for f in report.findings if f.kind == "absorption"]
    assert P.analyze(model, feeds={"u": feeds["u"] / 10}).findings[0].kind == "absorption"


def test_constant_no_fp16_op_reads_as_data_is_not_a_hazard():
    # Resize's scales stay fp32 whatever their values: judged, not risky
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="nearest")]
    model = make_model(nodes, {"x": [1, 1, 2, 2]}, {"y": [1, 1, 4, 4]},
                       initializers={"scales": np.array([1, 1, 2, 2], np.float32) * np.float32(1e-9) / np.float32(1e-9)})
    big = make_model([helper.make_node("Add", ["x", "k"], ["y"], name="add"),
                      helper.make_node("Resize", ["y", "", "s"], ["z"], name="resize", mode="nearest")],
                     {"x": [1, 1, 2, 2]}, {"z": [1, 1, 4, 4]},
                     initializers={"k": np.array(1e-9, np.float32), "s": np.array([1, 1, 2, 2], np.float32)})
    for m in (model, big):
        report = P.analyze(m)
        assert {t.name for t in report.constants} >= {"scales"} if m is model else {"k", "s"}
    r = P.analyze(big)
    k = next(t for t in r.constants if t.name == "k")
    assert k.risky and k.flush_share == 1.0  # Add reads k as data: flushed to zero


@pytest.mark.parametrize("name", ["light_inception_v1.onnx", "light_squeezenet.onnx"])
def test_every_float_tensor_of_a_zoo_model_is_judged(name):
    model = onnx.load(os.path.join(LIGHT_DIR, name))
    report = P.analyze(model, check=False)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    float_outputs = set()
    for n in model.graph.node:
        if n.op_type == "Constant":
            continue
        schema = onnx.defs.get_schema(n.op_type, model.opset_import[0].version, "")
        for k, o in enumerate(n.output):
            # opset-9 Dropout's mask gets no inferred type: its schema types it T, like the data
            untyped_float = (o not in types and schema.outputs[k].type_str == schema.inputs[0].type_str
                             and types.get(n.input[0], TensorProto.FLOAT) == TensorProto.FLOAT)
            if o and (types.get(o) == TensorProto.FLOAT or untyped_float):
                float_outputs.add(o)
    float_consts = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    float_consts |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"
                     and n.attribute[0].t.data_type == TensorProto.FLOAT}
    assert len(model.graph.node) > 100
    assert {t.name for t in report.activations} == float_outputs
    assert {t.name for t in report.constants} == float_consts
    produced = {o for n in model.graph.node for o in n.output}
    float_inputs = {i.name for i in model.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT
                    and i.name not in produced and i.name not in float_consts}  # (ir 3 lists weights as inputs)
    assert {t.name for t in report.inputs} == float_inputs and len(float_inputs) == 1
    assert len(report.tensors) == len(float_outputs) + len(float_consts) + len(float_inputs)


def test_cli_reports_findings_and_optimize_applies_the_keep_list(tmp_path, capsys):
    model, feeds = absorption()
    src, inputs, dst = tmp_path / "m.onnx", tmp_path / "in.npz", tmp_path / "o.onnx"
    src.write_bytes(model.SerializeToString())
    np.savez(inputs, **feeds)
    assert main(["precision", str(src), "--inputs", str(inputs)]) == 0
    out = capsys.readouterr().out
    assert "absorption" in out and "confirmed" in out and "one_plus" in out
    assert main(["precision", str(src), "--inputs", str(inputs), "--format", "json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    f = next(f for f in data["findings"] if f["kind"] == "absorption")
    assert f["confirmed"] and f["fixed"] and {"one_plus", "log1p"} <= set(data["keep_fp32"])
    assert main(["optimize", str(src), "-o", str(dst), "--mixed-precision", "force_fp16", "--keep-fp32",
                 ",".join(data["keep_fp32"]), "-q"]) == 0
    m = onnx.load(dst)
    fp16 = {n.name for g in graph_protos(m.graph) for n in g.node
            if {p.key: p.value for p in n.metadata_props}.get("graphpass.precision") == "fp16"}
    assert fp16 and not fp16 & {"one_plus", "log1p"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # range-checked by argparse since issue 23
        main(["precision", str(src), "--absorption-share", "1.5"])
    assert e.value.code == 2 and "--absorption-share" in capsys.readouterr().err


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_scan_body_and_an_if_nested_in_a_loop_are_judged_checked_and_fixed():
    body = helper.make_graph([helper.make_node("Mul", ["s", "xi"], ["p"], name="sc_mul"),
                              helper.make_node("Mul", ["p", "p"], ["sq"], name="sc_sq"),
                              helper.make_node("Sqrt", ["sq"], ["r"], name="sc_root"),
                              helper.make_node("Identity", ["r"], ["so"], name="sc_id")],
                             "b", [_vi("s", [4]), _vi("xi", [4])], [_vi("r", [4]), _vi("so", [4])])
    scan = make_model([helper.make_node("Scan", ["s0", "xs"], ["sf", "ys"], name="scan", body=body, num_scan_inputs=1)],
                      {"s0": [4], "xs": [3, 4]}, {"sf": [4], "ys": [3, 4]})
    r = P.analyze(scan, feeds={"s0": np.full(4, 400, np.float32), "xs": np.ones((3, 4), np.float32)})
    sq = next(t for t in r.activations if t.name == "sq")
    assert sq.graph == "scan/body" and sq.elements == 12 and sq.risky  # stacked over the 3 iterations
    f = next(f for f in r.findings if f.tensor == "sq")
    assert f.confirmed and f.fixed and {"sc_sq", "sc_root"} <= set(r.keep_fp32)

    then = helper.make_graph([helper.make_node("Mul", ["acc", "acc"], ["sq"], name="t_sq"),
                              helper.make_node("Sqrt", ["sq"], ["tr"], name="t_root")], "t", [], [_vi("tr", [4])])
    els = helper.make_graph([helper.make_node("Neg", ["acc"], ["en"], name="e_neg")], "e", [], [_vi("en", [4])])
    lbody = helper.make_graph([helper.make_node("Identity", ["ci"], ["co"], name="l_cond"),
                               helper.make_node("If", ["ci"], ["acc2"], name="inner_if", then_branch=then, else_branch=els)],
                              "lb", [_vi("i", [], TensorProto.INT64), _vi("ci", [], TensorProto.BOOL), _vi("acc", [4])],
                              [_vi("co", [], TensorProto.BOOL), _vi("acc2", [4])])
    nested = make_model([helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
                         helper.make_node("Loop", ["n", "c", "a"], ["y"], name="loop", body=lbody)],
                        {"x": [4], "n": (TensorProto.INT64, []), "c": (TensorProto.BOOL, [])}, {"y": [4]},
                        initializers={"k": np.array(400, np.float32)})
    feeds = {"x": np.ones(4, np.float32), "n": np.array(2, np.int64), "c": np.array(True)}
    r = P.analyze(nested, feeds=feeds)
    f = next(f for f in r.findings if f.tensor == "sq")
    assert f.graph == "loop/body/inner_if/then_branch" and f.confirmed and f.fixed
    assert {"t_sq", "t_root"} <= set(r.keep_fp32)
    r0 = P.analyze(nested, feeds={**feeds, "n": np.array(0, np.int64)})  # zero trips: nothing ran, nothing risky
    assert not r0.findings and r0.not_run == 4


def _growing_loop():
    body = helper.make_graph([helper.make_node("Identity", ["ci"], ["co"], name="cond"),
                              helper.make_node("Concat", ["acc", "one"], ["acc2"], name="grow", axis=0)],
                             "g", [_vi("i", [], TensorProto.INT64), _vi("ci", [], TensorProto.BOOL), _vi("acc", None)],
                             [_vi("co", [], TensorProto.BOOL), _vi("acc2", None)],
                             [onnx.numpy_helper.from_array(np.array([7e4], np.float32), "one")])
    return make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)],
                      {"x": [1], "n": (TensorProto.INT64, [])}, {"y": [None]})


def test_a_loop_whose_shapes_grow_is_observed_by_concatenation():
    # per-iteration shapes grow (1, 2, 3 elements in, 2, 3, 4 out): stacking fails, concatenating works
    r = P.analyze(_growing_loop(), feeds={"x": np.ones(1, np.float32), "n": np.array(3, np.int64)})
    by_name = {t.name: t for t in r.tensors}
    assert by_name["acc2"].elements == 9 and by_name["acc"].elements == 6 and by_name["acc"].kind == "input"
    assert not r.unobserved
    one = next(f for f in r.findings if f.tensor == "one")
    assert one.kind == "constant" and one.hazard == "overflow" and one.confirmed and one.fixed and "grow" in r.keep_fp32


def test_what_cannot_be_observed_is_said_not_judged_silently(monkeypatch):
    def refuse(model, feeds):
        raise RuntimeError("onnxruntime refuses the exposed subgraphs")

    monkeypatch.setattr(P, "_run_quiet", refuse)
    r = P.analyze(_growing_loop(), feeds={"x": np.ones(1, np.float32), "n": np.array(3, np.int64)})
    assert "(every subgraph tensor)" in r.unobserved and "acc2" not in {t.name for t in r.tensors}
    one = next(f for f in r.findings if f.tensor == "one")  # constants are judged without running
    assert one.kind == "constant" and one.hazard == "overflow" and "grow" in r.keep_fp32


def _float_outputs(graph, opset, types):
    """Float32 node outputs of ``graph`` (by inference; opset-9 Dropout's mask by its schema)."""
    out = set()
    for n in graph.node:
        if n.op_type == "Constant":
            continue
        schema = onnx.defs.get_schema(n.op_type, opset, "")
        for k, o in enumerate(n.output):
            untyped_float = (o not in types and schema.outputs[k].type_str == schema.inputs[0].type_str
                             and types.get(n.input[0], TensorProto.FLOAT) == TensorProto.FLOAT)
            if o and (types.get(o) == TensorProto.FLOAT or untyped_float):
                out.add(o)
    return out


def test_a_model_living_in_if_branches_is_judged_whole():
    # VAD-like: the main graph is one If (on the sample rate), the network lives in its branches
    zoo = onnx.version_converter.convert_version(onnx.load(os.path.join(LIGHT_DIR, "light_squeezenet.onnx")), 13)
    opset = zoo.opset_import[0].version
    produced = {o for n in zoo.graph.node for o in n.output} | {t.name for t in zoo.graph.initializer}
    data = next(i for i in zoo.graph.input if i.name not in produced)  # (ir 3 lists the weights as inputs too)
    inner = {o for n in zoo.graph.node for o in n.output} | {t.name for t in zoo.graph.initializer}

    def branch(suffix):
        g = onnx.GraphProto()
        g.CopyFrom(zoo.graph)
        g.name = "net" + suffix
        rn = {name: name + suffix for name in inner}
        for n in g.node:
            n.name = n.name + suffix if n.name else ""
            n.input[:] = [rn.get(i, i) for i in n.input]
            n.output[:] = [rn.get(o, o) for o in n.output]
        for t in g.initializer:
            t.name = rn[t.name]
        for o in g.output:
            o.name = rn.get(o.name, o.name)
        del g.input[:]
        return g

    then, els = branch("_16k"), branch("_8k")
    node = helper.make_node("If", ["is_16k"], ["prob"], name="sample_rate", then_branch=then, else_branch=els)
    graph = helper.make_graph([node], "vad_like", [data, helper.make_tensor_value_info("is_16k", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT,
                                                             [d.dim_value for d in zoo.graph.output[0].type.tensor_type.shape.dim])])
    model = helper.make_model(graph, opset_imports=list(zoo.opset_import))
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    report = P.analyze(model, feeds={"data_0": RNG.standard_normal([d.dim_value for d in data.type.tensor_type.shape.dim])
                                     .astype(np.float32), "is_16k": np.array(True)}, check=False)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {}
    for g in graph_protos(inferred.graph):
        types.update({v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.output)})
    expected = {"prob"} | _float_outputs(then, opset, types) | _float_outputs(els, opset, types)
    assert len(expected) > 200
    assert {t.name for t in report.activations} == expected and not report.unobserved
    ran = {t.name for t in report.activations if t.elements}
    assert ran == {"prob"} | _float_outputs(then, opset, types)  # the 8k branch did not run
    assert report.not_run == len(_float_outputs(els, opset, types)) and report.graphs == 3


def test_harmless_absorption_is_reported_but_not_kept():
    # decomposed LayerNorm: var + 1e-5 loses the epsilon in fp16 where var ~ 1, and nothing changes
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="center"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="square"),
             helper.make_node("ReduceMean", ["d2"], ["var"], name="variance", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="std"),
             helper.make_node("Div", ["d", "sd"], ["out"], name="normalize")]
    model = make_model(nodes, {"x": [4, 64]}, {"out": [4, 64]}, initializers={"eps": np.array(1e-5, np.float32)}, opset=13)
    feeds = {"x": RNG.standard_normal((4, 64)).astype(np.float32)}
    report = P.analyze(model, feeds=feeds)
    f = next(f for f in report.findings if f.kind == "absorption")
    assert f.node == "add_eps" and f.confirmed is False and "no output changes" in f.evidence
    assert "add_eps" not in report.keep_fp32
    # keeping the Add (and its reader) in fp32 would not make fp16 any closer
    assert _emulated_error(model, feeds, ["add_eps", "std"]) >= 0.5 * _emulated_error(model, feeds, [])


def test_a_hazard_hidden_behind_another_is_fixed_too():
    # r = sqrt((400 x)^2) overflows in between (r ~ 270); p = r * 1e-3 * 1e-3 * w with w ~ 1e-4 is
    # ~2.7e-8 and flushes to zero in fp16, but while r is inf p is inf: the underflow shows only
    # once the overflow is kept in fp32, in a later round of the check
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             helper.make_node("Mul", ["a", "a"], ["sq"], name="square"),
             helper.make_node("Sqrt", ["sq"], ["r"], name="root"),
             helper.make_node("Mul", ["r", "milli"], ["u0"], name="shrink0"),
             helper.make_node("Mul", ["u0", "milli"], ["u"], name="shrink1"),
             helper.make_node("Mul", ["u", "w"], ["p"], name="product"),
             helper.make_node("Mul", ["p", "up"], ["out"], name="grow")]
    model = make_model(nodes, {"x": [64], "w": [64]}, {"out": [64]}, initializers={
        "k": np.array(400, np.float32), "milli": np.array(1e-3, np.float32), "up": np.array(1e4, np.float32)})
    feeds = {"x": RNG.uniform(0.65, 0.7, 64).astype(np.float32), "w": np.full(64, 1e-4, np.float32)}
    report = P.analyze(model, feeds=feeds)
    under = next(f for f in report.findings if f.tensor == "p")
    assert under.hazard == "underflow" and under.confirmed is False and under.fixed
    assert {"square", "root", "product", "grow"} <= set(report.keep_fp32)
    assert all(f.fixed for f in report.findings)
    assert _emulated_error(model, feeds, []) > 0.1 and _emulated_error(model, feeds, report.keep_fp32) < 1e-2
