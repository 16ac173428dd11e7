"""fp16 hazard analysis: what overflows, flushes, loses precision or is absorbed in fp16, and what to keep in fp32.

onnxruntime runs the model in fp32 with every float32 tensor exposed, in the main graph and in
every subgraph (If branches, Loop and Scan bodies: a Loop's or Scan's values are stacked over its
iterations, or concatenated where their shapes vary; an If before opset 11 on the model converted
to opset 11). Judged:

  1. activations: every float32 node output. Per tensor: max |x|, how many finite values overflow
     fp16 (round to inf), the share of nonzero values below fp16's smallest normal (6.1e-5,
     precision loss) and the share that rounds to zero (below ~3e-8, half the smallest subnormal);
  2. constants: every float32 initializer and Constant, in every graph, that an fp16 op would read
     (a data input by the op's schema): the same three checks on its values (a multiplier of 1e5
     becomes inf);
  3. absorption: Add/Sub whose smaller operand vanishes in fp16 (|y| < ulp(x)/2: 1 + 2e-4 is
     exactly 1, so log(1 + x) is 0), judged on the values seen;
  4. inputs: the graph's float32 inputs and every subgraph's (cast to fp16 where an fp16 op reads them).

A tensor is risky when anything overflows, more than ``underflow_share`` of its nonzero values
flush to zero, or most of them are subnormal. The keep-list covers the whole chain that must stay
fp32: the op that produces a risky value and every op that reads it (a risky value's readers would
round it again), the Add/Sub that absorbs and its readers, the readers of a risky constant.

Each finding is then checked (``check=True``) by running the model as mixed_precision converts it
(``mode``, default force_fp16) with every fp16 value rounded to fp16 (the pass's emulation, since
onnxruntime's CPU provider computes fp16 chains in fp32): ``confirmed`` says whether the hazard
shows there (None: the run cannot tell), ``fixed`` whether it is gone with the keep-list applied.
With the check, the keep-list holds the chains of the findings not refuted by emulation (an
absorbed epsilon that changes nothing is left out) and is re-checked, growing, until no finding
shows: a hazard hidden behind another (an underflow behind an overflow's inf) shows once the
first is fixed.

Judged: float32 tensors only. Not converted by mixed_precision, model-local function bodies keep
fp32; their calls' outputs are judged like any node's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphpass.check as _check_layer
from graphpass.check import verify as V
from graphpass.reporting import Report, markdown_table, rich_table, text_console

if TYPE_CHECKING:
    from graphpass.ir.model import ModelLike

__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "FP16_FLUSH", "TensorRange", "Finding", "PrecisionReport", "analyze"]

log = logging.getLogger(__name__)

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14  # 6.1e-5
FP16_FLUSH = 2.0 ** -25  # at or below half the smallest subnormal (2^-24) a value rounds to 0
FP16_EPS = 2.0 ** -11  # fp16's unit roundoff
ABSORBING_OPS = ("Add", "Sub")
_F16 = np.float16


@dataclasses.dataclass
class TensorRange:
    name: str
    producer: str
    op: str
    max_abs: float
    overflow: int
    subnormal_share: float
    flush_share: float
    risky: bool
    advice: str = ""
    kind: str = "activation"  # or "constant", "input" (a graph's or a subgraph's input)
    graph: str = "main"  # the graph the tensor lives in: main, or node/attribute for a subgraph
    elements: int = 0

    @staticmethod
    def role_prefix(role: str) -> str:
        return f"[{role}] " if role else ""


@dataclasses.dataclass
class Finding:
    """One fp16 hazard, with the nodes to keep in fp32 and what the emulated fp16 run showed."""

    hazard: str  # overflow | underflow | precision | absorption
    kind: str  # activation | constant | input | absorption
    tensor: str
    node: str
    op: str
    graph: str
    detail: str
    keep_fp32: list[str]
    confirmed: bool | None = None  # None: not checked, or the emulated run cannot tell
    evidence: str = ""
    fixed: bool | None = None  # with the whole keep-list applied
    fixed_evidence: str = ""
    #: what the tensor feeds where fp16 hurts most: "softmax input" (attention scores: inf logits
    #: make the softmax NaN), "normalization input" (a LayerNorm/RMSNorm reads it) or
    #: "normalization sum of squares" (x*x / x**2 before the mean: overflows from |x| > 256); "" else
    role: str = ""


@dataclasses.dataclass
class PrecisionReport(Report):
    SCHEMA = "graphpass.precision_report/2"

    tensors: list[TensorRange]
    keep_fp32: list[str]
    loss_scale: float | None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    graphs: int = 1
    not_run: int = 0  # tensors with no value on these inputs (a branch not taken, a zero-trip loop)
    unobserved: list[str] = dataclasses.field(default_factory=list)  # subgraph tensors of unknown type
    checked: bool = False
    mode: str = "force_fp16"

    @property
    def risky(self) -> list[TensorRange]:
        return [t for t in self.tensors if t.risky]

    @property
    def activations(self) -> list[TensorRange]:
        return [t for t in self.tensors if t.kind == "activation"]

    @property
    def inputs(self) -> list[TensorRange]:
        return [t for t in self.tensors if t.kind == "input"]

    @property
    def constants(self) -> list[TensorRange]:
        return [t for t in self.tensors if t.kind == "constant"]

    def to_dict(self) -> dict:
        return {"schema": self.SCHEMA, "keep_fp32": self.keep_fp32, "loss_scale": self.loss_scale,
                "risky": [dataclasses.asdict(t) for t in self.risky], "tensors": len(self.tensors),
                "activations": len(self.activations), "inputs": len(self.inputs), "constants": len(self.constants), "graphs": self.graphs,
                "not_run": self.not_run, "unobserved": self.unobserved, "checked": self.checked, "mode": self.mode,
                "findings": [dataclasses.asdict(f) for f in self.findings]}

    def _title(self) -> str:
        return (f"fp16 risk: {len(self.risky)} of {len(self.tensors)} float32 tensors ({len(self.activations)} "
                f"activations, {len(self.inputs)} inputs, {len(self.constants)} constants, {self.graphs} graphs)")

    _COLUMNS = ("tensor", "graph", "producer", ("max |x|", "right"), ("> 65504", "right"), ("< 6.1e-5", "right"),
                ("flushed", "right"), "what to do")

    def _rows(self, top: int) -> list[tuple[str, ...]]:
        rows = sorted(self.tensors, key=lambda r: (not r.risky, -r.overflow, -r.flush_share))[:top]
        return [(r.name, r.graph, f"{r.op} {r.producer}", f"{r.max_abs:.3g}", str(r.overflow),
                 f"{100 * r.subnormal_share:.0f}%", f"{100 * r.flush_share:.0f}%", r.advice) for r in rows]

    def _lines(self, top: int) -> list[str]:
        lines = []
        if not self.tensors:
            lines.append("no float32 tensors: nothing to judge (the analysis is for float32 models)")
        if self.not_run:
            lines.append(f"{self.not_run} tensors have no values on these inputs (a branch not taken, a loop that ran "
                         "zero times)")
        if self.unobserved:
            lines.append(f"not observed (type unknown): {', '.join(self.unobserved[:10])}"
                         + (" ..." if len(self.unobserved) > 10 else ""))
        for f in self.findings[:top]:
            if f.confirmed is None:
                check = "not checked"
            else:
                said = {True: "confirmed", False: "not confirmed", None: "cannot tell"}[f.confirmed]
                fixed = {True: "fixed", False: "NOT fixed", None: "cannot tell"}[f.fixed]
                check = f"emulated {self.mode}: {said} ({f.evidence}); keep-list applied: {fixed} ({f.fixed_evidence})"
            where = "" if f.graph == "main" else f" in {f.graph}"
            role = f" <{f.role}>" if f.role else ""
            lines.append(f"{f.hazard} [{f.kind}]{role} {f.tensor} ({f.op} {f.node}{where}): {check}")
        if len(self.findings) > top:
            lines.append(f"... and {len(self.findings) - top} more findings (--top N, or --format json for all)")
        lines.append("keep in fp32 (mixed_precision --keep-fp32 auto): " + (", ".join(self.keep_fp32) or "nothing")
                     + (" (findings emulation did not confirm are left out)" if self.checked else ""))
        if self.loss_scale:
            lines.append(f"for training: a loss scale of {self.loss_scale:g} lifts the small values into fp16's normal range")
        return lines

    def to_table(self, top: int = 15, width: int = 160) -> str:
        console, buf = text_console(width)
        console.print(rich_table(self._COLUMNS, self._rows(top), title=self._title()))
        for line in self._lines(top):
            console.print(line)
        return buf.getvalue()

    def to_markdown(self, top: int = 15) -> str:
        lines = [f"### graphpass precision: {self._title()}", ""]
        lines += markdown_table(self._COLUMNS, self._rows(top)) + [""]
        lines += [f"- {x}" for x in self._lines(top)]
        lines.append("")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------- model walk

def _key(node: onnx.NodeProto) -> str:
    """A node's name for the keep-list: its name, or its first output's (as mixed_precision reads it)."""
    return node.name or (node.output[0] if node.output else "")


def _subgraphs(node: onnx.NodeProto):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.name, a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(a.graphs):
                yield f"{a.name}[{i}]", g


@dataclasses.dataclass
class _Info:
    """Where every node and tensor of the model is, across all its graphs."""

    nodes: dict[str, tuple[onnx.NodeProto, str]] = dataclasses.field(default_factory=dict)  # key -> (node, graph)
    producer: dict[str, str] = dataclasses.field(default_factory=dict)  # tensor -> node key
    readers: dict[str, list[tuple[str, int]]] = dataclasses.field(default_factory=dict)  # tensor -> (node key, slot)
    continues: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # subgraph output -> parent output(s)
    constants: dict[str, tuple[np.ndarray, str, str]] = dataclasses.field(default_factory=dict)  # name -> (values, graph, node key)
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)  # graph input (not a weight) -> graph
    graphs: int = 0


def _walk(model: onnx.ModelProto) -> _Info:
    info = _Info()

    def visit(g: onnx.GraphProto, path: str) -> None:
        info.graphs += 1
        for t in g.initializer:
            if t.data_type == TensorProto.FLOAT:
                info.constants[t.name] = (numpy_helper.to_array(t), path, "")
        weights = {t.name for t in g.initializer}
        for i in g.input:
            if i.name not in weights:
                info.inputs[i.name] = path
        for node in g.node:
            k = _key(node)
            info.nodes[k] = (node, path)
            for o in node.output:
                if o:
                    info.producer[o] = k
            for i, name in enumerate(node.input):
                if name:
                    info.readers.setdefault(name, []).append((k, i))
            if node.op_type == "Constant" and node.output:
                value = _constant_value(node)
                if value is not None and value.dtype == np.float32:
                    info.constants[node.output[0]] = (value, path, k)
            for attr, sub in _subgraphs(node):
                visit(sub, f"{k}/{attr}" if path == "main" else f"{path}/{k}/{attr}")
                outs = [o.name for o in sub.output]
                if node.op_type == "If":
                    pairs = list(zip(outs, node.output))
                elif node.op_type == "Loop":  # body: cond, carried..., scans...; node: carried..., scans...
                    pairs = list(zip(outs[1:], node.output))
                else:  # Scan: body outputs and node outputs line up
                    pairs = list(zip(outs, node.output))
                for inner, outer in pairs:
                    if outer:
                        info.continues.setdefault(inner, []).append(outer)
                # a subgraph reads outer tensors by name: its nodes appear as readers of them (visit did it)

    visit(model.graph, "main")
    return info


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
    return None


def _readers(info: _Info, tensor: str) -> list[str]:
    """Nodes that read ``tensor``, following a subgraph output out to the readers of its parent's output."""
    out: dict[str, None] = {}
    stack, seen = [tensor], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for k, _ in info.readers.get(t, []):
            out.setdefault(k, None)
        stack.extend(info.continues.get(t, []))
    return list(out)


#: readers that make a tensor a softmax input / a normalization input (standard ops and graphpass's
#: device ops by name)
SOFTMAX_OPS = ("Softmax", "LogSoftmax")
NORM_OPS = ("LayerNormalization", "LayerNorm", "RmsNorm", "AddRmsNorm", "RMSNormalization", "GroupNormalization",
            "InstanceNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


#: graphpass's attention device ops: Q (input 0), K (1) and the mask (3) make the scores their softmax reads
ATTENTION_OPS = ("Attention", "AttentionBSH")


def _role(info: _Info, tensor: str) -> str:
    """What ``tensor`` feeds where fp16 overflow hurts most (see :attr:`Finding.role`)."""
    ops = {info.nodes[k][0].op_type for k in _readers(info, tensor)}
    if ops & set(SOFTMAX_OPS):
        return "softmax input"
    for k in _readers(info, tensor):
        node = info.nodes[k][0]
        if node.op_type in ATTENTION_OPS and any(i == tensor for j, i in enumerate(node.input) if j in (0, 1, 3)):
            return "attention scores input"
    if ops & set(NORM_OPS):
        return "normalization input"
    k = info.producer.get(tensor)
    node = info.nodes[k][0] if k else None
    squares = node is not None and (node.op_type == "Pow" or (node.op_type == "Mul" and len(node.input) == 2
                                                               and node.input[0] == node.input[1]))
    if squares and "ReduceMean" in ops:
        return "normalization sum of squares"
    for r in _readers(info, tensor):  # x feeding x*x / x**2 feeding a mean: an (RMS/Layer)Norm's input
        rn = info.nodes[r][0]
        if (rn.op_type == "Pow" and rn.input[0] == tensor) or (rn.op_type == "Mul" and list(rn.input) == [tensor, tensor]):
            if any(info.nodes[q][0].op_type == "ReduceMean" for o in rn.output for q in _readers(info, o)):
                return "normalization input"
    return ""


_ROLE_ADVICE = {
    "softmax input": "it is a Softmax input: inf logits in fp16 make the softmax NaN",
    "attention scores input": "it makes a fused attention's scores (Q·K^T + mask): inf scores in fp16 make its softmax NaN",
    "normalization input": "it is a normalization input: its square overflows fp16 first",
    "normalization sum of squares": "it is a normalization's sum of squares (x*x overflows fp16 from |x| > 256)",
}


# ----------------------------------------------------------------------------------------- exposure

def _expose(model: onnx.ModelProto, subgraphs: bool = True,
            loop_concat: bool = False) -> tuple[onnx.ModelProto, dict[str, str], list[str]]:
    """A copy whose outputs include every float32 tensor of every graph.

    Returns the copy, {output name: tensor name} and the subgraph tensors left out (type unknown).
    A subgraph tensor leaves its If through an extra output of both branches (the other branch
    gives an empty tensor), its Loop or Scan through an extra scan output (stacked per iteration)
    or, with ``loop_concat`` (for per-iteration shapes that vary), an extra carried value that
    concatenates the flattened values of every iteration.
    """
    try:
        m = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
        m = onnx.ModelProto()
        m.CopyFrom(model)
    types: dict[str, int] = {}
    used: set[str] = set()

    def collect(g: onnx.GraphProto) -> None:
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            used.add(vi.name)
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            used.add(t.name)
            types[t.name] = t.data_type
        for n in g.node:
            used.update(n.output)
            for _, sub in _subgraphs(n):
                collect(sub)

    collect(m.graph)
    opset = _opset(model)

    def deduce(g: onnx.GraphProto) -> None:
        """Types shape inference left out (opset-9 Dropout's mask): from the schema, the type of an
        input bound to the same type parameter, or the output's fixed type."""
        for n in g.node:
            for _, sub in _subgraphs(n):
                deduce(sub)
            missing = [k for k, o in enumerate(n.output) if o and o not in types]
            if not missing or n.domain not in ("", "ai.onnx"):
                continue
            try:
                schema = onnx.defs.get_schema(n.op_type, opset, "")
            except onnx.defs.SchemaError:
                continue
            for k in missing:
                if k >= len(schema.outputs) and not (schema.outputs and schema.outputs[-1].option
                                                     == onnx.defs.OpSchema.FormalParameterOption.Variadic):
                    continue
                ts = schema.outputs[min(k, len(schema.outputs) - 1)].type_str
                if ts == "tensor(float)":
                    types[n.output[k]] = TensorProto.FLOAT
                    continue
                for j, i in enumerate(n.input):
                    f = schema.inputs[min(j, len(schema.inputs) - 1)] if schema.inputs else None
                    if f is not None and f.type_str == ts and i in types:
                        types[n.output[k]] = types[i]
                        break

    deduce(m.graph)
    counter = [0]

    def fresh(prefix: str) -> str:
        while True:
            counter[0] += 1
            name = f"{prefix}__gp_probe{counter[0]}"
            if name not in used:
                used.add(name)
                return name

    unobserved: list[str] = []

    def items_of(g: onnx.GraphProto, top: bool) -> list[tuple[str, str]]:
        items: list[tuple[str, str]] = []
        if not top:
            items.extend((i.name, i.name) for i in g.input if types.get(i.name) == TensorProto.FLOAT)
        for node in list(g.node):
            if node.op_type != "Constant":
                for o in node.output:
                    t = types.get(o)
                    if o and (t == TensorProto.FLOAT or (top and t is None)):
                        items.append((o, o))
                    elif o and t is None:
                        unobserved.append(o)
            if not subgraphs or node.op_type not in ("If", "Loop", "Scan"):
                continue
            subs = dict(_subgraphs(node))
            if node.op_type == "If":
                tb, eb = subs.get("then_branch"), subs.get("else_branch")
                if tb is None or eb is None:
                    continue
                for here, other in ((tb, eb), (eb, tb)):
                    for local, tensor in items_of(here, False):
                        p_here, p_other, outer = fresh(tensor), fresh("empty"), fresh(tensor)
                        here.node.append(helper.make_node("Identity", [local], [p_here]))
                        here.output.append(helper.make_tensor_value_info(p_here, TensorProto.FLOAT, None))
                        other.node.append(helper.make_node("Constant", [], [p_other],
                                                           value=numpy_helper.from_array(np.zeros(0, np.float32))))
                        other.output.append(helper.make_tensor_value_info(p_other, TensorProto.FLOAT, None))
                        node.output.append(outer)
                        items.append((outer, tensor))
            else:
                body = subs.get("body")
                if body is None:
                    continue
                inner = items_of(body, False)
                if not inner:
                    continue
                if loop_concat and not (node.op_type == "Scan" and opset < 9):
                    items.extend(_carry_out(g, node, body, inner, fresh))
                    continue
                for local, tensor in inner:
                    p, outer = fresh(tensor), fresh(tensor)
                    body.node.append(helper.make_node("Identity", [local], [p]))
                    body.output.append(helper.make_tensor_value_info(p, TensorProto.FLOAT, None))
                    node.output.append(outer)
                    items.append((outer, tensor))
                if node.op_type == "Scan":
                    for a in node.attribute:
                        if a.name in ("scan_output_axes", "scan_output_directions"):
                            a.ints.extend([0] * len(inner))
        return items

    probes: dict[str, str] = {}
    outputs = {o.name for o in m.graph.output}
    for local, tensor in items_of(m.graph, True):
        if local not in outputs:
            t = types.get(local)
            m.graph.output.append(helper.make_tensor_value_info(local, TensorProto.FLOAT, None) if t is not None
                                  else helper.make_empty_tensor_value_info(local))
            outputs.add(local)
        probes[local] = tensor
    return m, probes, unobserved


def _copy_vi(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    c = onnx.ValueInfoProto()
    c.CopyFrom(vi)
    return c


def _carry_out(g: onnx.GraphProto, node: onnx.NodeProto, body: onnx.GraphProto, inner: list[tuple[str, str]],
               fresh) -> list[tuple[str, str]]:
    """Expose ``inner`` body tensors of a Loop/Scan as extra carried values: empty at entry, each
    iteration appends its flattened values (any per-iteration shape; zero trips give empty)."""
    empty, flat_shape = fresh("empty"), fresh("flat_shape")
    g.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), empty))
    body.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), flat_shape))
    if node.op_type == "Loop":  # node: M, cond, carried...; body in: iter, cond, carried...; body out: cond, carried..., scans...
        n_state = len(node.input) - 2
        at_in, at_body_in, at_body_out, at_out = len(node.input), len(body.input), 1 + n_state, n_state
    else:  # Scan (opset 9+): the states come first everywhere
        n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
        n_state = len(node.input) - n_scan
        at_in, at_body_in, at_body_out, at_out = n_state, n_state, n_state, n_state
    new_in, new_body_in, new_body_out, new_out, items = [], [], [], [], []
    for local, tensor in inner:
        acc_in, flat, acc_out, outer = fresh("acc_in"), fresh("flat"), fresh(tensor), fresh(tensor)
        body.node.append(helper.make_node("Reshape", [local, flat_shape], [flat]))
        body.node.append(helper.make_node("Concat", [acc_in, flat], [acc_out], axis=0))
        new_in.append(empty)
        new_body_in.append(helper.make_tensor_value_info(acc_in, TensorProto.FLOAT, [None]))
        new_body_out.append(helper.make_tensor_value_info(acc_out, TensorProto.FLOAT, [None]))
        new_out.append(outer)
        items.append((outer, tensor))
    ins, outs = list(node.input), list(node.output)
    body_ins, body_outs = [_copy_vi(x) for x in body.input], [_copy_vi(x) for x in body.output]
    node.input[:] = ins[:at_in] + new_in + ins[at_in:]
    node.output[:] = outs[:at_out] + new_out + outs[at_out:]
    del body.input[:]
    body.input.extend(body_ins[:at_body_in] + new_body_in + body_ins[at_body_in:])
    del body.output[:]
    body.output.extend(body_outs[:at_body_out] + new_body_out + body_outs[at_body_out:])
    return items


def _run_quiet(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """V.run without onnxruntime's own error log (a failure here only means: try without subgraphs)."""
    import onnxruntime as ort

    sess = V.session(model)
    opts = ort.RunOptions()
    opts.log_severity_level = 4
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds), opts)))


def _observe(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             subgraphs: bool = True) -> tuple[dict[str, np.ndarray], list[str], bool]:
    """Every float32 tensor's value on ``feeds`` (subgraph ones too where onnxruntime allows);
    the tensors left out; whether subgraph tensors were observed."""
    attempts: list[tuple[onnx.ModelProto, bool]] = []
    if subgraphs and _has_subgraphs(model):
        attempts.append((model, False))
        if _has_loop(model):
            attempts.append((model, True))  # per-iteration shapes that vary: concatenate instead of stack
        if _opset(model) < 11 and _has_if(model):
            # If before opset 11 wants both branches' outputs of one shape: the probes of the branch
            # not taken (empty) cannot match, so try the model converted to opset 11
            try:
                from onnx import version_converter

                converted = version_converter.convert_version(model, 11)
                attempts.append((converted, False))
                if _has_loop(model):
                    attempts.append((converted, True))
            except Exception as e:  # noqa: BLE001 - the converter does not know every op
                log.info("precision: cannot convert to opset 11 (%s)", e)
    reason = ""
    for m, loop_concat in attempts:
        exposed, probes, unobserved = _expose(m, True, loop_concat)
        try:
            values = _run_quiet(exposed, feeds)
        except Exception as e:  # noqa: BLE001 - e.g. a Loop whose per-iteration shapes vary
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            continue
        return _by_tensor(values, probes), unobserved, True
    if reason:
        log.warning("precision: cannot expose subgraph tensors (%s); judging the main graph only", reason)
    exposed, probes, unobserved = _expose(model, False)
    values = V.run(V.session(exposed), feeds)
    if _has_subgraphs(model):
        unobserved = unobserved + ["(every subgraph tensor)"]
    return _by_tensor(values, probes), unobserved, False


def _by_tensor(values: Mapping[str, np.ndarray], probes: Mapping[str, str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, v in values.items():
        if not isinstance(v, np.ndarray):  # a sequence, map or optional output: no float32 tensor to judge
            continue
        if k in probes and (probes[k] not in out or out[probes[k]].size == 0):  # sibling branches may reuse a name
            out[probes[k]] = np.asarray(v)
    return out


def _has_loop(model: onnx.ModelProto) -> bool:
    from graphpass.ir.graph import graph_protos

    return any(n.op_type in ("Loop", "Scan") for g in graph_protos(model.graph) for n in g.node)


def _has_if(model: onnx.ModelProto) -> bool:
    from graphpass.ir.graph import graph_protos

    return any(n.op_type == "If" for g in graph_protos(model.graph) for n in g.node)


def _has_subgraphs(model: onnx.ModelProto) -> bool:
    return any(True for n in model.graph.node for _ in _subgraphs(n))


# ----------------------------------------------------------------------------------------- judging

def _to16(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, np.float32).astype(_F16)


def _range(name: str, producer: str, op: str, v: np.ndarray, underflow_share: float, kind: str = "activation",
           graph: str = "main") -> TensorRange:
    v = np.asarray(v, np.float32).ravel()
    finite = np.isfinite(v)
    a = np.abs(v[finite])
    h = _to16(v)
    overflow = int(np.count_nonzero(finite & np.isinf(h)))
    nz = a[a > 0]
    sub = float(np.mean(nz < FP16_MIN_NORMAL)) if nz.size else 0.0
    flush = float(np.count_nonzero(finite & (v != 0) & (h == 0)) / nz.size) if nz.size else 0.0
    risky = overflow > 0 or flush > underflow_share or sub > 0.5
    what = f"{op} '{producer}'" if kind == "activation" else f"the readers of {kind} '{name}'"
    tail = " and its readers" if kind == "activation" else ""
    advice = ""
    if overflow:
        advice = f"{overflow} values exceed fp16's 65504 (inf in fp16): keep {what}{tail} in fp32"
    elif flush > underflow_share:
        advice = f"{100 * flush:.0f}% of nonzero values flush to zero in fp16: keep {what}{tail} in fp32"
    elif sub > 0.5:
        advice = (f"{100 * sub:.0f}% of nonzero values are fp16 subnormals (precision lost): "
                  f"keep {what}{tail} in fp32")
    return TensorRange(name, producer, op, float(a.max()) if a.size else 0.0, overflow, sub, flush, risky, advice,
                       kind, graph, int(v.size))


def _hazard(r: TensorRange, underflow_share: float) -> str:
    return "overflow" if r.overflow else "underflow" if r.flush_share > underflow_share else "precision"


def _absorbed(x: np.ndarray, y: np.ndarray, subtract: bool) -> tuple[float, int]:
    """Of the elements of x ± y whose smaller operand is nonzero, the share (and count) where it
    vanishes: both operands and the sum rounded to fp16 give the larger operand."""
    try:
        a, b = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
    except ValueError:
        return 0.0, 0
    if subtract:
        b = -b
    big = np.where(np.abs(a) >= np.abs(b), a, b)
    small = np.where(np.abs(a) >= np.abs(b), b, a)
    with np.errstate(over="ignore", invalid="ignore"):
        total = (_to16(a).astype(np.float32) + _to16(b).astype(np.float32)).astype(_F16)
        big16 = _to16(big)
    considered = np.isfinite(big) & np.isfinite(small) & (small != 0) & np.isfinite(big16.astype(np.float32))
    n = int(np.count_nonzero(considered))
    if not n:
        return 0.0, 0
    lost = considered & (total == big16)
    return float(np.count_nonzero(lost) / n), int(np.count_nonzero(lost))


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return onnx.defs.onnx_opset_version()


def _fp16_readers(info: _Info, name: str, opset: int) -> list[str]:
    """Readers that would read ``name`` as fp16 data (an op mixed_precision converts, a data slot)."""
    from graphpass.ir.op_facts import FLOAT_OPS, schema_data_slots

    out = []
    for k, slot in info.readers.get(name, []):
        node = info.nodes[k][0]
        if node.op_type not in FLOAT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        slots = schema_data_slots(node.op_type, len(node.input), len(node.output), opset)
        if slots is not None and slot in slots[0]:
            out.append(k)
    return out


#: ``convert(model, mode, keep_fp32) -> ModelProto``: ``model`` as mixed precision converts it in
#: ``mode`` with fp16 emulated, each converted node marked ``graphpass.precision = fp16``.
Converter = Callable[[onnx.ModelProto, str, Sequence[str]], onnx.ModelProto]


def register_converter(convert: Converter) -> Converter:
    """Make ``convert`` the conversion :func:`analyze` checks its findings on by default.

    The analysis sits below the passes (it must not import them); ``graphpass.api``, above
    both, registers the mixed_precision pass's conversion (``import graphpass`` does, in
    ``graphpass.check.converter``, where this writes too: graphpass's import does not load
    this module)."""
    _check_layer.converter = convert
    return convert


def analyze(model: "ModelLike", feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0,
            input_shapes: Mapping[str, Sequence[int]] | None = None, underflow_share: float = 0.01,
            absorption_share: float = 0.5, check: bool = True, mode: str = "force_fp16",
            convert: Converter | None = None) -> PrecisionReport:
    """Run ``model`` in fp32 with every float32 tensor exposed and judge activations, constants and sums.

    ``model`` is a path, bytes, an ``onnx.ModelProto`` or a :class:`graphpass.Model` (coerced by
    :func:`graphpass.ir.model.as_proto`: validated as ``load`` validates); it is not changed.

    Args:
        underflow_share: risky when more than this share of a tensor's nonzero values flush to zero.
        absorption_share: an Add/Sub absorbs when more than this share of its elements (those whose
            smaller operand is nonzero) lose the smaller operand entirely in fp16.
        check: run the model as mixed_precision(``mode``) converts it, with fp16 emulated, without
            and with the keep-list, and record per finding whether the hazard shows and is fixed.
        convert: the conversion the check runs (:data:`Converter`); by default the registered one:
            the mixed_precision pass's (``import graphpass`` registers it).
    """
    from graphpass.ir.model import as_proto

    model = as_proto(model)
    if feeds is None:
        feeds = V.random_inputs(V.session(model), seed=seed, input_shapes=input_shapes)
    info = _walk(model)
    opset = _opset(model)
    values, unobserved, observed_subgraphs = _observe(model, feeds)
    for name, (value, _, _) in info.constants.items():
        values.setdefault(name, value)
    for name, value in feeds.items():
        values.setdefault(name, np.asarray(value))

    tensors: list[TensorRange] = []
    findings: list[Finding] = []
    keep: dict[str, None] = {}
    not_run = 0
    smallest, largest = math.inf, 0.0

    def add_finding(f: Finding) -> None:
        findings.append(f)
        for k in f.keep_fp32:
            keep.setdefault(k, None)

    # 1. activations: every float32 node output observed (Constant outputs are judged as constants)
    for name, v in values.items():
        if name in info.constants or name not in info.producer or v.dtype != np.float32:
            continue
        k = info.producer[name]
        node, graph = info.nodes[k]
        if v.size == 0:
            not_run += 1
        r = _range(name, k, node.op_type, v, underflow_share, "activation", graph)
        tensors.append(r)
        if r.risky:
            add_finding(Finding(_hazard(r, underflow_share), "activation", name, k, node.op_type, graph, r.advice,
                                [k] + _readers(info, name)))
        a = np.abs(v[np.isfinite(v)].astype(np.float64))
        nz = a[a > 0]
        if nz.size:
            smallest = min(smallest, float(np.percentile(nz, 1)))
            largest = max(largest, float(nz.max()))
    # 1b. graph inputs (main and subgraph): fp32 by contract, cast to fp16 where an fp16 op reads them
    for name, graph in info.inputs.items():
        v = values.get(name)
        if v is None or v.dtype != np.float32 or name in info.producer or name in info.constants:
            continue
        r = _range(name, "graph input", "input", v, underflow_share, "input", graph)
        readers = _fp16_readers(info, name, opset)
        if r.risky and not readers:
            r.risky, r.advice = False, "stays fp32: no fp16 op reads it as data"
        tensors.append(r)
        if r.risky:
            add_finding(Finding(_hazard(r, underflow_share), "input", name, name, "input", graph, r.advice, readers))
    # 2. constants: judged all; a hazard only where an fp16 op reads them as data
    for name, (value, graph, k) in info.constants.items():
        r = _range(name, k or "initializer", "Constant" if k else "initializer", value, underflow_share, "constant", graph)
        readers = _fp16_readers(info, name, opset)
        if r.risky and not readers:
            r.risky, r.advice = False, "stays fp32: no fp16 op reads it as data"
        tensors.append(r)
        if r.risky:
            add_finding(Finding(_hazard(r, underflow_share), "constant", name, k or name, r.op, graph, r.advice, readers))
    # 3. absorption: x + y whose smaller operand vanishes in fp16
    for k, (node, graph) in info.nodes.items():
        if node.op_type not in ABSORBING_OPS or len(node.input) != 2 or not node.output:
            continue
        x, y, out = values.get(node.input[0]), values.get(node.input[1]), values.get(node.output[0])
        if x is None or y is None or out is None or out.dtype != np.float32 or x.dtype != np.float32 or y.dtype != np.float32:
            continue
        share, count = _absorbed(x, y, node.op_type == "Sub")
        if share > absorption_share:
            detail = (f"{100 * share:.0f}% of its elements ({count}) lose the smaller operand in fp16 "
                      f"(|y| < ulp(x)/2, e.g. 1 + 2e-4 = 1): keep {node.op_type} '{k}' and its readers in fp32")
            add_finding(Finding("absorption", "absorption", node.output[0], k, node.op_type, graph, detail,
                                [k] + _readers(info, node.output[0])))

    for f in findings:  # softmax and normalization inputs named as such (issue 26)
        if f.hazard == "overflow" and f.kind in ("activation", "input"):
            f.role = _role(info, f.tensor)
            if f.role:
                f.detail = f"{f.detail}; {_ROLE_ADVICE[f.role]} (bfloat16, where the target has it, holds the range)"
                for t in tensors:
                    if t.name == f.tensor and t.graph == f.graph:
                        t.advice = f"{t.role_prefix(f.role)}{t.advice}"
    scale = None
    if any(t.flush_share > underflow_share for t in tensors if t.kind == "activation") and smallest < FP16_MIN_NORMAL:
        s = 2.0 ** math.ceil(math.log2(FP16_MIN_NORMAL / smallest))
        if largest * s < FP16_MAX:
            scale = s
    report = PrecisionReport(tensors, list(keep), scale, findings, info.graphs, not_run, unobserved, False, mode)
    if check and findings:
        convert = convert or _check_layer.converter
        if convert is None:
            from graphpass.errors import GraphpassError

            raise GraphpassError("precision.analyze(check=True) needs a conversion to check on: give convert=..., "
                                 "or import graphpass (which registers the mixed_precision pass's)")
        _check(model, report, info, feeds, values, underflow_share, absorption_share, observed_subgraphs, convert)
    return report


# ----------------------------------------------------------------------------------------- emulated check

def _emulated(model: onnx.ModelProto, mode: str, keep: Sequence[str],
              convert: Converter) -> tuple[onnx.ModelProto, set[str]]:
    """``model`` as ``convert`` makes it (mode, keep_fp32), fp16 emulated; and its fp16 node keys."""
    from graphpass.ir.graph import graph_protos

    named = onnx.ModelProto()
    named.CopyFrom(model)
    for g in graph_protos(named.graph):  # an unnamed node keeps its key (first output) through the rewrite
        for n in g.node:
            if not n.name and n.output:
                n.name = n.output[0]
    out = convert(named, mode, list(keep))
    half = {_key(n) for g in graph_protos(out.graph) for n in g.node
            if any(p.key == "graphpass.precision" and p.value == "fp16" for p in n.metadata_props)}
    return out, half


def _symptom(f: Finding, info: _Info, vals: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], half: set[str],
             underflow_share: float, absorption_share: float) -> tuple[bool | None, str]:
    """Whether finding ``f`` shows in an emulated run (``vals``; ``half``: its fp16 nodes), and how;
    None when the run cannot tell (the values it needs were not observed)."""
    def rounded(name: str) -> bool:  # stored in fp16 there: an fp16 node writes it or reads it
        return info.producer.get(name) in half or any(k in half for k in _readers(info, name))

    def seen(name: str) -> bool:
        got, want = vals.get(name), ref.get(name)
        return got is not None and want is not None and got.shape == want.shape and got.size > 0

    def hits(pred, names) -> list[str]:  # pred(value as stored in the emulated run, fp32 reference)
        return [n for n in names if seen(n) and pred(_to16(vals[n]) if rounded(n) else vals[n], ref[n])]

    def reader_outputs(name: str, only_half: bool = False) -> list[str]:
        return [o for k in _readers(info, name) if not only_half or k in half for o in info.nodes[k][0].output if o]

    if f.kind == "absorption":
        node = info.nodes[f.node][0]
        out = f.tensor
        if not seen(out):
            return None, f"{out} not observed"
        if not rounded(out):
            return False, f"{out} stays fp32"
        x, y = vals.get(node.input[0], ref.get(node.input[0])), vals.get(node.input[1], ref.get(node.input[1]))
        if x is None or y is None:
            return None, "operands not observed"
        share = _absorbed(x, y, node.op_type == "Sub")[0] if f.node in half else 0.0
        # the sum kept in fp32 but rounded by an fp16 reader loses the small operand all the same
        try:
            a, b = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
            big = np.where(np.abs(a) >= np.abs(b), a, b)
            small = np.where(np.abs(a) >= np.abs(b), b, a)
            lost = (small != 0) & np.isfinite(big) & (_to16(vals[out]) == _to16(big))
            share = max(share, float(np.count_nonzero(lost) / max(1, np.count_nonzero(small != 0))))
        except ValueError:
            pass
        if share <= absorption_share:
            return False, f"{100 * share:.0f}% absorbed"
        # absorbed, but does it matter? (eps in var + eps does not): the readers' outputs must change
        outs = reader_outputs(out)
        what = f"{100 * share:.0f}% of {out} equal the larger operand in fp16"
        if outs and not any(seen(o) for o in outs):
            return None, what + "; its readers not observed"
        changed = hits(lambda g, w: _rel_error(g, w) > 1e-2, outs or [out])
        zeros = hits(lambda g, w: np.mean((g == 0) & (w != 0)) > 0.5, outs)
        if not changed:
            return False, what + ", but no output changes by more than 1%"
        return True, what + (f"; {', '.join(zeros)} mostly zero" if zeros else f"; {', '.join(changed)} off by more than 1%")
    if f.kind == "constant":
        outs = reader_outputs(f.tensor, only_half=True)
        if not outs:
            return False, "read in fp32"
        if not any(seen(o) for o in outs):
            return None, "its readers not observed"
        if f.hazard == "overflow":
            found = hits(lambda g, w: bool(np.any(~np.isfinite(g) & np.isfinite(w))), outs)
            return bool(found), (f"inf/NaN in {', '.join(found)}" if found else "no inf downstream")
        found = hits(lambda g, w: _rel_error(g, w) > 1e-2, outs)
        return bool(found), (f"{', '.join(found)} off by more than 1%" if found else "no visible change downstream")
    name = f.tensor
    if not seen(name):
        return None, f"{name} not observed"
    if not rounded(name):
        return False, f"{name} stays fp32"
    v, w = vals[name], ref[name]
    h = _to16(v)
    if f.hazard == "overflow":
        n = int(np.count_nonzero(np.isinf(h) & np.isfinite(w)))
        return n > 0, f"{n} inf in {name}"
    if f.hazard == "underflow":
        nz = np.count_nonzero(w != 0)
        share = float(np.count_nonzero((h == 0) & (w != 0)) / max(1, nz))
        return share > underflow_share, f"{100 * share:.0f}% of {name} zero"
    err = _rel_error(h, w)
    return err > FP16_EPS, f"mean relative error {err:.2g} in {name}"


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Mean absolute error over the mean magnitude (robust where single values are near zero)."""
    g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    m = np.isfinite(w)
    if not np.any(m):
        return 0.0
    scale = float(np.mean(np.abs(w[m])))
    if scale == 0.0:
        return 0.0 if np.array_equal(g[m], w[m]) else math.inf
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(np.mean(np.abs(g[m] - w[m])))
    return err / scale if math.isfinite(err) else math.inf


def _check(model: onnx.ModelProto, report: PrecisionReport, info: _Info, feeds: Mapping[str, np.ndarray],
           ref: Mapping[str, np.ndarray], underflow_share: float, absorption_share: float, subgraphs: bool,
           convert: Converter) -> None:
    """Confirm each finding on the emulated model, then build the keep-list from the confirmed ones
    and re-run until no finding shows any more (a hazard hidden behind another, e.g. an underflow
    behind an overflow's inf, shows once the first is fixed): at most ``_ROUNDS`` runs."""
    def run(keep: Sequence[str]) -> list[tuple[bool, str]]:
        emulated, half = _emulated(model, report.mode, keep, convert)
        vals, _, _ = _observe(emulated, feeds, subgraphs)
        for name, value in feeds.items():
            vals.setdefault(name, np.asarray(value))
        return [_symptom(f, info, vals, ref, half, underflow_share, absorption_share) for f in report.findings]

    keep: dict[str, None] = {}
    for f, (shows, evidence) in zip(report.findings, run(())):
        f.confirmed, f.evidence = shows, evidence
        if shows is not False:  # confirmed, or the run cannot tell: keep it to be safe
            keep.update(dict.fromkeys(f.keep_fp32))
    for _ in range(_ROUNDS):
        results = run(list(keep))
        grown = False
        for f, (shows, evidence) in zip(report.findings, results):
            f.fixed, f.fixed_evidence = (None if shows is None else not shows), evidence
            if shows and not set(f.keep_fp32) <= set(keep):
                keep.update(dict.fromkeys(f.keep_fp32))
                grown = True
        if not grown:
            break
    report.keep_fp32 = list(keep)
    report.checked = True


_ROUNDS = 3
