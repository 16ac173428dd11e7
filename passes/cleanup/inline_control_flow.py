"""Control flow whose path is known before the model runs, inlined into the enclosing graph.

    If(c) { then: ... -> a } { else: ... -> b },  c a constant true   =>  then's nodes; y = a
    Loop(M=1, cond=true | absent, v0) { body(i, cond_in, v_in) -> (cond_out, v_out, s) }
        =>  body's nodes with i = 0, cond_in = cond, v_in = v0;  v_final = v_out;
            scan output = Unsqueeze(s, axes=[0])

An If reads its condition once and runs exactly one branch, so running that branch's nodes in its
place computes the same values bit for bit. A Loop whose trip count is the constant 1 and whose
condition at entry is a constant true (or absent) runs its body exactly once with iteration number
0; its carried outputs are the body's carried outputs, its scan outputs the body's scan outputs
stacked on a new axis 0 (one iteration: an Unsqueeze). Nothing else is inlined: a Loop whose
condition at entry is false or unknown may run zero times, and one with ``M != 1`` (or no ``M``)
another number of times.

The moved nodes keep their tensors; a branch-local name that is also used elsewhere in the model
is renamed (:class:`~graphpass.ir.graph.NameGen`), and subgraphs nested in the moved nodes follow
(they refer to the same tensor objects). The If's / Loop's output tensors keep their names and
types: the node producing a branch output writes the output tensor itself; when that is not
possible (the branch output is an outer-scope tensor, a graph input, a constant, or already taken
by another output) the readers read the source directly, or, for an output of the enclosing
graph (whose name must stay), an Identity writes it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.ir import model_io
from graphpass.ir.graph import NameGen, iter_graphs, peek_values, replace_uses, subgraphs_of
from graphpass.passes.cleanup._common import is_onnx_op, prepacked_operand
from graphpass.passes.cleanup._fold_bounds import constant_source, judges_operand, valid_shape_operand
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT

__all__ = ["InlineControlFlow"]


def _constant_value(t: gs.Tensor) -> np.ndarray | None:
    """The value of ``t`` when it is an initializer or the output of a Constant node (any scope)."""
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is not None and is_onnx_op(p, "Constant") and isinstance(p.attrs.get("value"), gs.Constant):
        return np.asarray(p.attrs["value"].values)
    return None


def _scalar(t: gs.Tensor | None) -> np.ndarray | None:
    if t is None or not t.name:
        return None
    v = _constant_value(t)
    return v if v is not None and v.size == 1 else None


class _Names:
    """Which tensor objects hold which names across the whole model, to rename on a clash."""

    def __init__(self, root: gs.Graph):
        self.root = root
        self.holders: dict[str, set[int]] = {}
        self._gen: NameGen | None = None
        for g in iter_graphs(root):
            for t in g.inputs:
                self._hold(t)
            for t in g.outputs:
                self._hold(t)
            for n in g.nodes:
                for t in list(n.inputs) + list(n.outputs):
                    self._hold(t)

    def _hold(self, t: gs.Tensor) -> None:
        if t.name:
            self.holders.setdefault(t.name, set()).add(id(t))

    def forget(self, graph: gs.Graph) -> None:
        """``graph`` (a branch being dropped) no longer holds the names of the tensors it defines."""
        for g in iter_graphs(graph):
            for n in g.nodes:
                for t in n.outputs:
                    self.holders.get(t.name, set()).discard(id(t))

    def unique(self, t: gs.Tensor) -> bool:
        """Give ``t`` a fresh name if another tensor of the model holds its name; True if renamed."""
        holders = self.holders.get(t.name, set())
        if not t.name or holders <= {id(t)}:
            return False
        holders.discard(id(t))
        if self._gen is None:
            self._gen = NameGen(self.root)
        t.name = self._gen(t.name)
        self._hold(t)
        return True

    def fresh(self, prefix: str) -> str:
        if self._gen is None:
            self._gen = NameGen(self.root)
        name = self._gen(prefix)
        self.holders.setdefault(name, set())
        return name


def _local_tensors(nodes: list[gs.Node], sub: gs.Graph) -> list[gs.Tensor]:
    """Tensors that move with ``nodes`` into the enclosing scope: their outputs, and constants
    (the subgraph's initializers) they or their nested subgraphs read, in first-use order."""
    seen: set[int] = set()
    out: list[gs.Tensor] = []

    def add(t: gs.Tensor) -> None:
        if t.name and id(t) not in seen:
            seen.add(id(t))
            out.append(t)

    def walk(g_nodes):
        for n in g_nodes:
            for t in n.inputs:
                if isinstance(t, gs.Constant):
                    add(t)
            for s in subgraphs_of(n):
                walk(s.nodes)
    for n in nodes:
        for t in n.outputs:
            add(t)
    walk(nodes)
    for t in sub.outputs:
        if isinstance(t, gs.Constant):
            add(t)
    return out


def _declared(t: gs.Tensor) -> tuple[int, ...]:
    """The shape a body declares for its iteration number or cond: () or a static one-element shape."""
    shape = t.shape
    if shape is not None and all(isinstance(d, (int, np.integer)) and int(d) == 1 for d in shape):
        return tuple(int(d) for d in shape)
    return ()


def _contradicts(a, b) -> bool:
    """Two shapes that cannot both hold: other ranks, or another static size on one axis."""
    if len(a) != len(b):
        return True
    return any(isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer)) and int(x) != int(y)
               for x, y in zip(a, b))


def _take_shape(out: gs.Tensor, shape) -> None:
    """``out`` takes the shape its new source computes when it has none or a contradicting one
    (a control-flow output declared with another rank than its body gives: nothing checked the
    declaration while the Loop/If hid the shape; once inlined, shape inference would reject it)."""
    if shape is not None and (out.shape is None or _contradicts(out.shape, shape)):
        out.shape = list(shape)


def _refused_as_constant(out: gs.Tensor, src: gs.Tensor) -> bool:
    """Whether a reader of ``out`` takes ``src`` computed at run time but refuses it as an
    initializer (a Range bound of shape [1]: the ONNX function of AffineGrid reads one from an If),
    or computes otherwise with it (LSTM's R, prepacked)."""
    src = constant_source(src)  # a Constant node's value too (simplify_shapes writes one for a branch output)
    if src is None:
        return False
    return any(prepacked_operand(c, k) or (judges_operand(c.op, k)
                                           and not valid_shape_operand(c.op, k, np.asarray(peek_values(src))))
               for c in out.outputs for k, t in enumerate(c.inputs) if t is out)


def _cast_pair_read_by_a_subgraph(moved: list[gs.Node], graph: gs.Graph, outs: list[gs.Tensor],
                                  sources: list[gs.Tensor]) -> str | None:
    """onnxruntime (1.2x-1.32, optimizations off too) fails at run time ('Missing Input') on a
    Cast reading a Cast in a graph whose result only a subgraph reads (see hoist_loop_invariants):
    the reason when inlining would build that, else None."""
    here = {id(n) for n in graph.nodes} | {id(n) for n in moved}
    out_of = {id(s): o for s, o in zip(sources, outs)}
    for n in moved:
        if not is_onnx_op(n, "Cast") or not n.inputs or not n.outputs:
            continue
        p = n.inputs[0].inputs[0] if len(n.inputs[0].inputs) == 1 else None
        if p is None or not is_onnx_op(p, "Cast"):
            continue
        t = n.outputs[0]
        readers = list(t.outputs) + (list(out_of[id(t)].outputs) if id(t) in out_of else [])
        if readers and all(id(r) not in here for r in readers):
            return (f"its Cast '{n.name}' reads a Cast and only a subgraph reads it: onnxruntime fails on that "
                    "in the enclosing graph")
    return None


class _Inliner:
    def __init__(self, root: gs.Graph, ctx: PassContext, name: str, opset: int):
        self.root = root
        self.ctx = ctx
        self.name = name
        self.opset = opset
        self.names = _Names(root)
        self.stats = {"if_inlined": 0, "loop_inlined": 0, "renamed": 0}
        #: a moved tensor -> the output tensor its writer now writes instead
        self.claimed: dict[int, gs.Tensor] = {}

    # -- the walk ----------------------------------------------------------------------------

    def visit(self, graph: gs.Graph) -> bool:
        """Inline in ``graph`` and (innermost first) in every subgraph; True if anything changed."""
        changed = False
        for node in list(graph.nodes):
            for sub in subgraphs_of(node):
                changed |= self.visit(sub)
        new_nodes: list[gs.Node] = []
        for node in list(graph.nodes):
            placed = None
            if is_onnx_op(node, "If"):
                placed = self._if(node, graph)
            elif is_onnx_op(node, "Loop"):
                placed = self._loop(node, graph)
            if placed is None:
                new_nodes.append(node)
            else:
                new_nodes.extend(placed)
                changed = True
        if changed:
            graph.nodes = new_nodes
        return changed

    # -- If ------------------------------------------------------------------------------------

    def _if(self, node: gs.Node, graph: gs.Graph) -> list[gs.Node] | None:
        cond = _scalar(node.inputs[0] if node.inputs else None)
        if cond is None:
            self.ctx.explain(self.name, node, "the condition is not a constant of one element")
            return None
        taken, dropped = ("then_branch", "else_branch") if bool(cond.ravel()[0]) else ("else_branch", "then_branch")
        branch = node.attrs.get(taken)
        if not isinstance(branch, gs.Graph):
            self.ctx.explain(self.name, node, "the taken branch is not a graph")
            return None
        if branch.inputs or len(branch.outputs) != len(node.outputs):
            self.ctx.explain(self.name, node, "the taken branch has inputs, or not one output per If output")
            return None
        reason = _cast_pair_read_by_a_subgraph(list(branch.nodes), graph, list(node.outputs), list(branch.outputs))
        if reason:
            self.ctx.explain(self.name, node, reason)
            return None
        if isinstance(node.attrs.get(dropped), gs.Graph):
            self.names.forget(node.attrs[dropped])  # its names go with it: no need to rename around them
        moved = list(branch.nodes)
        self._rename(moved, branch)
        sources = list(branch.outputs)
        node.inputs.clear()
        tail = self._connect(list(node.outputs), sources, graph, moved)
        node.outputs.clear()
        branch.nodes = []
        self.stats["if_inlined"] += 1
        return moved + tail

    # -- Loop ------------------------------------------------------------------------------------

    def _loop(self, node: gs.Node, graph: gs.Graph) -> list[gs.Node] | None:
        body = node.attrs.get("body")
        if not isinstance(body, gs.Graph):
            return None
        m = node.inputs[0] if node.inputs else None
        cond = node.inputs[1] if len(node.inputs) > 1 else None
        m_value = _scalar(m)
        if m_value is None or m_value.dtype.kind not in "iu" or int(m_value.ravel()[0]) != 1:
            self.ctx.explain(self.name, node, "the trip count M is not the constant 1 (the body may run "
                                              "another number of times)")
            return None
        cond_value = None
        if cond is not None and cond.name:
            cond_value = _scalar(cond)
            if cond_value is None:
                self.ctx.explain(self.name, node, "the condition at entry is not a constant (the Loop may run "
                                                  "zero times)")
                return None
            if not bool(cond_value.ravel()[0]):
                self.ctx.explain(self.name, node, "the condition at entry is false: the Loop runs zero times")
                return None
        carried_in = list(node.inputs[2:])
        n_carried = len(carried_in)
        if len(body.inputs) != 2 + n_carried or len(body.outputs) != 1 + len(node.outputs) \
                or len(node.outputs) < n_carried or any(not t.name for t in carried_in):
            self.ctx.explain(self.name, node, "the body's inputs/outputs do not match the Loop's")
            return None
        outs = list(node.outputs)
        reason = _cast_pair_read_by_a_subgraph(list(body.nodes), graph, outs, list(body.outputs[1:]))
        if reason:
            self.ctx.explain(self.name, node, reason)
            return None
        moved = list(body.nodes)
        self._rename(moved, body)
        # body inputs -> values known at the single iteration
        # onnxruntime shapes the iteration number (and an absent cond) as the body declares them
        # ([] or [1]); a given cond reaches the body as it is ([1] stays [1])
        iter_num = gs.Constant(self.names.fresh(f"{node.name or 'loop'}_iteration"),
                               np.zeros(_declared(body.inputs[0]), dtype=np.int64))
        if cond is None or not cond.name:
            cond = gs.Constant(self.names.fresh(f"{node.name or 'loop'}_cond"),
                               np.ones(_declared(body.inputs[1]), dtype=np.bool_))
        substitutes = [iter_num, cond, *carried_in]
        mapping = {id(b): s for b, s in zip(body.inputs, substitutes)}
        for b, s in zip(body.inputs, substitutes):
            replace_uses(b, s)  # consumers in the body and in subgraphs nested in it
        sources = [mapping.get(id(t), t) for t in body.outputs[1:]]
        node.inputs.clear()
        node.outputs.clear()
        body.nodes = []
        body.inputs = []
        body.outputs = []
        tail: list[gs.Node] = []
        carried_outs, scan_outs = outs[:n_carried], outs[n_carried:]
        tail += self._connect(carried_outs, sources[:n_carried], graph, moved)
        for out, s in zip(scan_outs, sources[n_carried:]):
            if not out.name:
                continue
            s = self.claimed.get(id(s), s)
            _take_shape(out, None if s.shape is None else [1, *s.shape])
            label = f"{node.name or 'loop'}_scan"
            if self.opset >= 13:
                axes = gs.Constant(self.names.fresh(f"{label}_axes"), np.array([0], dtype=np.int64))
                tail.append(gs.Node("Unsqueeze", name=self.names.fresh(label), inputs=[s, axes], outputs=[out]))
            else:
                tail.append(gs.Node("Unsqueeze", name=self.names.fresh(label), attrs={"axes": [0]},
                                    inputs=[s], outputs=[out]))
        self.stats["loop_inlined"] += 1
        return moved + tail

    # -- shared ----------------------------------------------------------------------------------

    def _rename(self, moved: list[gs.Node], sub: gs.Graph) -> None:
        for t in _local_tensors(moved, sub):
            if self.names.unique(t):
                self.stats["renamed"] += 1

    def _connect(self, outs: list[gs.Tensor], sources: list[gs.Tensor], graph: gs.Graph,
                 moved: list[gs.Node]) -> list[gs.Node]:
        """Make each output tensor in ``outs`` hold the value of the matching ``sources`` tensor."""
        moved_ids = {id(n) for n in moved}
        graph_outs = {id(t) for t in graph.outputs}
        tail: list[gs.Node] = []
        for out, src in zip(outs, sources):
            if not out.name:
                continue
            claimed_by = self.claimed.get(id(src))
            src = claimed_by or src
            if out.dtype is None:
                out.dtype = src.dtype
            _take_shape(out, src.shape)
            writer = src.inputs[0] if len(src.inputs) == 1 else None
            if writer is not None and id(writer) in moved_ids and not isinstance(src, gs.Constant) \
                    and src is not claimed_by and not _refused_as_constant(out, src):
                # the moved node writes the output tensor itself (its name and type stay); a
                # second output of the same source then reads this one
                self.claimed[id(src)] = out
                replace_uses(src, out)
                writer.outputs[writer.outputs.index(src)] = out
            elif id(out) in graph_outs or _refused_as_constant(out, src):
                tail.append(gs.Node("Identity", name=self.names.fresh(f"{out.name}_inlined"),
                                    inputs=[src], outputs=[out]))
            else:
                replace_uses(out, src)
        return tail


@register
class InlineControlFlow(Pass):
    """Inlines control flow whose path is known at compile time.

    Cases:
      1. If whose condition is a constant (an initializer or a Constant node, of any scope): the
         taken branch's nodes replace it;
      2. Loop whose trip count M is the constant 1 and whose condition at entry is a constant true
         or absent: the body's nodes replace it (iteration 0, carried values from the Loop's
         inputs, scan outputs unsqueezed on axis 0);
      3. both inside If/Loop/Scan bodies, innermost first.
    Refused, explained: a condition or trip count not constant, a condition false at entry (zero
    trips), a trip count other than 1.
    """

    name = "inline_control_flow"
    anchor_ops = frozenset({"If", "Loop"})  # nothing to do in a graph without them
    summary = "Inline If with a constant condition and Loop with a constant single trip (M=1, cond true)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = False
    runs_after = ("fold_constants",)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        if not any(is_onnx_op(n, "If", "Loop") for g in iter_graphs(graph) for n in g.nodes):
            return PassResult(False, {"if_inlined": 0, "loop_inlined": 0, "renamed": 0})  # nothing to index
        inliner = _Inliner(graph, ctx, self.name, model_io.opset_of(graph) or graph.opset or 13)
        changed = inliner.visit(graph)
        return PassResult(changed, inliner.stats)
