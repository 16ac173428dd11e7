"""Mixed precision as Ascend's precision modes define it, with Casts only at the boundaries.

    mode force_fp16             every float compute op runs in fp16
    mode allow_fp32_to_fp16     Cube ops (Conv, ConvTranspose, MatMul, Gemm) in fp16, the rest fp32
    mode allow_mix_precision    white list fp16, black list fp32, gray ops follow their inputs
    mode must_keep_origin_dtype nothing changes

(ATC-PM and MS-AMP, ascend_facts.md §7.) Nodes named in ``keep_fp32`` stay fp32 whatever the
mode (``--keep-fp32 auto`` takes the precision analysis' recommendations). Constants an fp16
node reads are converted at compile time; a runtime fp32 tensor entering an fp16 region gets
one Cast to fp16, and an fp16 tensor leaving it (to an fp32 node or a graph output) one Cast
back, shared by all readers. Graph inputs and outputs keep their dtypes. Main graph only.
The report lists the ops of the graph that are fp16-only on Ascend (the op-info table).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.errors import UsageError
from graphpass.infra.pass_base import Promise
from graphpass.infra import Pass, PassContext, PassKind, PassResult, register
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen

__all__ = ["MixedPrecision", "MODES", "WHITE", "BLACK", "CUBE"]

MODES = ("force_fp16", "allow_fp32_to_fp16", "allow_mix_precision", "must_keep_origin_dtype")
CUBE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: fp16 in allow_mix_precision (MS-AMP white list: Conv, Dense/MatMul, BatchMatMul, PReLU, ReLU, RNN cells)
WHITE = CUBE | {"PRelu", "Relu", "LSTM", "GRU", "RNN"}
#: fp32 in allow_mix_precision: ops whose range or accuracy fp16 cannot hold (logs, exponentials,
#: reductions, normalizations, divisions)
BLACK = frozenset({"Log", "Exp", "Pow", "Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL2",
                   "ReduceLogSumExp", "ReduceSumSquare", "Sqrt", "Reciprocal", "Div", "Erf", "Softplus",
                   "LayerNormalization", "InstanceNormalization", "CumSum", "TopK"})
#: ops that compute on floats and run in fp16 (anything else is left as it is)
FLOAT_OPS = WHITE | BLACK | frozenset({
    "Add", "Sub", "Mul", "Max", "Min", "Sum", "Mean", "Abs", "Neg", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSwish",
    "HardSigmoid", "Elu", "Selu", "Gelu", "Mish", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "LRN", "Concat", "Split", "Slice", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
    "Identity", "Gather", "Pad", "Resize", "Where", "ReduceMax", "ReduceMin", "Floor", "Ceil", "Round",
    "DepthToSpace", "SpaceToDepth", "Tile", "Expand"})
F32, F16 = np.dtype("float32"), np.dtype("float16")


def _is_f32(t: gs.Tensor) -> bool:
    try:
        return t.dtype is not None and np.dtype(t.dtype) == F32
    except TypeError:
        return False


@register
class MixedPrecision(Pass):
    """Converts compute to fp16 by an Ascend precision mode.

    Cases:
      1. the four modes above; gray ops in allow_mix_precision take fp16 only when every float
         input comes from fp16 (or is a constant);
      2. ``keep_fp32`` node names always stay fp32;
      3. constants convert at compile time; runtime tensors cross fp32/fp16 through shared Casts.
    Options: ``mode`` (default force_fp16), ``keep_fp32`` (a list of node names), ``emulate``
    (keep fp32 dtypes and round every fp16 value instead: for checking fp16 numerics on a CPU).
    """

    name = "mixed_precision"
    summary = "Convert compute to fp16 by Ascend precision mode (white/black/gray lists, keep-fp32)."
    kind = PassKind.PRECISION
    promise = Promise.tolerance("fp16", rtol=1e-2, atol=1e-3, reason="opt-in: the chosen tensors are computed in float16 (the user asked for lower precision)")
    default_enabled = False
    scored = False  # a precision choice the user asked for, not a speed rewrite to veto
    preserves_order = False

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        opts = self.options(ctx)
        mode = opts.get("mode", "force_fp16")
        if mode not in MODES:
            raise UsageError(f"mixed_precision: unknown mode '{mode}'; known: {', '.join(MODES)}")
        keep = set(opts.get("keep_fp32", ()))
        stats = {"fp16_nodes": 0, "casts": 0, "constants_converted": 0, "fp16_only_ops": self._fp16_only(graph)}
        if mode == "must_keep_origin_dtype":
            return PassResult(False, stats)
        half: set[int] = set()  # ids of tensors that are now fp16
        chosen: list[gs.Node] = []
        for node in graph.nodes:
            if node.op not in FLOAT_OPS or node.domain not in (None, "", "ai.onnx") or node.name in keep:
                continue
            floats = [t for t in node.inputs if t.name and _is_f32(t)]
            if not floats and not any(id(t) in half for t in node.inputs):
                continue
            if mode == "force_fp16":
                take = True
            elif mode == "allow_fp32_to_fp16":
                take = node.op in CUBE
            elif node.op in WHITE:
                take = True
            elif node.op in BLACK:
                take = False
            else:  # gray: follow the inputs
                runtime = [t for t in node.inputs if t.name and not isinstance(t, gs.Constant) and (_is_f32(t) or id(t) in half)]
                take = bool(runtime) and all(id(t) in half for t in runtime)
            if take:
                chosen.append(node)
                half.update(id(t) for t in node.outputs if _is_f32(t))
        if not chosen:
            return PassResult(False, stats)
        if opts.get("emulate", False):
            return self._emulate(graph, chosen, stats)
        names = NameGen(graph)
        chosen_ids = {id(n) for n in chosen}
        to16: dict[int, gs.Tensor] = {}
        consts: dict[int, gs.Constant] = {}
        new_nodes: list[gs.Node] = []
        # 1. inputs of fp16 nodes
        for node in chosen:
            for i, t in enumerate(node.inputs):
                if not t.name or not _is_f32(t) or id(t) in half:
                    continue
                if isinstance(t, gs.Constant):
                    if id(t) not in consts:
                        consts[id(t)] = gs.Constant(names(t.name + "_fp16"), np.asarray(t.values).astype(np.float16))
                        stats["constants_converted"] += 1
                    node.inputs[i] = consts[id(t)]
                else:
                    if id(t) not in to16:
                        c = gs.Variable(names(t.name + "_fp16"), dtype=F16, shape=t.shape)
                        cast = gs.Node("Cast", name=names(t.name + "_to_fp16"), inputs=[t], outputs=[c], attrs={"to": onnx.TensorProto.FLOAT16})
                        A.mark_created(cast, self.name)
                        new_nodes.append(cast)
                        to16[id(t)] = c
                        stats["casts"] += 1
                    node.inputs[i] = to16[id(t)]
        # 2. outputs become fp16; readers outside the region and graph outputs get a Cast back
        graph_outs = {id(t) for t in graph.outputs}
        for node in chosen:
            A.set(node, "graphpass.precision", "fp16")
            stats["fp16_nodes"] += 1
            for k, t in enumerate(node.outputs):
                if id(t) not in half:
                    continue
                outside = [c for c in t.outputs if id(c) not in chosen_ids]
                if id(t) in graph_outs:  # keep the graph output's name and fp32 dtype
                    h = gs.Variable(names(t.name + "_fp16"), dtype=F16, shape=t.shape)
                    node.outputs[k] = h
                    for c in list(t.outputs):
                        if id(c) in chosen_ids:
                            c.inputs[[x is t for x in c.inputs].index(True)] = h
                    back = gs.Node("Cast", name=names(t.name + "_to_fp32"), inputs=[h], outputs=[t], attrs={"to": onnx.TensorProto.FLOAT})
                    A.mark_created(back, self.name)
                    new_nodes.append(back)
                    half.add(id(h))
                    stats["casts"] += 1
                    continue
                t.dtype = F16
                if outside:
                    f = gs.Variable(names(t.name + "_fp32"), dtype=F32, shape=t.shape)
                    back = gs.Node("Cast", name=names(t.name + "_to_fp32"), inputs=[t], outputs=[f], attrs={"to": onnx.TensorProto.FLOAT})
                    A.mark_created(back, self.name)
                    new_nodes.append(back)
                    stats["casts"] += 1
                    for c in outside:
                        for j, x in enumerate(c.inputs):
                            if x is t:
                                c.inputs[j] = f
        graph.nodes.extend(new_nodes)
        return PassResult(True, stats)

    def _emulate(self, graph: gs.Graph, chosen: list[gs.Node], stats: dict) -> PassResult:
        """fp32 graph that rounds every value an fp16 node reads or writes to fp16 (a
        Cast-to-fp16-and-back pair), for checking fp16 numerics on a CPU whose fp16 kernels
        compute in fp32 inside chains of fp16 ops (onnxruntime's CPU provider does)."""
        names = NameGen(graph)
        rounded: dict[int, gs.Tensor] = {}
        new_nodes: list[gs.Node] = []
        chosen_ids = {id(n) for n in chosen}

        def round_pair(t: gs.Tensor) -> gs.Tensor:
            if id(t) not in rounded:
                h = gs.Variable(names(t.name + "_fp16"), dtype=F16, shape=t.shape)
                r = gs.Variable(names(t.name + "_rounded"), dtype=F32, shape=t.shape)
                new_nodes.append(gs.Node("Cast", name=names(t.name + "_round16"), inputs=[t], outputs=[h], attrs={"to": onnx.TensorProto.FLOAT16}))
                new_nodes.append(gs.Node("Cast", name=names(t.name + "_back32"), inputs=[h], outputs=[r], attrs={"to": onnx.TensorProto.FLOAT}))
                rounded[id(t)] = r
                stats["casts"] += 2
            return rounded[id(t)]

        for node in chosen:
            for i, t in enumerate(node.inputs):
                if not t.name or not _is_f32(t):
                    continue
                if isinstance(t, gs.Constant):
                    node.inputs[i] = gs.Constant(names(t.name + "_fp16vals"), np.asarray(t.values).astype(np.float16).astype(np.float32))
                    stats["constants_converted"] += 1
                elif not (len(t.inputs) == 1 and id(t.inputs[0]) in chosen_ids):
                    node.inputs[i] = round_pair(t)
            stats["fp16_nodes"] += 1
        graph_outs = {id(t) for t in graph.outputs}
        for node in chosen:
            for k, t in enumerate(node.outputs):
                if not _is_f32(t):
                    continue
                readers = list(t.outputs)
                if id(t) in graph_outs:
                    inner = gs.Variable(names(t.name + "_raw"), dtype=F32, shape=t.shape)
                    node.outputs[k] = inner
                    h = gs.Variable(names(t.name + "_fp16"), dtype=F16, shape=t.shape)
                    new_nodes.append(gs.Node("Cast", name=names(t.name + "_round16"), inputs=[inner], outputs=[h], attrs={"to": onnx.TensorProto.FLOAT16}))
                    new_nodes.append(gs.Node("Cast", name=names(t.name + "_back32"), inputs=[h], outputs=[t], attrs={"to": onnx.TensorProto.FLOAT}))
                    for c in readers:
                        for j, x in enumerate(c.inputs):
                            if x is t:
                                c.inputs[j] = t  # readers keep the rounded graph output
                    continue
                r = round_pair(t)
                for c in readers:
                    for j, x in enumerate(c.inputs):
                        if x is t:
                            c.inputs[j] = r
        graph.nodes.extend(new_nodes)
        stats["emulated"] = 1
        return PassResult(True, stats)

    @staticmethod
    def _fp16_only(graph: gs.Graph) -> str:
        from graphpass.cost_model import load_op_table

        table = load_op_table()
        ops = sorted({n.op for n in graph.nodes if (info := table.lookup(n.op, n.domain)) is not None and info.fp16_only})
        return ", ".join(ops)
