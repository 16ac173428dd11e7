"""Loop-invariant code motion for Loop and Scan bodies.

    Loop(M, cond, v) { body: a = f(outer, const); b = g(a, v_in) ... }
        =>  a = f(outer, const);  Loop(M, cond, v) { body: b = g(a, v_in) ... }

A body node is invariant when it is pure (deterministic, no side effects, no subgraph) and every
input is a constant, an outer-scope value, or the output of another invariant node. Invariant
nodes move in front of the loop, once instead of once per iteration; the body keeps reading
their outputs as outer-scope values. Exact, hardware-neutral, recursive: nested loops are done
innermost first, so a value invariant in both loops leaves both; loops inside If branches are
visited, but nothing is hoisted out of an If branch (that would run it when the branch is not
taken).

Because a hoisted node runs even when the loop would run zero times, a node moves only if it
cannot fail for any input (case 4), or if the body surely runs once: a Loop whose M is a
constant >= 1 (or absent) and whose cond is a constant true (or absent), a Scan whose scan length
is static and >= 1. A Loop with cond false at entry runs zero times whatever M says. Cannot
fail: Constant, Shape, Size, unary elementwise ops, Cast from a non-string type, Clip with static
scalar bounds, Transpose / Softmax on a known rank, and broadcasting elementwise ops (Add, Mul,
Where, ...; Div, Mod, Pow on floats only: an integer division by zero traps) whose input shapes
are static and broadcast. Anything else (Gather, Reshape, Slice, integer Div, Cast from string,
...) stays, explained. A node whose output is a body output stays (the body must produce it), so
the loop's outputs for zero trips are its initial values, as before.
RandomNormal/RandomUniform/Multinomial/Dropout and friends never move.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass, EXACT
from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.graph import subgraphs_of
from graphpass.passes.cleanup._common import is_pure

__all__ = ["HoistLoopInvariants"]

#: Ops that cannot fail for any input value or shape: elementwise ops of one input, constants, shape queries.
_TOTAL_UNARY = frozenset({"Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "LeakyRelu",
                          "Erf", "Floor", "Ceil", "Not", "Identity", "Sign", "IsNaN", "IsInf", "Sin", "Cos", "Softplus",
                          "Constant", "Shape", "Size"})
#: Broadcasting elementwise ops: they fail only when the shapes do not broadcast (checked statically).
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Max", "Min", "And", "Or", "Xor", "Equal", "Less", "Greater",
                           "LessOrEqual", "GreaterOrEqual", "Where"})
#: Broadcasting ops that trap on integers (division by zero): total only on floats.
_FLOAT_ONLY = frozenset({"Div", "Mod", "Pow"})
#: Ops whose attributes must fit the input's rank: total when that rank is known.
_RANK_CHECKED = frozenset({"Transpose", "Softmax", "LogSoftmax"})


def _static(t: gs.Tensor) -> list[int] | None:
    if isinstance(t, gs.Constant):
        return list(t.shape)
    if t.shape is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in t.shape):
        return None
    return [int(d) for d in t.shape]


def _broadcasts(shapes: list[list[int]]) -> bool:
    try:
        np.broadcast_shapes(*[tuple(s) for s in shapes])
    except ValueError:
        return False
    return True


def _is_float(t: gs.Tensor) -> bool:
    try:
        return t.dtype is not None and np.dtype(t.dtype).kind == "f"
    except TypeError:
        return False


def _cannot_fail(node: gs.Node) -> str | None:
    """None when ``node`` cannot fail for any input it may see; else why it could."""
    inputs = [t for t in node.inputs if t.name]
    if node.op in _TOTAL_UNARY:
        return None
    if node.op == "Cast":
        try:
            src = np.dtype(inputs[0].dtype) if inputs[0].dtype is not None else None
        except TypeError:
            src = None
        if src is None or src.kind in "OUS":
            return "a Cast from a string (or an unknown type) fails on text it cannot parse"
        return None
    if node.op == "Clip":
        if all(_static(t) == [] for t in inputs[1:]):
            return None
        return "Clip's bounds are not static scalars"
    if node.op in _RANK_CHECKED:
        if inputs and inputs[0].shape is not None:
            return None
        return f"{node.op}'s attributes may not fit the input's unknown rank"
    if node.op in _BROADCASTING or node.op in _FLOAT_ONLY:
        if node.op in _FLOAT_ONLY and not all(_is_float(t) for t in inputs):
            return f"integer {node.op} traps on a zero divisor"
        shapes = [_static(t) for t in inputs]
        if any(s is None for s in shapes):
            return "its input shapes are not static, and may not broadcast"
        if not _broadcasts(shapes):
            return "its input shapes do not broadcast"
        return None
    return f"{node.op} can fail at run time (an index out of range, a bad shape)"


def _constant_value(t: gs.Tensor) -> np.ndarray | None:
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is not None and p.op == "Constant" and isinstance(p.attrs.get("value"), gs.Constant):
        return np.asarray(p.attrs["value"].values)
    return None


def _runs_at_least_once(loop: gs.Node, opset: int) -> bool:
    """True when the body surely runs once: Loop with M >= 1 (or absent) and cond true (or absent),
    or a Scan whose scan length is static and >= 1."""
    if loop.op == "Loop":
        m = loop.inputs[0] if loop.inputs else None
        cond = loop.inputs[1] if len(loop.inputs) > 1 else None
        if m is not None and m.name:
            v = _constant_value(m)
            if v is None or v.size != 1 or int(v.ravel()[0]) < 1:
                return False
        if cond is not None and cond.name:
            v = _constant_value(cond)
            if v is None or v.size != 1 or not bool(v.ravel()[0]):
                return False
        return True
    if opset < 9:  # Scan-8: sequence_lens and a batch axis; not worth proving
        return False
    n_state = len(loop.inputs) - int(loop.attrs.get("num_scan_inputs", 1))
    scan_in = loop.inputs[n_state] if len(loop.inputs) > n_state else None
    shape = scan_in.shape if scan_in is not None else None
    axes = loop.attrs.get("scan_input_axes")
    axis = int(axes[0]) if axes else 0
    return bool(shape) and isinstance(shape[axis % len(shape)], int) and shape[axis % len(shape)] >= 1


def _hoist(loop: gs.Node, body: gs.Graph, ctx: PassContext, name: str, opset: int) -> list[gs.Node]:
    defined_in_body = {id(t) for t in body.inputs} | {id(t) for n in body.nodes for t in n.outputs}
    body_outputs = {id(t) for t in body.outputs}
    safe_all = _runs_at_least_once(loop, opset)
    invariant: set[int] = set()
    moved: list[gs.Node] = []
    for node in body.nodes:  # topological order: producers before readers
        if not node.outputs or not is_pure(node) or any(id(t) in body_outputs for t in node.outputs):
            continue
        if not all((not t.name) or isinstance(t, gs.Constant) or id(t) not in defined_in_body or id(t) in invariant
                   for t in node.inputs):
            continue
        if node.op == "Cast" and node.inputs and node.inputs[0].inputs and node.inputs[0].inputs[0].op == "Cast" \
                and (id(node.inputs[0]) in invariant or id(node.inputs[0]) not in defined_in_body):
            # onnxruntime (1.32) drops a Cast pair of the outer graph read only inside a subgraph
            # ('Missing Input' at run time, optimizations off too): never build that shape
            ctx.explain(name, node, "a Cast reading a Cast stays in the body: onnxruntime fails on a Cast pair "
                                    "in the outer graph read only by a subgraph")
            continue
        risk = None if safe_all else _cannot_fail(node)
        if risk is not None:
            ctx.explain(name, node, f"{node.op} could fail when the {loop.op} runs zero times ({risk}), "
                                    "and its trip count is not provably >= 1 (Loop: M and cond constant, M >= 1, "
                                    "cond true; Scan: a static scan length >= 1)")
            continue
        invariant.update(id(t) for t in node.outputs)
        moved.append(node)
    if moved:
        ids = {id(n) for n in moved}
        body.nodes = [n for n in body.nodes if id(n) not in ids]
        for n in moved:
            A.mark_created(n, name, replaced=[n])
    return moved


@register
class HoistLoopInvariants(Pass):
    """Moves loop-invariant nodes out of Loop and Scan bodies.

    Cases:
      1. a node reading only constants and outer-scope values;
      2. chains of such nodes (in body order);
      3. nested loops, innermost first; loops inside If branches;
      4. speculation guard: nodes that can fail only move when the loop surely runs (M and cond).
    """

    name = "hoist_loop_invariants"
    anchor_ops = frozenset({"Loop", "Scan"})  # nothing to do in a graph without them
    summary = "Move loop-invariant nodes out of Loop/Scan bodies (exact; recursive)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = False

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        hoisted = self._visit(graph, ctx, model_io.opset_of(graph) or graph.opset or 13)
        return PassResult(hoisted > 0, {"hoisted": hoisted})

    def _visit(self, graph: gs.Graph, ctx: PassContext, opset: int) -> int:
        total = 0
        new_order: list[gs.Node] = []
        for node in list(graph.nodes):
            for sub in subgraphs_of(node):
                total += self._visit(sub, ctx, opset)  # innermost first
            if node.op in ("Loop", "Scan") and node.domain in (None, "", "ai.onnx"):
                body = node.attrs.get("body")
                if isinstance(body, gs.Graph):
                    moved = _hoist(node, body, ctx, self.name, opset)
                    new_order.extend(moved)
                    total += len(moved)
            new_order.append(node)
        if total:
            graph.nodes = new_order
        return total
