"""Synthetic graphs for benchmarks: residual Conv/BN/Relu/Add stacks and a wide fan-out graph.

Each residual block also carries a little of what the cleanup passes remove (an Identity, a
Transpose pair, a constant expression, a duplicate node), so the passes have real work to do.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def residual_stack(target_nodes: int, channels: int = 16, hw: int = 8, seed: int = 0,
                   weight_scale: float = 0.1) -> onnx.ModelProto:
    """About ``target_nodes`` nodes of Conv-BN-Relu-Conv-BN-Add-Relu blocks (+ cleanup bait).

    ``weight_scale``: the convolutions' weight std. The default makes activations grow block by
    block (fine for timing); a small one (0.01) keeps a deep stack finite for numeric checks."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    per_block = 15
    blocks = max(1, target_nodes // per_block)
    c = channels

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    x = "input"
    for b in range(blocks):
        p = f"b{b}"
        w1 = init(f"{p}.w1", (rng.standard_normal((c, c, 3, 3)) * weight_scale).astype(np.float32))
        w2 = init(f"{p}.w2", (rng.standard_normal((c, c, 3, 3)) * weight_scale).astype(np.float32))
        bn = [init(f"{p}.bn{k}", v) for k, v in (("s", np.ones(c, np.float32)), ("b", np.zeros(c, np.float32)),
                                                  ("m", np.zeros(c, np.float32)), ("v", np.ones(c, np.float32)))]
        half = init(f"{p}.half", np.array([0.5], np.float32))
        nodes += [
            helper.make_node("Conv", [x, w1], [f"{p}.c1"], name=f"{p}.conv1", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{p}.c1", *bn], [f"{p}.n1"], name=f"{p}.bn1"),
            helper.make_node("Relu", [f"{p}.n1"], [f"{p}.r1"], name=f"{p}.relu1"),
            helper.make_node("Identity", [f"{p}.r1"], [f"{p}.id"], name=f"{p}.identity"),
            helper.make_node("Conv", [f"{p}.id", w2], [f"{p}.c2"], name=f"{p}.conv2", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{p}.c2", *bn], [f"{p}.n2"], name=f"{p}.bn2"),
            helper.make_node("Transpose", [f"{p}.n2"], [f"{p}.t1"], name=f"{p}.t1", perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", [f"{p}.t1"], [f"{p}.t2"], name=f"{p}.t2", perm=[0, 3, 1, 2]),
            helper.make_node("Add", [half, half], [f"{p}.one"], name=f"{p}.const_add"),
            helper.make_node("Mul", [f"{p}.t2", f"{p}.one"], [f"{p}.scaled"], name=f"{p}.scale"),
            helper.make_node("Add", [f"{p}.scaled", x], [f"{p}.sum"], name=f"{p}.residual"),
            helper.make_node("Relu", [f"{p}.sum"], [f"{p}.out"], name=f"{p}.relu2"),
            helper.make_node("Sigmoid", [f"{p}.out"], [f"{p}.g1"], name=f"{p}.gate1"),
            helper.make_node("Sigmoid", [f"{p}.out"], [f"{p}.g2"], name=f"{p}.gate2"),
            helper.make_node("Max", [f"{p}.g1", f"{p}.g2", f"{p}.out"], [f"{p}.y"], name=f"{p}.max"),
        ]
        x = f"{p}.y"
    graph = helper.make_graph(
        nodes, "residual_stack",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def wide_fanout(target_nodes: int, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """One input read by ~target_nodes/3 branches (Mul by a constant -> Relu), summed by an Add tree."""
    rng = np.random.default_rng(seed)
    branches = max(2, target_nodes // 3)
    nodes, inits, outs = [], [], []
    for i in range(branches):
        inits.append(numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"k{i}"))
        nodes.append(helper.make_node("Mul", ["x", f"k{i}"], [f"m{i}"], name=f"mul{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"))
        outs.append(f"r{i}")
    level = 0
    while len(outs) > 1:
        nxt = []
        for j in range(0, len(outs) - 1, 2):
            name = f"add{level}_{j}"
            nodes.append(helper.make_node("Add", [outs[j], outs[j + 1]], [name], name=name))
            nxt.append(name)
        if len(outs) % 2:
            nxt.append(outs[-1])
        outs, level = nxt, level + 1
    graph = helper.make_graph(nodes, "wide_fanout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
                              [helper.make_tensor_value_info(outs[0], TensorProto.FLOAT, [width])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def transformer_stack(target_nodes: int, hidden: int = 16, ffn: int = 32, seq: int = 8, seed: int = 0,
                      weight_scale: float = 0.1) -> onnx.ModelProto:
    """About ``target_nodes`` nodes of transformer layers as exporters write them: attention
    (MatMul+Add projections, Transpose, MatMul, Mul by the scale, Softmax), LayerNorm spelled out
    in its parts (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Add), a Relu FFN,
    residual Adds; 38 nodes per layer, seeded random weights."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    layers = max(1, target_nodes // 38)
    d = hidden

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def weight(name, *shape):
        return init(name, (rng.standard_normal(shape) * weight_scale).astype(np.float32))

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def layer_norm(p, x):
        mu = node("ReduceMean", [x], f"{p}.mean", axes=[-1])
        c = node("Sub", [x, mu], f"{p}.centered")
        sq = node("Pow", [c, init(f"{p}.two", np.array(2.0, np.float32))], f"{p}.square")  # torch writes x.pow(2)
        var = node("ReduceMean", [sq], f"{p}.var", axes=[-1])
        ve = node("Add", [var, init(f"{p}.eps", np.array(1e-5, np.float32))], f"{p}.var_eps")
        sd = node("Sqrt", [ve], f"{p}.std")
        n = node("Div", [c, sd], f"{p}.normed")
        n = node("Mul", [n, init(f"{p}.gamma", (1 + rng.standard_normal(d) * 0.1).astype(np.float32))], f"{p}.scaled")
        return node("Add", [n, weight(f"{p}.beta", d)], f"{p}.out")

    x = "input"
    for i in range(layers):
        p = f"l{i}"
        q = node("Add", [node("MatMul", [x, weight(f"{p}.wq", d, d)], f"{p}.q0"), weight(f"{p}.bq", d)], f"{p}.q")
        k = node("Add", [node("MatMul", [x, weight(f"{p}.wk", d, d)], f"{p}.k0"), weight(f"{p}.bk", d)], f"{p}.k")
        v = node("Add", [node("MatMul", [x, weight(f"{p}.wv", d, d)], f"{p}.v0"), weight(f"{p}.bv", d)], f"{p}.v")
        kt = node("Transpose", [k], f"{p}.kt", perm=[0, 2, 1])
        s = node("Mul", [node("MatMul", [q, kt], f"{p}.qk"), init(f"{p}.scale", np.array(d ** -0.5, np.float32))],
                 f"{p}.scores")
        a = node("MatMul", [node("Softmax", [s], f"{p}.probs", axis=-1), v], f"{p}.attn")
        o = node("Add", [node("MatMul", [a, weight(f"{p}.wo", d, d)], f"{p}.o0"), weight(f"{p}.bo", d)], f"{p}.o")
        h = layer_norm(f"{p}.ln1", node("Add", [x, o], f"{p}.res1"))
        f = node("Relu", [node("Add", [node("MatMul", [h, weight(f"{p}.w1", d, ffn)], f"{p}.f0"),
                                       weight(f"{p}.b1", ffn)], f"{p}.f1")], f"{p}.f2")
        f = node("Add", [node("MatMul", [f, weight(f"{p}.w2", ffn, d)], f"{p}.f3"), weight(f"{p}.b2", d)], f"{p}.f4")
        x = layer_norm(f"{p}.ln2", node("Add", [h, f], f"{p}.res2"))
    graph = helper.make_graph(
        nodes, "transformer_stack",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, d])], initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
