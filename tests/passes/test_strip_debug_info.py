"""strip_debug_info: exporter provenance dropped from node and tensor metadata, nothing else."""

import os

import numpy as np
import pytest
import onnx
from onnx import TensorProto as T, helper

import graphpass as gp
from graphpass.cli import main
from graphpass.ir import annotations
from graphpass.passes import strip_debug_info
from graphpass.testing import assert_equivalent, make_model, ops

HERE = os.path.dirname(__file__)
GPT2 = os.path.join(HERE, "..", "data", "exporters", "gpt2.dynamo.onnx")

TRACE = 'File "/home/someone/model.py", line 12, in forward\n    return self.fc(x)'


def _props(holder, **kv):
    for k, v in kv.items():
        holder.metadata_props.add(key=k, value=v)


def _model():
    """Relu -> If(cond) whose branches Neg/Abs the Relu's output; every node and tensor carries
    dynamo-style provenance next to a graphpass annotation and a user's key."""
    def branch(op, tag):
        n = helper.make_node(op, ["r"], [f"o_{tag}"], name=f"{op}_{tag}")
        _props(n, **{"pkg.torch.onnx.stack_trace": TRACE, "namespace": f": M/{tag}", "user.tag": tag})
        return helper.make_graph([n], tag, [], [helper.make_tensor_value_info(f"o_{tag}", T.FLOAT, [3])])

    relu = helper.make_node("Relu", ["x"], ["r"], name="relu")
    _props(relu, **{"pkg.torch.onnx.stack_trace": TRACE, "pkg.torch.onnx.class_hierarchy": "['M', 'ReLU']",
                    "namespace": ": M/relu", "pkg.onnxscript.rewriter.rule_name": "r", "graphpass.engine": "AICORE",
                    "user.owner": "team-a"})
    cond = helper.make_node("If", ["c"], ["y"], then_branch=branch("Neg", "then"), else_branch=branch("Abs", "else"))
    m = make_model([relu, cond], {"x": [3], "c": (T.BOOL, [])}, {"y": [3]})
    _props(m.graph.input[0], **{"pkg.torch.export.graph_signature.InputSpec.kind": "USER_INPUT", "user.unit": "m"})
    m.metadata_props.add(key="pkg.torch.onnx.producer", value="model level stays")
    return m


def _node_keys(graph):
    return {n.name: sorted(annotations.stored_meta(n) or {}) for g in gp.ir.iter_graphs(graph) for n in g.nodes}


def test_drops_provenance_on_nodes_bodies_and_tensors_and_keeps_every_other_key():
    src = _model()
    model = gp.load(src)
    result = strip_debug_info(model)
    assert result.modified
    assert result.stats["nodes"] == 3 and result.stats["tensors"] == 1
    assert result.stats["bytes"] > 3 * len(TRACE)
    keys = _node_keys(model.graph)
    assert keys["relu"] == ["graphpass.engine", "user.owner"]
    assert keys["Neg_then"] == keys["Abs_else"] == ["user.tag"]
    assert annotations.stored_meta(model.graph.inputs[0]) == {"user.unit": "m"}
    out = model.to_proto()
    assert {p.key: p.value for p in out.metadata_props} == {"pkg.torch.onnx.producer": "model level stays"}
    assert ops(out) == ["Relu", "If"]
    feeds = {"x": np.array([-1.5, -0.0, np.nan], np.float32)}
    for c in (True, False):
        assert_equivalent(src, out, {**feeds, "c": np.array(c)}, exact=True)


def test_nothing_to_drop_is_no_change():
    src = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [3]}, {"y": [3]})
    _props(src.graph.node[0], **{"user.namespace": "mine", "graphpass.engine": "AICORE", "pkg.torchvision": "x"})
    model = gp.load(src)
    result = strip_debug_info(model)
    assert not result.modified and result.stats == {"nodes": 0, "tensors": 0, "bytes": 0}
    assert sorted(annotations.stored_meta(model.graph.nodes[0])) == ["graphpass.engine", "pkg.torchvision",
                                                                      "user.namespace"]


def test_a_dynamo_export_loses_its_stack_traces_and_only_them(tmp_path):
    out = tmp_path / "o.onnx"
    assert main(["optimize", GPT2, "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    m = onnx.load(out, load_external_data=False)
    keys = {p.key for n in m.graph.node for p in n.metadata_props}
    assert not any(k.startswith("pkg.torch.") or k == "namespace" for k in keys), keys
    src = onnx.load(GPT2, load_external_data=False)
    assert sum(len(p.value) for n in src.graph.node for p in n.metadata_props) > 150_000
    assert os.path.getsize(out) < os.path.getsize(GPT2) / 5


def test_disable_keeps_them(tmp_path):
    out = tmp_path / "o.onnx"
    assert main(["optimize", GPT2, "-o", str(out), "--pipeline", "neutral", "-q", "--disable", "strip_debug_info"]) == 0
    m = onnx.load(out, load_external_data=False)
    traces = [p.value for n in m.graph.node for p in n.metadata_props if p.key == "pkg.torch.onnx.stack_trace"]
    assert len(traces) > 100


def _weights_with_provenance(size):
    """Two initializers carrying exporter keys in their own TensorProto.metadata_props: one
    with nothing else, one next to a user's key."""
    w = onnx.numpy_helper.from_array(np.arange(size, dtype=np.float32), "w")
    _props(w, **{"pkg.torch.export.graph_signature.InputSpec.kind": "PARAMETER"})
    w2 = onnx.numpy_helper.from_array(np.arange(size, dtype=np.float32) - 1, "w2")
    _props(w2, **{"pkg.torch.onnx.original_node_name": "p_w2", "user.k": "keep"})
    nodes = [helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "w2"], ["y"])]
    m = make_model(nodes, {"x": [size]}, {"y": [size]})
    m.graph.initializer.extend([w, w2])
    return m


@pytest.mark.parametrize("size", [4, 5000], ids=["small", "over_1KiB"])
@pytest.mark.parametrize("external", [False, True])
def test_initializer_provenance_is_dropped_from_what_save_writes(tmp_path, size, external):
    src = _weights_with_provenance(size)
    model = gp.load(src)
    assert strip_debug_info(model).stats["tensors"] == 2
    out = tmp_path / "o.onnx"
    gp.save(model, out, external_data=external)
    saved = onnx.load(out)
    props = {t.name: {p.key: p.value for p in t.metadata_props} for t in saved.graph.initializer}
    assert props == {"w": {}, "w2": {"user.k": "keep"}}
    for proto in (saved, model.to_proto()):
        assert {t.name: {p.key: p.value for p in t.metadata_props} for t in proto.graph.initializer} == props
    x = np.array([np.nan, -0.0, np.inf, 1e-45] + [1.0] * (size - 4), np.float32)
    assert_equivalent(src, saved, {"x": x}, exact=True)


def test_a_graphpass_annotation_on_a_large_weight_is_saved(tmp_path):
    src = _weights_with_provenance(5000)
    model = gp.load(src)
    w = next(t for t in model.graph.nodes[0].inputs if t.name == "w")
    annotations.set_format(w, "FRACTAL_Z")
    out = tmp_path / "o.onnx"
    gp.save(model, out, external_data=False)
    saved = {t.name: {p.key: p.value for p in t.metadata_props} for t in onnx.load(out).graph.initializer}
    assert saved["w"] == {"pkg.torch.export.graph_signature.InputSpec.kind": "PARAMETER", annotations.FORMAT: "FRACTAL_Z"}


def _loop_model():
    """A Loop whose body's input, value_info and node carry exporter keys next to a user's."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
                 helper.make_tensor_value_info("acc_in", T.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("acc_out", T.FLOAT, [3])])
    _props(body.node[0], **{"pkg.torch.onnx.stack_trace": TRACE, "user.k": "body"})
    _props(body.input[2], **{"pkg.torch.onnx.original_node_name": "acc", "user.unit": "m"})
    _props(body.output[1], **{"pkg.onnxscript.optimizer.folded_from": "z"})
    m = make_model([helper.make_node("Loop", ["n", "", "a0"], ["y"], body=body, name="loop")],
                   {"n": (T.INT64, []), "a0": [3], "x": [3]}, {"y": [3]})
    _props(m.graph.output[0], **{"pkg.torch.export.graph_signature.OutputSpec.kind": "USER_OUTPUT"})
    return m


def _all_props(m):
    out = {}
    for g in [m.graph] + [a.g for n in m.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]:
        for n in g.node:
            out[f"{g.name}/node/{n.name}"] = [(p.key, p.value) for p in n.metadata_props]
        for t in list(g.input) + list(g.output) + list(g.value_info) + list(g.initializer):
            if len(t.metadata_props):
                out[f"{g.name}/tensor/{t.name}"] = [(p.key, p.value) for p in t.metadata_props]
    return out


def test_keys_on_tensors_only_a_body_reaches_are_dropped_and_disable_keeps_every_byte(tmp_path):
    src = tmp_path / "loop.onnx"
    onnx.save(_loop_model(), src)
    feeds = {"n": np.array(3, np.int64), "a0": np.array([np.nan, -0.0, 1.0], np.float32),
             "x": np.array([np.inf, -0.0, 1e-45], np.float32)}
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--pipeline", "neutral", "-q"]) == 0
    props = _all_props(onnx.load(out))
    flat = [k for v in props.values() for k, _ in v]
    assert not any(k.startswith(("pkg.torch.", "pkg.onnxscript.")) or k == "namespace" for k in flat), props
    assert ("user.k", "body") in props["body/node/body_add"] and ("user.unit", "m") in props["body/tensor/acc_in"]
    assert_equivalent(onnx.load(src), onnx.load(out), feeds, exact=True)
    # nothing but metadata changed: graphpass diff calls the two the same
    assert main(["diff", str(src), str(out), "--exit-code", "--target", "none", "-q"]) == 0
    kept = tmp_path / "k.onnx"
    assert main(["optimize", str(src), "-o", str(kept), "--pipeline", "neutral", "-q", "--disable", "strip_debug_info"]) == 0
    assert _all_props(onnx.load(kept)) == _all_props(onnx.load(src))
