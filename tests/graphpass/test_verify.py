import json

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.check import verify as V
from graphpass.cli import main
from graphpass.testing import make_model

RNG = np.random.default_rng(6)
W1 = RNG.standard_normal((4, 4)).astype(np.float32)
W2 = RNG.standard_normal((4, 4)).astype(np.float32)


def _chain(w2=W2, divisor=None):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["h2"]), helper.make_node("Tanh", ["h2"], ["y"])]
    inits = {"w1": W1, "w2": w2}
    if divisor is not None:
        nodes[1] = helper.make_node("Div", ["h1", "z"], ["r1"])
        inits["z"] = np.array(divisor, np.float32)
    return make_model(nodes, {"x": [2, 4]}, {"y": [2, 4]}, initializers=inits)


def _write(tmp_path, name, model):
    p = tmp_path / name
    p.write_bytes(model.SerializeToString())
    return str(p)


def test_identical_models_pass_with_every_tensor():
    report = V.verify_models(_chain(), _chain(), all_tensors=True)
    assert report.ok and report.first_divergence is None and len(report.tensors) == 4


def test_perturbed_weight_is_named_as_the_first_divergence(tmp_path, capsys):
    w2 = W2.copy()
    w2[1, 2] += 0.5
    a, b = _write(tmp_path, "a.onnx", _chain()), _write(tmp_path, "b.onnx", _chain(w2))
    assert main(["verify", a, b, "--all-tensors"]) == 1
    captured = capsys.readouterr()
    assert "first divergent tensor: h2" in captured.out
    assert "first divergent tensor: h2" in captured.err


def test_first_nan_is_found(tmp_path):
    report = V.verify_models(_chain(), _chain(divisor=0.0), all_tensors=True)
    assert not report.ok
    assert report.first_nonfinite == {"a": None, "b": "r1"}


def test_fused_tensors_are_matched_by_name_and_provenance(light_path):
    original = onnx.load(light_path("light_squeezenet.onnx"))
    optimized = gp.to_proto(gp.optimize(original).graph)  # device form: FusedConvRelu nodes
    report = V.verify_models(original, optimized, all_tensors=True)
    assert report.ok and report.first_divergence is None and len(report.tensors) > 20


def test_npz_inputs_and_their_errors(tmp_path, capsys):
    a = _write(tmp_path, "a.onnx", _chain())
    good = tmp_path / "in.npz"
    np.savez(good, x=np.ones((2, 4), np.float32))
    assert main(["verify", a, a, "--inputs", str(good), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["inputs"] == {"x": "float32[2, 4]"}
    for arrays, needle in (({"y": np.ones((2, 4), np.float32)}, "input 'x' is missing"),
                           ({"x": np.ones((2, 4), np.float64)}, "is float64, the model wants float32"),
                           ({"x": np.ones((3, 4), np.float32)}, "has shape [3, 4]")):
        bad = tmp_path / "bad.npz"
        np.savez(bad, **arrays)
        assert main(["verify", a, a, "--inputs", str(bad)]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


def test_model_onnxruntime_cannot_run_is_exit_2(tmp_path, capsys):
    bad = make_model([helper.make_node("Mystery", ["x"], ["y"], domain="com.vendor")], {"x": [2, 4]}, {"y": [2, 4]},
                     extra_opsets={"com.vendor": 1})
    a, b = _write(tmp_path, "a.onnx", _chain()), _write(tmp_path, "b.onnx", bad)
    assert main(["verify", a, b]) == 2
    err = capsys.readouterr().err
    assert "onnxruntime cannot run the model" in err and len(err.strip().splitlines()) == 1


def test_min_cosine_tightens_the_verdict():
    w2 = W2 * 1.00001
    loose = V.verify_models(_chain(), _chain(w2))
    strict = V.verify_models(_chain(), _chain(w2), rtol=1.0, min_cosine=1.0 + 1e-12)
    assert loose.ok and not strict.ok and "cosine below" in strict.outputs[0].note


def test_models_with_different_inputs_or_outputs_are_usage_errors(tmp_path, capsys):
    a = _write(tmp_path, "a.onnx", _chain())
    renamed = _chain()
    renamed.graph.output[0].name = "z"
    renamed.graph.node[-1].output[0] = "z"
    b = _write(tmp_path, "b.onnx", renamed)
    assert main(["verify", a, b]) == 2
    assert "different outputs: ['y', 'z']" in capsys.readouterr().err


def _conv_bn_relu():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "s": rng.random(4).astype(np.float32) + 0.5,
             "b": rng.standard_normal(4).astype(np.float32), "m": rng.standard_normal(4).astype(np.float32),
             "v": rng.random(4).astype(np.float32) + 0.5, "w2": rng.standard_normal((2, 4, 1, 1)).astype(np.float32)}
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 2, 8, 8]}, initializers=inits)


def _portable(model, tmp_path):
    out = tmp_path / "o.onnx"
    gp.save(gp.optimize(model).graph, str(out))  # the default (portable) output: device ops inlined
    return onnx.load(str(out))


def test_all_tensors_on_the_portable_output_finds_no_false_divergence(tmp_path):
    """Issue 17: the inlined Conv (provenance conv, bn, relu) was matched to the ReLU's output r1."""
    original = _conv_bn_relu()
    optimized = _portable(original, tmp_path)
    assert [n.op_type for n in optimized.graph.node][:2] == ["Conv", "Relu"]  # the inlined FusedConvRelu
    report = V.verify_models(original, optimized, all_tensors=True)
    assert report.ok and report.first_divergence is None
    assert [c.name for c in report.tensors] == ["r1", "y"]


def test_all_tensors_finds_a_planted_divergence_at_the_right_tensor(tmp_path):
    original = _conv_bn_relu()
    optimized = _portable(original, tmp_path)
    w = next(t for t in optimized.graph.initializer if t.name == optimized.graph.node[0].input[1])
    arr = onnx.numpy_helper.to_array(w).copy()
    arr[1, 0, 1, 1] += 0.5  # the folded Conv's weight: channel 1 of r1 changes
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    report = V.verify_models(original, optimized, all_tensors=True)
    assert not report.ok and report.first_divergence == "r1"
    assert [c.name for c in report.tensors if not c.ok] == ["r1", "y"]


def test_all_tensors_maps_a_fused_tensor_whose_name_changed():
    """A fused node whose output got a new name stands for the last node it replaced."""
    from graphpass.check.verify import _provenance_map

    a = _conv_bn_relu()
    b = onnx.ModelProto()
    b.CopyFrom(a)
    conv, bn, relu = b.graph.node[0], b.graph.node[1], b.graph.node[2]
    for n in (conv, relu):
        n.metadata_props.add(key="graphpass.fused_from", value='["conv", "bn", "relu"]')
    conv.output[0] = "fused_c"
    relu.input[0] = "fused_c"
    relu.output[0] = "fused_r"
    b.graph.node[3].input[0] = "fused_r"
    b.graph.node.remove(bn)
    assert _provenance_map(a, b) == {"fused_r": "r1"}  # fused_c stays inside the group: no counterpart


def test_generated_ids_stay_inside_the_table_they_index(tmp_path):
    """An integer input that a Gather of a constant table reads directly (BERT's token_type_ids,
    a 2-row table) gets ids below the table's size: the original model runs, and --verify can
    compare (before: ids 0..3, onnxruntime refused the original)."""
    from pathlib import Path

    import onnx

    from graphpass.check.verify import make_inputs

    path = Path(__file__).resolve().parents[1] / "data" / "exporters" / "bert.torchscript.onnx"
    model = onnx.load(str(path))
    feeds, _ = make_inputs(model, seed=0, input_shapes={"input_ids": [2, 8], "token_type_ids": [2, 8],
                                                        "attention_mask": [2, 8]})
    assert feeds["token_type_ids"].max() <= 1 and feeds["input_ids"].max() == 3
    assert main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--verify"]) == 0
