"""Issue 26 (attention, norms, rotary, gated MLP, GELU): on every transformer of the real-exporter
corpus and the LLaMA-style exports, each attention block, norm, GELU, rotary embedding and gated
MLP is fused (the count is the architecture's), the portable output equals the export's within
the fusions' promises, and the estimate drops (with these fusions against without them)."""

from __future__ import annotations

import collections

import onnx
import pytest

import graphpass as gp
from graphpass.testing import assert_equivalent

from _corpus import DATA, exported, feeds_for

TARGET = "ascend910b2"

#: per model (the reduced corpus configs of benchmarks/export_corpus.py): the fused ops expected
#: and the decomposition ops that must be gone
EXPECTED = {
    # 2 layers x (attention LN, output LN) + the embeddings' LN; one GELU per layer
    "bert": ({"LayerNormalization": 5, "Gelu": 2, "attention": 2}, {"Erf", "ReduceMean", "Sqrt", "Softmax"}),
    # 2 layers x (ln_1, ln_2) + ln_f; gelu_new (tanh form) per layer
    "gpt2": ({"LayerNormalization": 5, "GeluTanh": 2, "attention": 2}, {"Pow", "Tanh", "ReduceMean", "Sqrt", "Softmax"}),
    # 2 layers x (layernorm_before, layernorm_after) + the final LN; one GELU per layer
    "vit": ({"LayerNormalization": 5, "Gelu": 2, "attention": 2}, {"Erf", "ReduceMean", "Sqrt", "Softmax"}),
    # 1 encoder layer (2 LN + final) + 1 decoder layer (3 LN + final); GELU after both convs and in both MLPs;
    # attention: the encoder's, the decoder's self- and cross-attention
    "whisper": ({"LayerNormalization": 7, "Gelu": 4, "attention": 3}, {"Erf", "ReduceMean", "Sqrt", "Softmax"}),
    # 2 layers x (input norm, post-attention norm) + the final norm: the first reads the embedding,
    # the other four a residual Add; q and k rotated per layer; one SwiGLU MLP per layer; one
    # grouped-query attention per layer (4 heads over 2 KV heads: repeat_kv taken in)
    "llama": ({"RmsNorm": 1, "AddRmsNorm": 4, "RotaryEmbedding": 4, "SwiGlu": 2, "attention": 2},
              {"Pow", "ReduceMean", "Sqrt", "Reciprocal", "Neg", "Sigmoid", "Softmax"}),
}
EXPECTED["llama_static"] = EXPECTED["llama"]
# float16 (model.half()): the same, but the gated MLP stays two float16 MatMuls and the Sigmoid·Mul
# chain (the packed MatMul is float32/float64's only; SwiGlu over their Concat is dearer in the
# estimate, so the cost veto rolls it back: test_the_float16_gated_mlp_is_left_by_the_cost_model)
# one decode step over a KV cache (K and V are Concat(past, new)): IncreFlashAttention's case
EXPECTED["llama_kv"] = EXPECTED["llama"]
EXPECTED["llama_fp16"] = ({"RmsNorm": 1, "AddRmsNorm": 4, "RotaryEmbedding": 4, "SwiGlu": 0, "attention": 2},
                          {"Pow", "ReduceMean", "Sqrt", "Reciprocal", "Neg", "Softmax"})

ENTRIES = [e for e in exported() if e["model"] in EXPECTED]
OURS = ("fuse_rms_norm", "fuse_rotary_embedding", "fuse_swiglu", "fuse_attention")


def test_the_corpus_has_every_transformer():
    assert {e["model"] for e in ENTRIES} == set(EXPECTED)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_every_norm_gelu_rotary_and_gated_mlp_is_fused(entry):
    expected, gone = EXPECTED[entry["model"]]
    path = DATA / entry["file"]
    result = gp.optimize(str(path), target=TARGET)
    device = gp.to_proto(result.graph, emit="device")
    counts = collections.Counter(n.op_type for n in device.graph.node)
    counts["attention"] = counts["Attention"] + counts["AttentionBSH"]  # the layout is the export's
    # Gelu(approximate="tanh") is the standard op's spelling from opset 20; these exports are 17/18
    got = {op: counts.get(op, 0) for op in expected}
    assert got == expected, dict(counts)
    left = gone & set(counts)
    assert not left, f"decomposition ops left: {sorted(left)}"
    if entry["file"] == "llama_kv.torchscript.onnx":
        # the TorchScript export of a grouped-query decode step folds each KV head's 2 query heads into
        # the query's length (q.view(B, Nkv, rep*Sq, D)): the op computes that, 2 heads of 2 query rows
        kv = {a.name: onnx.helper.get_attribute_value(a) for n in device.graph.node if n.op_type == "Attention"
              for a in n.attribute}
        assert kv["num_heads"] == 2 and kv["num_key_value_heads"] == 2
    elif entry["model"].startswith("llama"):
        kv = {a.name: onnx.helper.get_attribute_value(a) for n in device.graph.node if n.op_type == "Attention"
              for a in n.attribute}
        assert kv["num_heads"] == 4 and kv["num_key_value_heads"] == 2
    feeds = feeds_for(entry)
    exact = entry["model"].startswith("llama")  # fuse_swiglu's packed MatMul is a tolerance, bitwise here
    if entry["model"] == "llama_fp16":  # onnxruntime's float16 kernels as they run, no emulation
        assert_equivalent(onnx.load(str(path)), gp.to_proto(result.graph), feeds, exact=True)
        return
    assert_equivalent(onnx.load(str(path)), gp.to_proto(result.graph), feeds, rtol=1e-4, atol=1e-5, exact=exact)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_the_estimate_drops_with_the_transformer_fusions(entry):
    path = str(DATA / entry["file"])
    with_ = gp.optimize(path, target=TARGET).report
    without = gp.optimize(path, target=TARGET, disable=OURS).report
    assert with_.cost_after_us < without.cost_after_us < without.cost_before_us


@pytest.mark.parametrize("target, formed, refused", [
    ("ascend910a", set(), {"RmsNorm", "AddRmsNorm", "RotaryEmbedding", "SwiGlu", "Attention"}),
    ("ascend310p3", {"RmsNorm", "AddRmsNorm", "SwiGlu", "Attention"}, {"RotaryEmbedding"}),
])
def test_a_target_without_a_kernel_keeps_the_decomposition_and_says_why(target, formed, refused):
    path = str(DATA / "llama.dynamo.onnx")
    result = gp.optimize(path, target=target)
    kinds = {n.op for n in result.graph.nodes if n.domain == "graphpass.ascend"}
    assert formed <= kinds and not (refused & kinds)
    reasons = " ".join(e.reason if hasattr(e, "reason") else str(e) for e in result.report.explanations)
    if "RotaryEmbedding" in refused:
        assert "no RotaryPositionEmbedding (mode 0, rotate-half) kernel" in reasons
    if "RmsNorm" in refused:
        assert "no RmsNorm kernel" in reasons
    if "Attention" in refused:
        assert "no PromptFlashAttention / IncreFlashAttention kernel" in reasons


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e["model"] == "llama_fp16"], ids=lambda e: e["file"])
def test_the_float16_gated_mlp_is_left_by_the_cost_model(entry):
    result = gp.optimize(str(DATA / entry["file"]), target=TARGET)
    rec = [r for r in result.report.passes if r.name == "fuse_swiglu"]
    assert rec and any(x.rolled_back and x.cost_after_us > x.cost_before_us for x in rec), [x.to_dict() for x in rec]
