"""The real-exporter corpus: torchvision and transformers models through both torch exporters.

    /work/venv-torch/bin/python benchmarks/export_corpus.py            # the committed, reduced files
    /work/venv-torch/bin/python benchmarks/export_corpus.py --full --out /tmp/corpus-full
    /work/venv-torch/bin/python benchmarks/export_corpus.py --models resnet18 bert --exporters dynamo

Needs torch, torchvision and transformers (not graphpass's dependencies: run it with a venv that
has them). Every model is built in code: ``weights=None``, configs written here, weights seeded
with ``torch.manual_seed`` and then perturbed by seeded noise (no zero bias, no unit norm scale,
no fresh BatchNorm statistics: a trained model has none); nothing is downloaded
(``HF_HUB_OFFLINE=1``). Each model is exported
twice, as users do:

- ``torchscript``: ``torch.onnx.export(..., dynamo=False)`` with ``dynamic_axes``;
- ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` with ``dynamic_shapes`` (opset 18, the
  exporter's own optimizer on, weights in an external ``.onnx.data`` file: the exporter's default
  storage form, kept as written).

The batch axis is dynamic everywhere (and the sequence axis of the text models), so the files
carry the symbolic dims, ``Shape`` arithmetic and exporter ``value_info`` that real exports do.
By default the models are reduced (fewer channels, layers and classes) so that the committed
files stay small; ``--full`` builds the standard sizes (write them outside git). A model that an
exporter cannot export is recorded in the manifest with its error; the script goes on.

The manifest (``manifest.json`` in the output folder) lists per file: the model, exporter, opset,
torch/torchvision/transformers versions, inputs (name, shape with dim names, dtype), the sha256
of the file and of its external data, and the command that made it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shlex
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "exporters"
EXPORTERS = ("torchscript", "dynamo")
TORCHSCRIPT_OPSET = 17
DYNAMO_OPSET = 18


@dataclasses.dataclass
class Built:
    """A model ready to export: the module, its example inputs (by forward argument name) and
    which axes of each input are dynamic (axis -> dim name)."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, str]]
    outputs: list[str]
    note: str = ""
    #: integer inputs: the valid values [low, high) (token ids below the vocabulary size, ...)
    ranges: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    #: the TorchScript exporter gets ``torch.jit.script(module)`` (Loop and If stay control flow)
    scripted: bool = False
    #: the module the dynamo exporter gets, made from ``module`` after its weights are final
    dynamo_variant: Callable[[nn.Module], nn.Module] | None = None


def _image(batch: int = 2, size: int = 64) -> torch.Tensor:
    return torch.rand(batch, 3, size, size)


_BATCH = {0: "batch"}


# ------------------------------------------------------------------------------------------
# torchvision

def shufflenet_v2(full: bool) -> Built:
    from torchvision.models import shufflenetv2 as sv

    if full:
        m = sv.shufflenet_v2_x1_0(weights=None)
        note = "shufflenet_v2_x1_0"
    else:  # the x0.5 depth (4, 8, 4: 16 channel shuffles), narrower stages, 10 classes
        m = sv.ShuffleNetV2([4, 8, 4], [16, 32, 64, 128, 256], num_classes=10)
        note = "ShuffleNetV2(stages_repeats=[4, 8, 4], stages_out_channels=[16, 32, 64, 128, 256], num_classes=10)"
    return Built(m, {"x": _image(size=224 if full else 64)}, {"x": _BATCH}, ["logits"], note)


def mobilenet_v3_small(full: bool) -> Built:
    from torchvision.models import mobilenet_v3_small as f

    if full:
        return Built(f(weights=None), {"x": _image(size=224)}, {"x": _BATCH}, ["logits"], "mobilenet_v3_small")
    m = f(weights=None, width_mult=0.25, num_classes=10)
    return Built(m, {"x": _image()}, {"x": _BATCH}, ["logits"], "mobilenet_v3_small(width_mult=0.25, num_classes=10)")


def resnet18(full: bool) -> Built:
    from torchvision.models import resnet

    if full:
        return Built(resnet.resnet18(weights=None), {"x": _image(size=224)}, {"x": _BATCH}, ["logits"], "resnet18")
    # torchvision's ResNet with BasicBlock x [2, 2, 2, 2] (resnet18's depth) at 1/8 of its width
    m = resnet.ResNet(resnet.BasicBlock, [2, 2, 2, 2], num_classes=10)
    w = 8
    m.inplanes = w
    m.conv1 = nn.Conv2d(3, w, kernel_size=7, stride=2, padding=3, bias=False)
    m.bn1 = nn.BatchNorm2d(w)
    m.layer1 = m._make_layer(resnet.BasicBlock, w, 2)
    m.layer2 = m._make_layer(resnet.BasicBlock, 2 * w, 2, stride=2)
    m.layer3 = m._make_layer(resnet.BasicBlock, 4 * w, 2, stride=2)
    m.layer4 = m._make_layer(resnet.BasicBlock, 8 * w, 2, stride=2)
    m.fc = nn.Linear(8 * w, 10)
    return Built(m, {"x": _image()}, {"x": _BATCH}, ["logits"], "ResNet(BasicBlock, [2, 2, 2, 2]) widths 8-64, 10 classes")


def efficientnet_b0(full: bool) -> Built:
    from torchvision.models import efficientnet as ef

    if full:
        return Built(ef.efficientnet_b0(weights=None), {"x": _image(size=224)}, {"x": _BATCH}, ["logits"],
                     "efficientnet_b0")
    setting, last = ef._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.5)
    m = ef.EfficientNet(setting, dropout=0.2, last_channel=last, num_classes=10)
    return Built(m, {"x": _image()}, {"x": _BATCH}, ["logits"], "EfficientNet b0 setting, width_mult=0.25, depth_mult=0.5")


def lraspp_mobilenet_v3(full: bool) -> Built:
    from torchvision.models import mobilenet_v3_large
    from torchvision.models.segmentation import lraspp

    if full:
        m = lraspp.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21)
        return Built(m, {"x": _image(size=224)}, {"x": _BATCH}, ["out"], "lraspp_mobilenet_v3_large")
    backbone = mobilenet_v3_large(weights=None, width_mult=0.25, dilated=True)
    m = lraspp._lraspp_mobilenetv3(backbone, num_classes=4)
    m.classifier.cbr[0] = nn.Conv2d(m.classifier.cbr[0].in_channels, 32, 1, bias=False)
    m.classifier.cbr[1] = nn.BatchNorm2d(32)
    m.classifier.scale[1] = nn.Conv2d(m.classifier.scale[1].in_channels, 32, 1, bias=False)
    m.classifier.high_classifier = nn.Conv2d(32, 4, 1)
    return Built(m, {"x": _image()}, {"x": _BATCH}, ["out"],
                 "LRASPP on mobilenet_v3_large(width_mult=0.25, dilated=True), inter_channels 32, 4 classes")


class _NmsDetector(nn.Module):
    """A small anchor-free detector: conv features -> per-cell box and score -> score threshold
    -> per-class torchvision.ops.nms -> top boxes. The postprocess is what detection exports hold:
    Sigmoid, Greater/NonZero, TopK, NonMaxSuppression, Gather."""

    def __init__(self, width: int, classes: int = 3, iou: float = 0.5, score: float = 0.05, keep: int = 50):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, 2, 1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
            nn.Conv2d(2 * width, 2 * width, 3, 2, 1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True))
        self.box = nn.Conv2d(2 * width, 4, 1)
        self.cls = nn.Conv2d(2 * width, classes, 1)
        self.iou, self.score, self.keep = iou, score, keep

    def forward(self, images: torch.Tensor):
        from torchvision.ops import box_convert, nms

        f = self.features(images[:1])  # one image: torchvision's detectors loop over images in Python
        h, w = f.shape[-2:]
        ys = torch.arange(h, dtype=torch.float32).view(-1, 1).expand(h, w)
        xs = torch.arange(w, dtype=torch.float32).view(1, -1).expand(h, w)
        d = self.box(f)[0]
        cx = (xs + torch.sigmoid(d[0])) * 8.0
        cy = (ys + torch.sigmoid(d[1])) * 8.0
        bw, bh = torch.exp(d[2].clamp(max=4.0)) * 8.0, torch.exp(d[3].clamp(max=4.0)) * 8.0
        boxes = box_convert(torch.stack([cx, cy, bw, bh], -1).reshape(-1, 4), "cxcywh", "xyxy")
        scores, labels = torch.sigmoid(self.cls(f)[0]).reshape(self.cls.out_channels, -1).max(0)
        keep = scores > self.score
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        # per-class NMS by offsetting each class's boxes (what batched_nms does; called directly,
        # since batched_nms branches on the box count, which torch.export cannot trace)
        offsets = labels.to(boxes) * (boxes.max() + 1)
        idx = nms(boxes + offsets[:, None], scores, self.iou)[: self.keep]
        return boxes[idx], scores[idx], labels[idx]


def ssdlite_mobilenet_v3(full: bool) -> Built:
    """torchvision's SSDlite320 (its postprocess holds batched_nms). Full size only: the reduced
    corpus uses nms_detector, whose file is small enough to commit."""
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    m = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)
    return Built(_DetectionOutputs(m), {"images": torch.rand(1, 3, 320, 320)}, {"images": {2: "height", 3: "width"}},
                 ["boxes", "scores", "labels"], "ssdlite320_mobilenet_v3_large")


class _DetectionOutputs(nn.Module):
    """torchvision's detectors take a list of images and return a list of dicts: one image tensor
    in, the first image's boxes/scores/labels out (as detection exports are usually wrapped)."""

    def __init__(self, m: nn.Module):
        super().__init__()
        self.m = m

    def forward(self, images: torch.Tensor):
        out = self.m(list(images.unbind(0)))[0]
        return out["boxes"], out["scores"], out["labels"]


def nms_detector(full: bool) -> Built:
    m = _NmsDetector(width=32 if full else 16)
    return Built(m, {"images": _image(batch=1, size=96)}, {"images": {2: "height", 3: "width"}},
                 ["boxes", "scores", "labels"], "custom detector calling torchvision.ops.nms")


class _VoiceActivity(nn.Module):
    """A voice-activity-like model with control flow: a conv front end, a recurrence over the
    frames (a Loop once scripted) and a branch on the mean activation (an If)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.conv = nn.Conv1d(1, width, 5, stride=2, padding=2)
        self.wi = nn.Linear(width, width)
        self.wh = nn.Linear(width, width, bias=False)
        self.loud = nn.Linear(width, 1)
        self.quiet = nn.Linear(width, 1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.conv(audio)).transpose(1, 2)
        h = torch.zeros(f.shape[0], f.shape[2], dtype=f.dtype, device=f.device)
        for i in range(f.shape[1]):
            h = torch.tanh(self.wi(f[:, i]) + self.wh(h))
        return torch.sigmoid(self.branch(f.mean() > 0.5, h))

    def branch(self, loud: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if bool(loud):
            return self.loud(h)
        return self.quiet(h)


class _VoiceActivityCond(_VoiceActivity):
    """The same for torch.export: the branch as torch.cond (the loop unrolls over the static frames)."""

    def branch(self, loud: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.cond(loud, self.loud, self.quiet, (h,))


def _as_cond(m: nn.Module) -> nn.Module:
    out = _VoiceActivityCond(m.conv.out_channels)
    out.load_state_dict(m.state_dict())
    return out.eval()


def vad_control_flow(full: bool) -> Built:
    m = _VoiceActivity(width=64 if full else 16)
    return Built(m, {"audio": torch.randn(2, 1, 1024 if full else 64)}, {"audio": _BATCH}, ["vad"],
                 "conv + recurrence over frames (scripted: Loop) + branch on the mean (If / torch.cond)",
                 scripted=True, dynamo_variant=_as_cond)


# ------------------------------------------------------------------------------------------
# transformers

def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), dtype=torch.int64)


_TEXT = {0: "batch", 1: "sequence"}


class _Tuple(nn.Module):
    """A transformers model with return_dict=False (what users pass to export), its forward
    taking the named inputs."""

    def __init__(self, m: nn.Module, names: list[str]):
        super().__init__()
        self.m, self.names = m, names

    def forward(self, *args):
        return self.m(**dict(zip(self.names, args)), return_dict=False)


def bert(full: bool) -> Built:
    from transformers import BertConfig, BertModel

    cfg = BertConfig() if full else BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=64)
    m = BertModel(cfg, add_pooling_layer=True)
    b, s = 2, 16
    inputs = {"input_ids": _ids(b, s, cfg.vocab_size), "attention_mask": torch.ones(b, s, dtype=torch.int64),
              "token_type_ids": torch.zeros(b, s, dtype=torch.int64)}
    return Built(m, inputs, {k: _TEXT for k in inputs}, ["last_hidden_state", "pooler_output"],
                 "BertModel" + ("" if full else "(hidden 32, 2 layers, 2 heads, vocab 512)"),
                 {"input_ids": (0, cfg.vocab_size), "attention_mask": (0, 2), "token_type_ids": (0, cfg.type_vocab_size)})


def gpt2(full: bool) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(use_cache=False) if full else GPT2Config(vocab_size=512, n_embd=32, n_layer=2, n_head=2,
                                                                 n_positions=64, use_cache=False)
    m = GPT2LMHeadModel(cfg)
    b, s = 2, 16
    inputs = {"input_ids": _ids(b, s, cfg.vocab_size), "attention_mask": torch.ones(b, s, dtype=torch.int64)}
    return Built(m, inputs, {k: _TEXT for k in inputs}, ["logits"],
                 "GPT2LMHeadModel" + ("" if full else "(n_embd 32, 2 layers, 2 heads, vocab 512)"),
                 {"input_ids": (0, cfg.vocab_size), "attention_mask": (0, 2)})


def vit(full: bool) -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(num_labels=1000) if full else ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                                            num_hidden_layers=2, num_attention_heads=2,
                                                            intermediate_size=64, num_labels=10)
    m = ViTForImageClassification(cfg)
    x = torch.rand(2, 3, cfg.image_size, cfg.image_size)
    return Built(m, {"pixel_values": x}, {"pixel_values": _BATCH}, ["logits"],
                 "ViTForImageClassification" + ("" if full else "(32x32, patch 8, hidden 32, 2 layers, 10 labels)"))


def whisper(full: bool) -> Built:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    if full:  # whisper-tiny's shape
        cfg = WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                            decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, use_cache=False)
    else:
        cfg = WhisperConfig(vocab_size=512, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
                            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, max_source_positions=32, max_target_positions=32, use_cache=False,
                            decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = WhisperForConditionalGeneration(cfg)
    b = 2
    inputs = {"input_features": torch.randn(b, cfg.num_mel_bins, 2 * cfg.max_source_positions),
              "decoder_input_ids": _ids(b, 8, cfg.vocab_size)}
    return Built(m, inputs, {"input_features": _BATCH, "decoder_input_ids": _TEXT}, ["logits", "encoder_last_hidden_state"],
                 "WhisperForConditionalGeneration" + ("" if full else "(d_model 32, 1+1 layers, 16 mel bins, vocab 512)"),
                 {"decoder_input_ids": (0, cfg.vocab_size)})


def _llama(full: bool, dynamic_sequence: bool) -> Built:
    """A LLaMA-style decoder: RMSNorm, rotary position embedding, SwiGLU MLP and grouped-query
    attention (4 query heads sharing 2 key/value heads), no KV cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if full:  # a 1B-class shape (hidden 2048, 16 layers, GQA 32/8)
        cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048,
                          use_cache=False)
    else:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          rms_norm_eps=1e-6, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = LlamaForCausalLM(cfg)
    b, s = 2, 16
    inputs = {"input_ids": _ids(b, s, cfg.vocab_size), "attention_mask": torch.ones(b, s, dtype=torch.int64)}
    axes = _TEXT if dynamic_sequence else _BATCH
    what = (f"hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, "
            f"{cfg.num_key_value_heads} KV heads, vocab {cfg.vocab_size}")
    return Built(m, inputs, {k: axes for k in inputs}, ["logits"],
                 f"LlamaForCausalLM({what}), sequence {'dynamic' if dynamic_sequence else f'static {s}'}",
                 {"input_ids": (0, cfg.vocab_size), "attention_mask": (0, 2)})


def llama(full: bool) -> Built:
    return _llama(full, dynamic_sequence=True)


def llama_static(full: bool) -> Built:
    return _llama(full, dynamic_sequence=False)


class _DecodeStep(nn.Module):
    """One decoding step of a causal LM over a KV cache passed in and returned as tensors (the
    form a deployed decoder takes: a one-token query attending to past + new keys)."""

    def __init__(self, m: nn.Module, layers: int):
        super().__init__()
        if layers != 2:
            raise ValueError("the decode-step wrapper names the cache of 2 layers (the reduced config)")
        self.m, self.layers = m, layers

    def forward(self, input_ids, attention_mask, past_key_0, past_value_0, past_key_1, past_value_1):
        from transformers.cache_utils import DynamicCache

        past = (past_key_0, past_value_0, past_key_1, past_value_1)  # named: the exporters key inputs by name
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        new = out.past_key_values
        return (out.logits, *[t for i in range(self.layers) for t in (new.layers[i].keys, new.layers[i].values)])


def llama_kv(full: bool) -> Built:
    """The LLaMA-style decoder (GQA 4/2) as one decode step over a KV cache of 7 tokens: the
    attention's K and V are Concat(past, new) (IncreFlashAttention's case on Ascend)."""
    built = _llama(full, dynamic_sequence=False)
    cfg = built.module.config
    layers, kvh = cfg.num_hidden_layers, cfg.num_key_value_heads
    d = cfg.hidden_size // cfg.num_attention_heads
    b, past = 2, 7
    inputs = {"input_ids": _ids(b, 1, cfg.vocab_size), "attention_mask": torch.ones(b, past + 1, dtype=torch.int64)}
    for i in range(layers):
        inputs[f"past_key_{i}"] = torch.randn(b, kvh, past, d)
        inputs[f"past_value_{i}"] = torch.randn(b, kvh, past, d)
    outputs = ["logits"] + [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    return Built(_DecodeStep(built.module, layers), inputs, {k: _BATCH for k in inputs}, outputs,
                 built.note + f", one decode step over a KV cache of {past} tokens",
                 {"input_ids": (0, cfg.vocab_size), "attention_mask": (1, 2)})


def llama_fp16(full: bool) -> Built:
    """The static LLaMA-style decoder in float16 (``model.half()``): what a user brings for a float16
    deployment; its RMSNorms upcast to float32 inside (LlamaRMSNorm), its attention runs in float16."""
    built = _llama(full, dynamic_sequence=False)
    built.module.half()
    return dataclasses.replace(built, note=built.note + ", float16")
# ------------------------------------------------------------------------------------------
# style transfer (ReflectionPad2d: Pad mode=reflect, an AI CPU op on Ascend; issue 25)

class _ConvLayer(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1):
        super().__init__(nn.ReflectionPad2d(k // 2), nn.Conv2d(cin, cout, k, stride))


class _Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(_ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                                  _ConvLayer(c, c, 3), nn.InstanceNorm2d(c, affine=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class _TransformerNet(nn.Module):
    """Johnson et al.'s fast style-transfer network (the PyTorch examples' TransformerNet):
    reflection-padded convolutions, instance norms, residual blocks, upsampling."""

    def __init__(self, width: int, blocks: int):
        super().__init__()
        w = width
        layers: list[nn.Module] = [_ConvLayer(3, w, 9), nn.InstanceNorm2d(w, affine=True), nn.ReLU(),
                                   _ConvLayer(w, 2 * w, 3, 2), nn.InstanceNorm2d(2 * w, affine=True), nn.ReLU(),
                                   _ConvLayer(2 * w, 4 * w, 3, 2), nn.InstanceNorm2d(4 * w, affine=True), nn.ReLU()]
        layers += [_Residual(4 * w) for _ in range(blocks)]
        layers += [nn.Upsample(scale_factor=2, mode="nearest"), _ConvLayer(4 * w, 2 * w, 3),
                   nn.InstanceNorm2d(2 * w, affine=True), nn.ReLU(),
                   nn.Upsample(scale_factor=2, mode="nearest"), _ConvLayer(2 * w, w, 3),
                   nn.InstanceNorm2d(w, affine=True), nn.ReLU(), _ConvLayer(w, 3, 9)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def style_transfer(full: bool) -> Built:
    width, blocks = (32, 5) if full else (4, 1)
    return Built(_TransformerNet(width, blocks), {"x": _image(size=256 if full else 32)}, {"x": _BATCH}, ["image"],
                 f"TransformerNet(width {width}, {blocks} residual blocks)")


MODELS: dict[str, Callable[[bool], Built]] = {
    "shufflenet_v2": shufflenet_v2,
    "mobilenet_v3_small": mobilenet_v3_small,
    "resnet18": resnet18,
    "efficientnet_b0": efficientnet_b0,
    "lraspp_mobilenet_v3": lraspp_mobilenet_v3,
    "nms_detector": nms_detector,
    "vad_control_flow": vad_control_flow,
    "bert": bert,
    "gpt2": gpt2,
    "vit": vit,
    "whisper": whisper,
    "llama": llama,
    "llama_static": llama_static,
    "llama_fp16": llama_fp16,
    "llama_kv": llama_kv,
    "style_transfer": style_transfer,
}
FULL_ONLY = {"ssdlite_mobilenet_v3": ssdlite_mobilenet_v3}


def _randomize_norms(m: nn.Module) -> None:
    """Seeded non-trivial BatchNorm statistics (fresh ones are mean 0, var 1: folding them is a no-op)."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)


def _perturb(m: nn.Module, scale: float = 0.02) -> None:
    """Seeded noise on every parameter: fresh initializations hold zero biases and unit norm
    scales, which a trained model never has (an optimizer that drops ``x + 0`` would look better
    on them than on any real model)."""
    with torch.no_grad():
        for p in m.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * scale)


def _build(name: str, full: bool) -> Built:
    torch.manual_seed(0)
    built = {**MODELS, **FULL_ONLY}[name](full)
    torch.manual_seed(1)
    _randomize_norms(built.module)
    _perturb(built.module)
    built.module.eval()
    return built


def _export(built: Built, exporter: str, path: Path) -> None:
    names = list(built.inputs)
    hf = type(built.module).__module__.startswith("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            # transformers models: return_dict=False, the inputs by name (a thin wrapper, as the
            # tracer takes positional inputs only)
            module = _Tuple(built.module, names) if hf else built.module
            if built.scripted:
                module = torch.jit.script(module)
            dynamic_axes = {k: dict(v) for k, v in built.dynamic.items() if v}
            batch = any(d.get(0) == "batch" for d in built.dynamic.values())
            for o in built.outputs:
                if batch:
                    dynamic_axes[o] = {0: "batch"}
            torch.onnx.export(module, tuple(built.inputs.values()), str(path), dynamo=False,
                              opset_version=TORCHSCRIPT_OPSET, input_names=names, output_names=built.outputs,
                              dynamic_axes=dynamic_axes)
        else:
            dims: dict[str, Any] = {}
            shapes = {n: {ax: dims.setdefault(d, torch.export.Dim(d, min=1, max=1024))
                          for ax, d in built.dynamic.get(n, {}).items()} or None for n in names}
            if hf:  # keyword inputs, as users pass them to a transformers model
                program = torch.onnx.export(built.module, (), kwargs=dict(built.inputs), dynamo=True,
                                            opset_version=DYNAMO_OPSET, input_names=names, output_names=built.outputs,
                                            dynamic_shapes=shapes, verbose=False)
            else:
                module = built.dynamo_variant(built.module) if built.dynamo_variant else built.module
                program = torch.onnx.export(module, tuple(built.inputs.values()), dynamo=True,
                                            opset_version=DYNAMO_OPSET, input_names=names, output_names=built.outputs,
                                            dynamic_shapes=tuple(shapes.values()), verbose=False)
            program.save(str(path), external_data=True)


def _error(e: BaseException) -> str:
    """One line: the outer error's type and the innermost cause's first line (the exporters wrap
    the reason in a generic message)."""
    inner = e
    while inner.__cause__ is not None or (inner.__context__ is not None and not inner.__suppress_context__):
        inner = inner.__cause__ or inner.__context__
    import re

    msg = re.sub(r"\x1b\[[0-9;]*m", "", (str(inner).strip().splitlines() or [""])[0])
    head = type(e).__name__ if inner is e else f"{type(e).__name__} <- {type(inner).__name__}"
    return f"{head}: {msg}"[:400]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _describe(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    elem = onnx.TensorProto.DataType.Name

    def shape(vi):
        return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
                for d in vi.type.tensor_type.shape.dim]

    inits = {t.name for t in m.graph.initializer}
    locations = sorted({e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"})
    return {
        "opset": next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(m.graph.node),
        "inputs": [{"name": i.name, "shape": shape(i), "dtype": elem(i.type.tensor_type.elem_type).lower()}
                   for i in m.graph.input if i.name not in inits],
        "outputs": [o.name for o in m.graph.output],
        "external_data": [{"file": loc, "sha256": _sha256(path.parent / loc),
                           "bytes": (path.parent / loc).stat().st_size} for loc in locations],
    }


def _versions() -> dict:
    try:
        import transformers

        tf = transformers.__version__
    except ImportError:
        tf = None
    try:
        import onnxscript

        osv = onnxscript.__version__
    except ImportError:
        osv = None
    try:  # the transformer models export without torchvision (imported by the builders that use it)
        import torchvision

        tv = torchvision.__version__
    except ImportError:
        tv = None
    return {"torch": torch.__version__, "torchvision": tv, "transformers": tf,
            "onnxscript": osv, "python": platform.python_version()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT.relative_to(Path.cwd()) if DEFAULT_OUT.is_relative_to(Path.cwd()) else DEFAULT_OUT}; required with --full)")
    ap.add_argument("--full", action="store_true", help="standard sizes (for benchmarks; write them outside git)")
    ap.add_argument("--models", nargs="*", default=None, help=" ".join([*MODELS, *FULL_ONLY]))
    ap.add_argument("--exporters", nargs="*", default=list(EXPORTERS), choices=EXPORTERS)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per export; a slower one is recorded as failed")
    args = ap.parse_args(argv)
    if args.full and args.out is None:
        ap.error("--full needs --out (full-size files are not committed)")
    out = (args.out or DEFAULT_OUT).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = args.models or [*MODELS, *(FULL_ONLY if args.full else {})]
    unknown = [n for n in names if n not in MODELS and n not in FULL_ONLY]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {[*MODELS, *FULL_ONLY]}")
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": []}
    entries = {(e["model"], e["exporter"]): e for e in manifest.get("files", [])}
    versions = _versions()
    command = "python benchmarks/export_corpus.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    for name in names:
        for exporter in args.exporters:
            path = out / f"{name}.{exporter}.onnx"
            for old in [path, path.with_name(path.name + ".data")]:
                if old.exists():
                    old.unlink()
            entry: dict[str, Any] = {"file": path.name, "model": name, "exporter": exporter,
                                     "size": "full" if args.full else "reduced", "versions": versions,
                                     "command": command.strip()}
            t0 = time.perf_counter()

            def _timeout(signum, frame):
                raise TimeoutError(f"the export took more than {args.timeout} s")

            signal.signal(signal.SIGALRM, _timeout)
            signal.alarm(args.timeout)
            try:
                built = _build(name, args.full)
                entry["built"] = built.note
                entry["parameters"] = sum(p.numel() for p in built.module.parameters())
                entry["example_inputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
                                               **({"range": list(built.ranges[k])} if k in built.ranges else {})}
                                           for k, v in built.inputs.items()}
                _export(built, exporter, path)
                entry.update(_describe(path))
                entry["sha256"] = _sha256(path)
                entry["bytes"] = path.stat().st_size
                status = f"{entry['nodes']} nodes, {entry['bytes'] + sum(e['bytes'] for e in entry['external_data']):,} bytes"
            except Exception as e:  # noqa: BLE001 - an exporter's failure is a result, recorded
                entry["file"] = None
                entry["error"] = _error(e)
                status = "FAILED " + entry["error"]
                if os.environ.get("EXPORT_CORPUS_TRACEBACK"):
                    traceback.print_exc()
                for old in [path, path.with_name(path.name + ".data")]:
                    if old.exists():
                        old.unlink()
            finally:
                signal.alarm(0)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            entries[(name, exporter)] = entry
            print(f"{name:22s} {exporter:12s} {status}", flush=True)
            manifest = {"about": "real-exporter corpus written by benchmarks/export_corpus.py; see that script's docstring",
                        "files": sorted(entries.values(), key=lambda e: (e["model"], e["exporter"]))}
            manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
