"""Issue 26: per transformer of the real-exporter corpus (tests/data/exporters), what the transformer
fusions do: nodes and the estimate (target ascend910b2) before, after the default pipeline
without the attention/norm/GELU/rotary/gated-MLP fusions, and after it with them, and the ops formed.

    python benchmarks/transformer_fusions.py [--target ascend910b2] [--markdown]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import graphpass as gp

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "exporters"
MODELS = ("bert", "gpt2", "vit", "whisper", "llama", "llama_static", "llama_fp16", "llama_kv")
#: the fusions of attention, norms, GELU, rotary embeddings and gated MLPs (the baseline runs without them)
OURS = ("fuse_attention", "fuse_rms_norm", "fuse_rotary_embedding", "fuse_swiglu", "fuse_gelu", "fuse_layer_norm")
SHOWN = ("Attention", "AttentionBSH", "RmsNorm", "AddRmsNorm", "RotaryEmbedding", "SwiGlu", "LayerNormalization",
         "LayerNorm", "Gelu", "GeluTanh")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="ascend910b2")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    entries = [e for e in json.loads((CORPUS / "manifest.json").read_text())["files"]
               if e.get("file") and e["model"] in MODELS]
    rows = []
    for e in sorted(entries, key=lambda e: (MODELS.index(e["model"]), e["exporter"])):
        path = str(CORPUS / e["file"])
        full = gp.optimize(path, target=args.target)
        base = gp.optimize(path, target=args.target, disable=OURS)
        dev = gp.to_proto(full.graph, emit="device")
        ops = collections.Counter(n.op_type for n in dev.graph.node)
        fused = ", ".join(f"{op} {ops[op]}" for op in SHOWN if ops.get(op))
        r = full.report
        rows.append((e["file"].removesuffix(".onnx"), r.nodes_before, base.report.nodes_after, r.nodes_after,
                     r.cost_before_us, base.report.cost_after_us, r.cost_after_us, fused))
    head = ("export", "nodes", "nodes, without", "nodes, with", "est. µs", "est. µs, without", "est. µs, with",
            "fused")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.1f} | {r[7]} |")
    else:
        for r in rows:
            print(f"{r[0]:28s} nodes {r[1]:4d} -> {r[2]:4d} -> {r[3]:4d}   est {r[4]:8.1f} -> {r[5]:8.1f} -> {r[6]:8.1f} us   {r[7]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
