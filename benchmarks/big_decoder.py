"""A LLaMA-style decoder at real hidden size (4096) with more than 4 GB of external weights,
generated with seeded random weights (never committed, never downloaded), through
``graphpass optimize`` in a child process: wall time, peak RSS against the weights' size (the
big-model benchmark's bar, benchmarks/big_models.py: under 1.5x), and the transformer ops formed.

    python benchmarks/big_decoder.py                       # 6 layers: ~4.2 GB of float32 weights
    python benchmarks/big_decoder.py --layers 2 --keep /tmp/dec

Each layer is what torch's dynamo exporter writes for a LlamaDecoderLayer (hidden 4096, 32 heads
of 128, MLP 11008; the key/value heads not grouped, to keep the graph small): RMSNorm as Pow,
ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul; q/k/v MatMuls; rotate-half rotary on q and k
(Slice, Neg, Concat, Mul, Add); attention (MatMul, scale, Softmax, MatMul); the residual Adds; the
SwiGLU MLP (two MatMuls, Sigmoid, Mul, Mul, down MatMul). Batch 1, sequence 16, static.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, HEAD_DIM, MLP, SEQ = 4096, 32, 128, 11008, 16


def build(folder: Path, layers: int, seed: int = 0) -> tuple[Path, int]:
    rng = np.random.default_rng(seed)
    data = folder / "decoder.onnx.data"
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    offset = 0
    small: dict[str, np.ndarray] = {
        "two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "axes": np.array([-1], np.int64),
        "h0": np.array([0], np.int64), "h1": np.array([HEAD_DIM // 2], np.int64),
        "hend": np.array([2 ** 62], np.int64), "ax": np.array([-1], np.int64), "one": np.array([1], np.int64),
        "split_heads": np.array([1, SEQ, HEADS, HEAD_DIM], np.int64), "merge": np.array([1, SEQ, HIDDEN], np.int64),
        "scale": np.array(HEAD_DIM ** -0.5, np.float32),
    }
    pos = np.arange(SEQ)[:, None] / (10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM))[None, :]
    ang = np.concatenate([pos, pos], axis=-1)[None, None]
    small["cos"], small["sin"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    for k, v in small.items():
        inits.append(numpy_helper.from_array(v, k))

    with open(data, "wb") as f:
        def weight(name: str, shape: tuple[int, ...], scale: float = 0.02, around: float = 0.0) -> str:
            nonlocal offset
            arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(around)
            raw = arr.tobytes()
            f.write(raw)
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data.name), ("offset", str(offset)), ("length", str(len(raw)))):
                t.external_data.add(key=k, value=v)
            offset += len(raw)
            inits.append(t)
            return name

        def n(op, ins, out=None, **attrs):
            out = out or f"t{len(nodes)}"
            nodes.append(helper.make_node(op, ins, [out], **attrs))
            return out

        def rms(x, w):
            sq = n("Pow", [x, "two"])
            ms = n("ReduceMean", [sq, "axes"], keepdims=1)
            r = n("Reciprocal", [n("Sqrt", [n("Add", [ms, "eps"])])])
            return n("Mul", [w, n("Mul", [x, r])])

        def heads(x):
            return n("Transpose", [n("Reshape", [x, "split_heads"])], perm=[0, 2, 1, 3])

        def rotary(x):
            x1 = n("Slice", [x, "h0", "h1", "ax", "one"])
            x2 = n("Slice", [x, "h1", "hend", "ax", "one"])
            rot = n("Concat", [n("Neg", [x2]), x1], axis=-1)
            return n("Add", [n("Mul", [x, "cos"]), n("Mul", [rot, "sin"])])

        x = "hidden_states"
        for i in range(layers):
            p = f"layers.{i}."
            h = rms(x, weight(p + "input_layernorm.weight", (HIDDEN,), 0.05, 1.0))
            q = rotary(heads(n("MatMul", [h, weight(p + "q_proj", (HIDDEN, HIDDEN))])))
            k = rotary(heads(n("MatMul", [h, weight(p + "k_proj", (HIDDEN, HIDDEN))])))
            v = heads(n("MatMul", [h, weight(p + "v_proj", (HIDDEN, HIDDEN))]))
            s = n("Mul", [n("MatMul", [q, n("Transpose", [k], perm=[0, 1, 3, 2])]), "scale"])
            a = n("MatMul", [n("Softmax", [s], axis=-1), v])
            a = n("Reshape", [n("Transpose", [a], perm=[0, 2, 1, 3]), "merge"])
            x = n("Add", [x, n("MatMul", [a, weight(p + "o_proj", (HIDDEN, HIDDEN))])])
            h = rms(x, weight(p + "post_attention_layernorm.weight", (HIDDEN,), 0.05, 1.0))
            g = n("MatMul", [h, weight(p + "gate_proj", (HIDDEN, MLP))])
            u = n("MatMul", [h, weight(p + "up_proj", (HIDDEN, MLP))])
            m = n("Mul", [n("Mul", [g, n("Sigmoid", [g])]), u])
            x = n("Add", [x, n("MatMul", [m, weight(p + "down_proj", (MLP, HIDDEN))])])
        y = rms(x, weight("norm.weight", (HIDDEN,), 0.05, 1.0))
        nodes[-1].output[0] = "last_hidden_state"
        del y
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, SEQ, HIDDEN])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = folder / "decoder.onnx"
    path.write_bytes(model.SerializeToString())
    return path, offset


_CHILD = ("import resource, sys, collections, onnx\n"
          "from graphpass.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
          "sys.exit(rc)\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6, help="decoder layers (6: ~4.2 GB of float32 weights)")
    ap.add_argument("--target", default="ascend910b2")
    ap.add_argument("--keep", default=None, help="write the models here instead of a temporary folder")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        path, weights = build(folder, args.layers)
        gen = time.perf_counter() - t0
        out = folder / "decoder.opt.onnx"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, "optimize", str(path), "-o", str(out), "-q",
                               "--target", args.target, "--emit", "device"], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        peak = 0
        for line in proc.stderr.splitlines():
            if line.startswith("peak_rss_kb "):
                peak = int(line.split()[1]) * 1024
            elif proc.returncode:
                print(line, file=sys.stderr)
        fused = ""
        if proc.returncode == 0:
            m = onnx.load(str(out), load_external_data=False)
            ops: dict[str, int] = {}
            for node in m.graph.node:
                if node.domain == "graphpass.ascend":
                    ops[node.op_type] = ops.get(node.op_type, 0) + 1
            fused = ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))
    print("| decoder | weights MB | generate s | optimize s | peak RSS MB | RSS / weights | exit | formed |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    print(f"| {args.layers} layers, hidden {HIDDEN} | {weights / 1e6:,.0f} | {gen:.0f} | {dt:.0f} | {peak / 1e6:,.0f} | "
          f"{peak / max(weights, 1):.2f} | {proc.returncode} | {fused} |")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
