"""int64 computation the target runs on AI CPU, in int32 where a range proof says every value fits.

    Range(0, Squeeze(Shape(x)), 1) -> Max(., C) -> GatherND(data, .)        (x: [batch, 16] int64)
    =>  Range(C0', Cast(Squeeze(Shape(x)), int32), C1') -> Max(., C') -> Cast(int64) -> GatherND

issue 25's "int64 to int32" knowledge. ATC's AI Core kernels of the elementwise ops take int32 but
no int64 on 910A and 310P (``data/op_limits.toml`` ``[int64.<Op>]``, with sources): an int64 Add,
Range or comparison there runs on AI CPU. This pass computes such an op in int32 when
``_int_ranges`` proves that every tensor it reads and writes holds values in [-2^31, 2^31-1] on
every input: then int32 arithmetic gives the very integers int64 arithmetic gives (no wrap), so
the outputs are bitwise those of the original (promise EXACT).

Narrowed together: the connected part of the graph whose ops may run in int32 (by their ONNX
schema at the model's opset, one type variable at a time: a Slice's starts/ends/axes/steps are
one group, all int32 or all int64) and whose values are proven, when it holds at least one op the
target runs on AI CPU in int64. At its edges: Cast(int32) of a value entering it (a constant is
stored as int32 instead), Cast(int64) of a value leaving it for an op whose schema takes int64
only (Reshape's shape, Expand's shape, GatherND's indices, ConstantOfShape's input, TopK's k,
Tile's repeats, ...); a Cast(to=int64) inside it becomes a Cast(to=int32); a ConstantOfShape
inside it gets an int32 value. A graph output keeps its type: the op writing it is not narrowed.

Refused, with the reason (``--explain narrow_int64``): a value not proven within int32 (a graph
input's data, a dim no input bounds, a product that may leave int32, a division by a range that
holds 0), an op the target runs on AI Core in int64 (nothing to gain), an op whose result is a
graph output, an op read inside a subgraph. The top-level graph only: int64 ops in a Loop/If/Scan
body are left as they are. No unproven narrowing: graphpass has no option that
narrows without a proof (auto_optimizer's KnowledgeTypeCast does, and breaks models).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.cost_model.op_limits import int64_data, load_op_limits
from graphpass.ir.graph import NameGen, peek_values
from graphpass.ir.model import opset_of
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, Pass
from graphpass.passes.lowering._int_ranges import IntRanges

__all__ = ["NarrowInt64"]

_NAME = "narrow_int64"

#: ops whose integer results depend on the values only, not on the width, when nothing wraps:
#: the arithmetic the range analysis bounds, and the ops that copy or compare elements
NARROWABLE = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min", "Range",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where",
    "Concat", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Slice",
    "Gather", "GatherElements", "GatherND", "Split", "Cast", "ConstantOfShape",
})

_I64 = np.dtype(np.int64)

#: ops that move a shape vector's elements (the values onnxruntime's shape inference propagates)
_SHAPE_MOVES = frozenset({"Gather", "Squeeze", "Unsqueeze", "Concat", "Slice", "Reshape", "Identity", "Flatten"})


def _shape_data(graph: gs.Graph) -> set[int]:
    """Tensors that are a Shape's output, or only moved elements of one (and of constants)."""
    out: set[int] = set()
    for n in graph.nodes:
        if n.op == "Shape":
            out.update(id(t) for t in n.outputs)
        elif n.op in _SHAPE_MOVES and n.inputs:
            data = [t for t in n.inputs if t.name] if n.op == "Concat" else [n.inputs[0]]
            if any(id(t) in out for t in data) and all(id(t) in out or isinstance(t, gs.Constant) for t in data):
                out.update(id(t) for t in n.outputs)
    return out


def _is_i64(t: gs.Tensor) -> bool:
    dtype = t.dtype
    if dtype is None:
        return False
    if dtype is _I64 or dtype is np.int64:  # asked of every tensor of every node: the usual forms first
        return True
    if isinstance(dtype, np.dtype):  # float32 & co.: compared as they are, no np.dtype() call
        return dtype == _I64
    try:
        return np.dtype(dtype) == _I64
    except TypeError:
        return False


class _Group:
    """One type variable of one node: the tensors (input and output slots) that share it."""

    __slots__ = ("node", "var", "ins", "outs", "int32_ok")

    def __init__(self, node: gs.Node, var: str, int32_ok: bool):
        self.node = node
        self.var = var
        self.ins: list[int] = []
        self.outs: list[int] = []
        self.int32_ok = int32_ok

    def tensors(self) -> list[gs.Tensor]:
        return [self.node.inputs[i] for i in self.ins] + [self.node.outputs[j] for j in self.outs]


@functools.lru_cache(maxsize=512)
def _schema(op: str, opset: int):
    """(inputs, outputs, int32 allowed per type variable) of ``op``'s schema at ``opset``: each
    formal parameter as (type_str, variadic); None for an op onnx does not know."""
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    allowed = {c.type_param_str: ("tensor(int32)" in c.allowed_type_strs) for c in schema.type_constraints}
    ins = tuple((f.type_str, f.option == variadic) for f in schema.inputs)
    outs = tuple((f.type_str, f.option == variadic) for f in schema.outputs)
    return ins, outs, allowed


_F32, _F16, _F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)


def _may_be_int64(node: gs.Node) -> bool:
    """False when ``int64_data(node)`` is: its first named output is a float (the common case, told
    without int64_data's dtype conversions: ~8 us a node, for every Add/Mul/... of a CNN)."""
    for t in node.outputs:
        if t.name:
            dtype = t.dtype  # (numpy's dtypes of these are one object each: compared by identity)
            return not (dtype is _F32 or dtype is _F16 or dtype is _F64)
    return False


def _groups(node: gs.Node, opset: int) -> list[_Group]:
    """The int64 type-variable groups of ``node`` by its schema at ``opset``."""
    if node.domain not in (None, "", "ai.onnx") or not (
            any(_is_i64(t) for t in node.inputs if t.name) or any(_is_i64(t) for t in node.outputs if t.name)):
        return []
    found = _schema(node.op, opset)
    if found is None:
        return []
    formal_ins, formal_outs, allowed = found
    groups: dict[str, _Group] = {}

    def slot(formals, k):
        if k < len(formals):
            return formals[k][0]
        return formals[-1][0] if formals and formals[-1][1] else None

    for side, tensors, formals in (("in", node.inputs, formal_ins), ("out", node.outputs, formal_outs)):
        for k, t in enumerate(tensors):
            var = slot(formals, k)
            if var is None or not t.name or var not in allowed:
                continue
            g = groups.setdefault(var, _Group(node, var, allowed[var]))
            (g.ins if side == "in" else g.outs).append(k)
    return [g for g in groups.values() if g.tensors() and all(_is_i64(t) for t in g.tensors())]


@register
class NarrowInt64(Pass):
    """Runs int64 computation in int32 where the target has no int64 AI Core kernel and a range
    proof holds.

    Cases:
      1. index arithmetic on dims (Shape -> Gather -> Add/Mul/... -> Concat -> Reshape): static dims,
         and symbolic dims an input bounds by the target's device memory;
      2. Range over proven start/limit/delta, and the comparisons, Max/Min, Where on its output
         (attention masks, position ids);
      3. ArgMax/ArgMin/TopK indices (below their axis' size) fed to arithmetic;
      4. small integer constants (stored as int32 copies; a constant also read elsewhere keeps its
         int64 original for those readers);
      5. Cast(to=int64) of a narrower integer inside the region becomes Cast(to=int32);
         ConstantOfShape with a proven int64 value gets an int32 value;
      6. a Shape's vector and the Gather/Squeeze/Unsqueeze/Concat/Slice that only move its elements
         stay int64 (their AI Core kernels take int64): the Cast(int32) goes where arithmetic reads
         a dim. (onnxruntime 1.32 also mis-types a Range fed by Cast(Shape(x)) of a static x in its
         shape inference: "All inputs to 'Range' op must be of the same type", measured.)
    """

    name = _NAME
    summary = ("int64 ops the target runs on AI CPU (no int64 AI Core kernel) -> int32, where a range proof shows "
               "every value fits; Casts at the edges.")
    kind = PassKind.LOWERING
    promise = EXACT
    scored = True  # the cost model vetoes an application that does not pay
    needs_target = True  # which int64 ops leave AI Core is the target's fact (data/op_limits.toml)
    runs_before = (PassKind.FUSION,)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        target = ctx.target.require(f"pass '{self.name}'").name
        limits = load_op_limits()
        opset = opset_of(graph) or graph.opset or 13
        # 1. the groups that may run in int32, and the seeds: those the target runs on AI CPU
        candidates: dict[tuple[int, str], _Group] = {}
        seeds: list[_Group] = []
        # a seed is a node of an op the target runs on AI CPU for its int64 data: with none in the
        # graph no part is chosen, and step 1 (the schemas of every node, the range analysis)
        # would find candidates for nothing (most CNNs: no int64 arithmetic at all)
        seeding = any(node.op in limits.int64 and _may_be_int64(node) and limits.int64_reason(node, target)
                      for node in graph.nodes)
        found = [(node, groups) for node in graph.nodes if (groups := _groups(node, opset))] if seeding else []
        if found:  # the analyses only when some node computes in int64 (none in most CNNs)
            ranges = IntRanges(graph, limits.max_tensor_bytes(target))
            top = {id(n) for n in graph.nodes}
            outputs = {id(t) for t in graph.outputs}
            shape_data = _shape_data(graph)
        for node, groups in found:
            why_seed = limits.int64_reason(node, target)
            seed = self._seed_group(node, groups) if why_seed else None
            for g in groups:
                why = self._refusal(g, ranges, top, outputs, shape_data)
                if why is None:
                    candidates[(id(node), g.var)] = g
                    if g is seed:
                        seeds.append(g)
                elif g is seed:
                    ctx.explain(self.name, node, f"int64 {node.op} stays on AI CPU: {why}")

        # 2. connected parts (groups sharing a tensor) that hold a seed
        parts = self._parts(candidates)
        chosen: list[_Group] = []
        seeded = {id(g) for g in seeds}
        for part in parts:
            if any(id(g) in seeded for g in part):
                chosen.extend(part)
        in_region = {id(g.node) for g in chosen}
        for node in graph.nodes:
            if (node.op in limits.int64 and id(node) not in in_region and _may_be_int64(node) and int64_data(node)
                    and not limits.int64_reason(node, target)):
                ctx.explain(self.name, node, f"int64 {node.op} runs on AI Core on {target}: nothing to gain")
        if not chosen:
            return PassResult(False, {"fired": 0})
        stats = self._rewrite(graph, chosen, seeds, ctx)
        return PassResult(True, stats)

    # -- analysis --------------------------------------------------------------------------

    @staticmethod
    def _seed_group(node: gs.Node, groups: list[_Group]) -> _Group | None:
        """The group of the node's int64 data (its output's, or its first input's for a comparison)."""
        for g in groups:
            if 0 in g.outs:
                return g
        for g in groups:
            if 0 in g.ins:
                return g
        return None

    @staticmethod
    def _refusal(g: _Group, ranges: IntRanges, top: set[int], outputs: set[int], shape_data: set[int]) -> str | None:
        node = g.node
        if node.op not in NARROWABLE:
            return f"{node.op} is not narrowed (its result depends on the integer width or is not bounded here)"
        if node.op in _SHAPE_MOVES and any(id(node.inputs[i]) in shape_data for i in g.ins):
            # case 6: a shape vector is moved in int64 (an AI Core kernel takes it) and cast where it is computed on
            return f"'{node.outputs[0].name}' moves a shape vector: kept int64, cast where arithmetic reads it"
        if not g.int32_ok:
            return f"{node.op}'s schema takes no int32 for {g.var}"
        for t in g.tensors():
            if id(t) in outputs:
                return f"'{t.name}' is a graph output (its type stays)"
            if any(id(c) not in top for c in t.outputs):
                return f"'{t.name}' is read inside a subgraph"
            r = ranges.of(t)
            if not r.fits():
                return f"'{t.name}' is not proven within int32 ({r.why or 'range ' + r.text()})"
        if node.op == "Range" and len(node.inputs) == 3:
            # its element count is (limit - start) / delta: onnx's shape inference computes that
            # difference in the inputs' type, so it must fit int32 too (else the checker refuses)
            start, limit = ranges.of(node.inputs[0]), ranges.of(node.inputs[1])
            lo, hi = limit.lo - start.hi, limit.hi - start.lo
            if lo < -(2 ** 31) or hi > 2 ** 31 - 1:
                return f"Range's span limit - start ({lo} .. {hi}) is not proven within int32"
        return None

    @staticmethod
    def _parts(candidates: dict[tuple[int, str], _Group]) -> list[list[_Group]]:
        groups = list(candidates.values())
        parent = list(range(len(groups)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        by_tensor: dict[int, int] = {}
        for i, g in enumerate(groups):
            for t in g.tensors():
                if isinstance(t, gs.Constant):
                    continue  # a shared constant does not join two regions (each gets its int32 copy)
                j = by_tensor.setdefault(id(t), i)
                parent[find(i)] = find(j)
        parts: dict[int, list[_Group]] = {}
        for i, g in enumerate(groups):
            parts.setdefault(find(i), []).append(g)
        return list(parts.values())

    # -- rewrite ---------------------------------------------------------------------------

    def _rewrite(self, graph: gs.Graph, chosen: list[_Group], seeds: list[_Group], ctx: PassContext) -> dict[str, Any]:
        names = NameGen(graph)
        # slots read / written in int32
        in32: set[tuple[int, int]] = {(id(g.node), i) for g in chosen for i in g.ins}
        written: dict[int, gs.Tensor] = {}  # tensors the region writes (now int32)
        for g in chosen:
            for j in g.outs:
                written[id(g.node.outputs[j])] = g.node.outputs[j]
        narrowed_nodes = {id(g.node) for g in chosen}
        const32: dict[int, gs.Constant] = {}
        cast_in: dict[int, gs.Variable] = {}  # int64 tensor entering -> its Cast(int32)
        cast_back: dict[int, gs.Variable] = {}  # int32 tensor leaving -> its Cast(int64)
        before: dict[int, list[gs.Node]] = {}  # producer node id (0: graph start) -> Casts after it
        producer = {id(t): n for n in graph.nodes for t in n.outputs}

        def cast(x: gs.Tensor, to: int, dtype, label: str) -> gs.Variable:
            y = gs.Variable(names(f"{x.name}_{label}"), dtype=dtype, shape=list(x.shape) if x.shape is not None else None)
            n = gs.Node("Cast", names(f"{x.name}_{label}_cast"), {"to": to}, inputs=[x], outputs=[y])
            p = producer.get(id(x))
            before.setdefault(id(p) if p is not None else 0, []).append(n)
            return y

        # the readers outside the region of a tensor it writes, noted before any input is rewired
        leaving: list[tuple[gs.Node, int, gs.Tensor]] = []
        for t in written.values():
            for c in list(t.outputs):
                for k, x in enumerate(c.inputs):
                    if x is t and (id(c), k) not in in32:
                        leaving.append((c, k, t))
        # values entering the region
        casts = 0
        for g in chosen:
            node = g.node
            for i in g.ins:
                x = node.inputs[i]
                if id(x) in written:
                    continue
                if isinstance(x, gs.Constant):
                    c = const32.get(id(x))
                    if c is None:
                        c = const32[id(x)] = gs.Constant(names(f"{x.name}_i32"),
                                                         np.asarray(peek_values(x)).astype(np.int32))
                    node.inputs[i] = c
                else:
                    y = cast_in.get(id(x))
                    if y is None:
                        y = cast_in[id(x)] = cast(x, onnx.TensorProto.INT32, np.int32, "i32")
                        casts += 1
                    node.inputs[i] = y
        # values the region writes: int32 now; readers outside get a Cast(int64)
        for t in written.values():
            t.dtype = np.int32
        for c, k, t in leaving:
            y = cast_back.get(id(t))
            if y is None:
                y = cast_back[id(t)] = cast(t, onnx.TensorProto.INT64, np.int64, "i64")
                casts += 1
            c.inputs[k] = y
        # ops whose attribute names the type
        for g in chosen:
            node = g.node
            if not g.outs:
                continue
            # a new attrs dict, not an edit of the old one in place: the undo log sees the node
            # only through its setters (a vetoed application must leave the int64 form)
            if node.op == "Cast":
                node.attrs = {**node.attrs, "to": onnx.TensorProto.INT32}
            elif node.op == "ConstantOfShape":
                v = node.attrs["value"]
                node.attrs = {**node.attrs, "value": gs.Constant(getattr(v, "name", "") or "value",
                                                                 np.asarray(peek_values(v)).astype(np.int32))}
        # the Casts go right after the node writing their input (graph inputs and constants: first)
        nodes = list(before.get(0, []))
        for n in graph.nodes:
            nodes.append(n)
            nodes.extend(before.get(id(n), []))
        graph.nodes = nodes
        fired = len({id(g.node) for g in seeds if id(g.node) in narrowed_nodes})
        return {"fired": fired, "narrowed_nodes": len(narrowed_nodes), "casts": casts,
                "constants": len(const32)}
