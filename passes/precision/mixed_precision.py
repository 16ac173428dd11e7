"""Mixed precision as Ascend's precision modes define it, with Casts only at the boundaries.

    mode force_fp16             every float compute op runs in fp16
    mode allow_fp32_to_fp16     Cube ops (Conv, ConvTranspose, MatMul, Gemm) in fp16, the rest fp32
    mode allow_mix_precision    white list fp16, black list fp32, gray ops follow their inputs
    mode must_keep_origin_dtype nothing changes
    mode allow_mix_precision_bf16, allow_fp32_to_bf16
                                as allow_mix_precision / allow_fp32_to_fp16 with bfloat16 instead of
                                float16: only on targets whose kernels take bf16 (910B; data/
                                precision_modes.toml ``targets``), refused elsewhere (exit 2)

(ATC-PM and MS-AMP, ascend_facts.md §7.) Nodes named in ``keep_fp32`` stay fp32 whatever the
mode (an unnamed node by its first output's name; ``--keep-fp32 auto`` takes the precision analysis' recommendations). Constants an fp16
node reads are converted at compile time; a runtime fp32 tensor entering an fp16 region gets
one Cast to fp16, and an fp16 tensor leaving it (to an fp32 node or a graph output) one Cast
back, shared by all readers. Graph inputs and outputs keep their dtypes. Only the inputs that
share the op's data type by its ONNX schema (type parameter ``T``) become fp16: Resize's roi and
scales, shape, size and index inputs and LayerNormalization's Mean/InvStdDev keep theirs. If,
Loop and Scan bodies are converted like the main graph, their own inputs and outputs kept.
The report lists the ops of the graph that are fp16-only on the target (its op-info table;
none under target ``none``).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.cost_model.target import Target
from graphpass.errors import UsageError
from graphpass.passes.framework.pass_base import Promise
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.ir import annotations as A
from graphpass.ir.graph import NameGen, iter_graphs
from graphpass.ir.op_facts import FLOAT_OPS, schema_data_slots  # re-exported

__all__ = ["MixedPrecision", "MODES", "WHITE", "BLACK", "CUBE", "FLOAT_OPS", "data_slots", "schema_data_slots"]

#: the precision modes this pass implements (data/precision_modes.toml; a target's
#: ``precision_mode_names(mixed_precision=True)``)
MODES = Target.none().precision_mode_names(mixed_precision=True)
CUBE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: fp16 in allow_mix_precision (MS-AMP white list: Conv, Dense/MatMul, BatchMatMul, PReLU, ReLU, RNN cells)
WHITE = CUBE | {"PRelu", "Relu", "LSTM", "GRU", "RNN"}
#: fp32 in allow_mix_precision: ops whose range or accuracy fp16 cannot hold (logs, exponentials,
#: reductions, normalizations, divisions)
BLACK = frozenset({"Log", "Exp", "Pow", "Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL2",
                   "ReduceLogSumExp", "ReduceSumSquare", "Sqrt", "Reciprocal", "Div", "Erf", "Softplus",
                   "LayerNormalization", "InstanceNormalization", "CumSum", "TopK"})
F32, F16 = np.dtype("float32"), np.dtype("float16")
#: the low-precision types a mode converts to: numpy dtype (graphsurgeon's), ONNX type, name suffix
_LOW = {"float16": (F16, onnx.TensorProto.FLOAT16, "fp16"),
        "bfloat16": (onnx.TensorProto.BFLOAT16, onnx.TensorProto.BFLOAT16, "bf16")}


def _mode_info(mode: str):
    return next(m for m in Target.none().precision_modes if m.name == mode)


def _is_f32(t: gs.Tensor) -> bool:
    try:
        return t.dtype is not None and np.dtype(t.dtype) == F32
    except TypeError:
        return False


def _half(values, low: str = "float16") -> np.ndarray:
    """fp16 values (beyond 65504: inf, as the device has them; the precision analysis reports it),
    or bfloat16 values (``low="bfloat16"``)."""
    if low == "bfloat16":
        import ml_dtypes

        return np.asarray(values).astype(ml_dtypes.bfloat16)
    with np.errstate(over="ignore"):
        return np.asarray(values).astype(np.float16)


def _onnx_opset(graph: gs.Graph) -> int:
    imports = getattr(graph, "import_domains", None) or []
    for imp in imports:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return int(graph.opset or onnx.defs.onnx_opset_version())


def _key(node: gs.Node) -> str:
    """How ``keep_fp32`` names a node: its name, or its first output's for an unnamed node."""
    return node.name or (node.outputs[0].name if node.outputs else "")


def data_slots(node: gs.Node, opset: int) -> tuple[set[int], set[int]] | None:
    return schema_data_slots(node.op, len(node.inputs), len(node.outputs), opset)


@register
class MixedPrecision(Pass):
    """Converts compute to fp16 by an Ascend precision mode.

    Cases:
      1. the four modes above; gray ops in allow_mix_precision take fp16 only when every float
         input comes from fp16 (or is a constant);
      2. ``keep_fp32`` node names always stay fp32;
      3. constants convert at compile time; runtime tensors cross fp32/fp16 through shared Casts;
      4. subgraphs (If branches, Loop/Scan bodies) are converted like the main graph;
      5. only the data inputs/outputs (schema type parameter shared with the output) change dtype.
    Options: ``mode`` (default force_fp16), ``keep_fp32`` (a list of node names), ``emulate``
    (keep fp32 dtypes and round every fp16 value instead: for checking fp16 numerics on a CPU).
    """

    name = "mixed_precision"
    summary = "Convert compute to fp16 by Ascend precision mode (white/black/gray lists, keep-fp32)."
    kind = PassKind.PRECISION
    promise = Promise.opt_in("fp16", rtol=1e-2, atol=1e-3, reason="the chosen tensors are computed in float16, as the user asked: values beyond 65504 overflow, cancellation amplifies fp16 rounding; graphpass precision judges it")
    default_enabled = False
    # it changes device cost (fp16 compute, boundary Casts) and its applications are estimated like
    # any precision pass's, but it is a precision the user asked for (default off: --mixed-precision
    # or --enable switch it on), never a speed rewrite to veto: required, the veto never rolls it back
    scored = True
    required = True
    preserves_order = False

    def __init__(self, *, mode: str = "force_fp16", keep_fp32: Iterable[str] = (), emulate: bool = False):
        """Args:
            mode: the Ascend precision mode (one of ``MODES``, from cost_model/data/precision_modes.toml).
            keep_fp32: node names (or first outputs of unnamed nodes) kept in float32.
            emulate: keep fp32 dtypes and round every fp16 value instead.
        """
        if mode not in MODES:
            raise UsageError(f"mixed_precision: unknown mode '{mode}'; known: {', '.join(MODES)}")
        if isinstance(keep_fp32, str):
            raise TypeError("mixed_precision: keep_fp32 is a list of node names, not one string")
        self.mode = mode
        self.keep_fp32 = tuple(keep_fp32)
        self.emulate = bool(emulate)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        mode = self.mode
        info = _mode_info(mode)
        target = ctx.target
        if info.targets and getattr(target, "has_hardware", False) and target.name not in info.targets:
            raise UsageError(f"mixed_precision: mode '{mode}' converts to {info.low}, which target '{target.name}' "
                             f"does not have (only {', '.join(info.targets)}); use a float16 mode there")
        self._low = info.low
        keep = set(self.keep_fp32)
        stats = {"fp16_nodes": 0, "casts": 0, "constants_converted": 0, "fp16_only_ops": self._fp16_only(graph, ctx.target)}
        if mode == "must_keep_origin_dtype":
            return PassResult(False, stats)
        opset = _onnx_opset(graph)
        names = NameGen(graph)
        modified = False
        for g in list(iter_graphs(graph)):  # case 4: every subgraph, its own inputs/outputs kept
            chosen, slots = self._choose(g, mode, keep, opset)
            if not chosen:
                continue
            modified = True
            if self.emulate:
                self._emulate(g, chosen, slots, stats, names)
            else:
                self._convert(g, chosen, slots, stats, names)
        if modified and self.emulate:
            stats["emulated"] = 1
        return PassResult(modified, stats)

    @staticmethod
    def _choose(g: gs.Graph, mode: str, keep: set, opset: int) -> tuple[list[gs.Node], dict[int, tuple[set, set]]]:
        half: set[int] = set()  # ids of tensors that are now fp16
        chosen: list[gs.Node] = []
        slots: dict[int, tuple[set, set]] = {}
        for node in g.nodes:
            if node.op not in FLOAT_OPS or node.domain not in (None, "", "ai.onnx") or _key(node) in keep:
                continue
            data = data_slots(node, opset)
            if data is None:
                continue
            ins, outs = data
            ins = {i for i in ins if i < len(node.inputs) and node.inputs[i].name}
            outs = {k for k in outs if k < len(node.outputs) and _is_f32(node.outputs[k])}
            # the op's data type must be float32 (or already fp16 here) on every data input
            data_in = [node.inputs[i] for i in ins]
            if not outs or not data_in or not all(_is_f32(t) or id(t) in half for t in data_in):
                continue
            if mode == "force_fp16":
                take = True
            elif mode in ("allow_fp32_to_fp16", "allow_fp32_to_bf16"):
                take = node.op in CUBE
            elif node.op in WHITE:
                take = True
            elif node.op in BLACK:
                take = False
            else:  # gray: follow the inputs
                runtime = [t for t in data_in if not isinstance(t, gs.Constant)]
                take = bool(runtime) and all(id(t) in half for t in runtime)
            if take:
                chosen.append(node)
                slots[id(node)] = (ins, outs)
                half.update(id(node.outputs[k]) for k in outs)
        return chosen, slots

    def _convert(self, graph: gs.Graph, chosen: list[gs.Node], slots: dict, stats: dict, names: NameGen) -> None:
        low = getattr(self, "_low", "float16")
        LOW, LOW_ELEM, SUFFIX = _LOW[low]
        chosen_ids = {id(n) for n in chosen}
        half = {id(n.outputs[k]) for n in chosen for k in slots[id(n)][1]}
        to16: dict[int, gs.Tensor] = {}
        consts: dict[int, gs.Constant] = {}
        new_nodes: list[gs.Node] = []

        def reads_fp16(c: gs.Node, j: int) -> bool:
            return id(c) in chosen_ids and j in slots[id(c)][0]

        # 1. data inputs of fp16 nodes (case 5: only the inputs that share the op's data type)
        for node in chosen:
            for i in sorted(slots[id(node)][0]):
                t = node.inputs[i]
                if not _is_f32(t) or id(t) in half:
                    continue
                if isinstance(t, gs.Constant):
                    if id(t) not in consts:
                        consts[id(t)] = gs.Constant(names(t.name + "_" + SUFFIX), _half(t.values, low))
                        stats["constants_converted"] += 1
                    node.inputs[i] = consts[id(t)]
                else:
                    if id(t) not in to16:
                        c = gs.Variable(names(t.name + "_" + SUFFIX), dtype=LOW, shape=t.shape)
                        cast = gs.Node("Cast", name=names(t.name + "_to_" + SUFFIX), inputs=[t], outputs=[c], attrs={"to": LOW_ELEM})
                        A.mark_created(cast, self.name)
                        new_nodes.append(cast)
                        to16[id(t)] = c
                        stats["casts"] += 1
                    node.inputs[i] = to16[id(t)]
        # 2. data outputs become fp16; readers outside the region (other nodes, other slots,
        #    subgraphs) and graph outputs get a Cast back
        graph_outs = {id(t) for t in graph.outputs}
        for node in chosen:
            A.set(node, "graphpass.precision", SUFFIX)
            stats["fp16_nodes"] += 1
            for k in sorted(slots[id(node)][1]):
                t = node.outputs[k]
                readers = list({id(c): c for c in t.outputs}.values())
                if id(t) in graph_outs:  # keep the graph output's name and fp32 dtype
                    h = gs.Variable(names(t.name + "_" + SUFFIX), dtype=LOW, shape=t.shape)
                    node.outputs[k] = h
                    for c in readers:
                        for j, x in enumerate(c.inputs):
                            if x is t and reads_fp16(c, j):
                                c.inputs[j] = h
                    back = gs.Node("Cast", name=names(t.name + "_to_fp32"), inputs=[h], outputs=[t], attrs={"to": onnx.TensorProto.FLOAT})
                    A.mark_created(back, self.name)
                    new_nodes.append(back)
                    stats["casts"] += 1
                    continue
                t.dtype = LOW
                f = None
                for c in readers:
                    for j, x in enumerate(c.inputs):
                        if x is t and not reads_fp16(c, j):
                            if f is None:
                                f = gs.Variable(names(t.name + "_fp32"), dtype=F32, shape=t.shape)
                                back = gs.Node("Cast", name=names(t.name + "_to_fp32"), inputs=[t], outputs=[f],
                                               attrs={"to": onnx.TensorProto.FLOAT})
                                A.mark_created(back, self.name)
                                new_nodes.append(back)
                                stats["casts"] += 1
                            c.inputs[j] = f
        graph.nodes.extend(new_nodes)

    def _emulate(self, graph: gs.Graph, chosen: list[gs.Node], slots: dict, stats: dict, names: NameGen) -> None:
        """fp32 graph that rounds every value an fp16 node reads or writes to fp16 (a
        Cast-to-fp16-and-back pair), for checking fp16 numerics on a CPU whose fp16 kernels
        compute in fp32 inside chains of fp16 ops (onnxruntime's CPU provider does)."""
        low = getattr(self, "_low", "float16")
        LOW, LOW_ELEM, SUFFIX = _LOW[low]
        rounded: dict[int, gs.Tensor] = {}
        new_nodes: list[gs.Node] = []
        chosen_ids = {id(n) for n in chosen}

        def round_pair(t: gs.Tensor) -> gs.Tensor:
            if id(t) not in rounded:
                h = gs.Variable(names(t.name + "_" + SUFFIX), dtype=LOW, shape=t.shape)
                r = gs.Variable(names(t.name + "_rounded"), dtype=F32, shape=t.shape)
                new_nodes.append(gs.Node("Cast", name=names(t.name + "_round_" + SUFFIX), inputs=[t], outputs=[h], attrs={"to": LOW_ELEM}))
                new_nodes.append(gs.Node("Cast", name=names(t.name + "_back32"), inputs=[h], outputs=[r], attrs={"to": onnx.TensorProto.FLOAT}))
                rounded[id(t)] = r
                stats["casts"] += 2
            return rounded[id(t)]

        produced_rounded = {id(n.outputs[k]) for n in chosen for k in slots[id(n)][1]}
        for node in chosen:
            for i in sorted(slots[id(node)][0]):
                t = node.inputs[i]
                if not _is_f32(t):
                    continue
                if isinstance(t, gs.Constant):
                    node.inputs[i] = gs.Constant(names(t.name + "_" + SUFFIX + "vals"), _half(t.values, low).astype(np.float32))
                    stats["constants_converted"] += 1
                elif id(t) not in produced_rounded:
                    node.inputs[i] = round_pair(t)
            A.set(node, "graphpass.precision", SUFFIX)
            stats["fp16_nodes"] += 1
        graph_outs = {id(t) for t in graph.outputs}
        for node in chosen:
            for k in sorted(slots[id(node)][1]):
                t = node.outputs[k]
                readers = list({id(c): c for c in t.outputs}.values())
                if id(t) in graph_outs:  # the graph output keeps its name; readers read the rounded value
                    inner = gs.Variable(names(t.name + "_raw"), dtype=F32, shape=t.shape)
                    node.outputs[k] = inner
                    h = gs.Variable(names(t.name + "_" + SUFFIX), dtype=LOW, shape=t.shape)
                    new_nodes.append(gs.Node("Cast", name=names(t.name + "_round_" + SUFFIX), inputs=[inner], outputs=[h], attrs={"to": LOW_ELEM}))
                    new_nodes.append(gs.Node("Cast", name=names(t.name + "_back32"), inputs=[h], outputs=[t], attrs={"to": onnx.TensorProto.FLOAT}))
                    continue
                r = round_pair(t)
                for c in readers:
                    for j, x in enumerate(c.inputs):
                        if x is t:
                            c.inputs[j] = r
        graph.nodes.extend(new_nodes)

    @staticmethod
    def _fp16_only(graph: gs.Graph, target: Target) -> str:
        """The graph's ops whose AI Core kernel is fp16-only on ``target`` ('' without hardware facts)."""
        table = target.op_table
        if table is None:
            return ""
        ops = sorted({n.op for n in graph.nodes if (info := table.lookup(n.op, n.domain)) is not None and info.fp16_only})
        return ", ".join(ops)


def convert_model(model: onnx.ModelProto, mode: str, keep_fp32: list[str]) -> onnx.ModelProto:
    """``model`` as this pass converts it in ``mode`` with fp16 emulated (fp32 dtypes, every fp16
    value rounded; converted nodes marked ``graphpass.precision = fp16``): the conversion
    ``graphpass.precision`` checks its findings on (``graphpass.api`` registers it there)."""
    from graphpass.ir import load, to_proto

    graph = load(model)
    MixedPrecision.as_function()(graph, mode=mode, keep_fp32=list(keep_fp32), emulate=True)
    return to_proto(graph, emit="device")
