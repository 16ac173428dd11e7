"""Constant folding through onnxruntime; the file never grows unless asked.

    Constant node                                  =>  initializer
    Shape(x) / Size(x), x of static shape          =>  int64 constant
    op(c1, c2, ...) with every input constant      =>  constant (computed by onnxruntime)

Every foldable node of a graph is evaluated in one onnxruntime session (one export of the
foldable subgraph, not one per node), so the pass is linear in the graph size; a set that is
only float32/float64 Add, Sub, Mul and Div with no NaN read or made is computed with numpy
instead (the same IEEE-rounded bits, without onnxruntime's import and session). Only the
boundary tensors (read by a node that stays, or by a subgraph) are materialized, and they replace
their subgraph only when the bytes stored do not grow (the size policy of ``_fold_size``: the
folded tensors' bytes are at most the bytes of the constants only that subgraph read, plus 64
bytes per node removed, or fit in the room the model as a whole has before it is bigger than it
was loaded), whatever their size: a ConstantOfShape, Tile or Expand never bloats the
model (onnxsim's most common complaint), and a 100 MB weight transposed is stored transposed.
``fold_growing`` also folds what grows the file, up to ``size_limit`` bytes (default 1 MiB) per
tensor. Nondeterministic ops (random
generators, Dropout), ops with subgraphs, sequence/optional ops and custom domains are never
folded; neither is a tensor that is a graph output. If onnxruntime cannot evaluate the whole
foldable set, the nodes are retried one by one (up to ``max_single_retries``) and the ones that
fail are left alone with a warning.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

from graphpass.passes.framework.pass_base import EXACT, MERGE_EQUAL_CONSTANTS
from graphpass.errors import BadModelError
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.ir import model_io
from graphpass.ir.graph import NameGen, iter_graphs, read_values, remove_nodes
from graphpass.ir.model import model_of
from graphpass.ir.serialize import SOURCE_BYTES, constant_proto
from graphpass.ir.size import bytes_bound, freed_bytes
from graphpass.ir.shapes import count_unresolved, numel, refresh_shapes, static_shape, tensor_elem_type
from graphpass.passes.cleanup._common import is_onnx_op, is_pure, prepacked_operand
from graphpass.passes.cleanup._fold_bounds import bound_nodes, valid_shape_operand
from graphpass.passes.cleanup._fold_size import NODE_ALLOWANCE, SizeMemo, plan

__all__ = ["FoldConstants", "DEFAULT_SIZE_LIMIT"]

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT = 1 << 20

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")


def _lower_constant_nodes(graph: gs.Graph, outs: set[int]) -> list[gs.Node]:
    lowered = []
    for node in [n for n in graph.nodes if n.op == "Constant"]:  # (the op first: one comprehension)
        if not is_onnx_op(node) or len(node.attrs) != 1 or len(node.outputs) != 1:
            continue
        (attr, value), = node.attrs.items()
        out = node.outputs[0]
        if attr not in _CONSTANT_ATTRS or id(out) in outs or isinstance(value, gs.Node.AttributeRef):
            continue
        least = _stored_least(attr, value)  # before reading the values (that makes them an array)
        if isinstance(value, gs.Constant):
            lazy = value.__dict__.get("_values")  # read without caching: a node kept stays as stored
            arr = np.asarray(lazy.load() if isinstance(lazy, gs.ir.tensor.LazyValues) else value.values)
        elif attr in ("value_float", "value_floats"):
            arr = np.array(value, dtype=np.float32)
        else:
            arr = np.array(value, dtype=np.int64)
        if arr.dtype == object:
            continue
        if least is not None and arr.dtype.kind in "iub" and arr.nbytes > least + NODE_ALLOWANCE:
            # small integers stored as varints (value_ints, a make_tensor value): a raw
            # initializer would take up to 8x the bytes; the node stays (its readers do not fold)
            continue
        node.outputs.clear()
        out.to_constant(arr)
        lowered.append(node)
    return lowered


def _varint_len(v: int) -> int:
    return 10 if v < 0 else max(1, (v.bit_length() + 6) // 7)


def _stored_least(attr: str, value) -> int | None:
    """The least bytes a Constant node's value takes as stored (None: never less than raw)."""
    if isinstance(value, gs.Constant):
        return freed_bytes(value)
    if attr == "value_ints":
        return sum(1 + _varint_len(int(v)) for v in value)  # a tag and a varint each
    return None


def _shape_value(node: gs.Node) -> np.ndarray | None:
    shape = static_shape(node.inputs[0])
    if shape is None:
        return None
    if node.op == "Size":
        return np.array(numel(shape), dtype=np.int64)
    rank = len(shape)
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else int(end)
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.array(shape[start:end], dtype=np.int64)


def _has_unresolved_shape(graph: gs.Graph) -> bool:
    for g in iter_graphs(graph):
        for n in [n for n in g.nodes if n.op in _SHAPE_OPS]:  # (the op first: one comprehension)
            if is_onnx_op(n) and n.inputs and static_shape(n.inputs[0]) is None:
                return True
    return False


_SHAPE_OPS = frozenset({"Shape", "Size"})


def _nbytes_known(t: gs.Tensor) -> int | None:
    shape = static_shape(t)
    if shape is None or t.dtype is None:
        return None
    try:
        return numel(shape) * np.dtype(t.dtype).itemsize
    except TypeError:
        return None


def _kind(dtype) -> str:
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "?"


#: the ops evaluated with numpy when a batch holds nothing else (onnxruntime's kernels and numpy's
#: ufuncs both round each float32/float64 element once, by IEEE 754: the same bits)
_NUMPY_OPS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_NUMPY_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _evaluate_numpy(nodes: list[gs.Node], wanted: list[gs.Tensor], opsets) -> dict[str, np.ndarray] | None:
    """The values of ``wanted`` when ``nodes`` are only float32/float64 Add, Sub, Mul and Div
    (opset 7 or later: numpy's broadcasting) of constants and of each other, with no NaN read
    or made (the payload of a NaN is the kernel's choice); None for anything else, which
    onnxruntime evaluates. A CNN's folds are mostly such arithmetic (a 10k-node CNN: 666 Adds of
    two one-element constants), and an onnxruntime session for them costs ~35 ms (~60 ms with
    onnxruntime's first import)."""
    if not any(op.domain in ("", "ai.onnx") and op.version >= 7 for op in opsets):
        return None
    named: dict[str, int] = {}  # name -> id: onnxruntime reads tensors by name (a clash: its way)
    computed: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for n in nodes:
            f = _NUMPY_OPS.get(n.op)
            if (f is None or n.domain not in (None, "", "ai.onnx") or n.attrs or len(n.inputs) != 2
                    or len(n.outputs) != 1):
                return None
            args = []
            for t in n.inputs:
                if not t.name or named.setdefault(t.name, id(t)) != id(t):
                    return None
                v = computed.get(id(t))
                if v is None:
                    if not isinstance(t, gs.Constant) or t._export_dtype is not None:
                        return None
                    v = read_values(t)
                    if type(v) is not np.ndarray or v.dtype not in _NUMPY_FLOATS or np.isnan(v).any():
                        return None
                args.append(v)
            if args[0].dtype != args[1].dtype:
                return None
            try:
                out = np.asarray(f(args[0], args[1]))
            except ValueError:  # shapes that do not broadcast: onnxruntime's error and the retry path
                return None
            o = n.outputs[0]
            if not o.name or named.setdefault(o.name, id(o)) != id(o) or np.isnan(out).any():
                return None
            if o.dtype is not None and not (o.dtype is out.dtype or _same_dtype(o.dtype, out.dtype)):
                return None
            computed[id(o)] = out
    values = {}
    for t in wanted:
        v = computed.get(id(t))
        if v is None or t.name in values:
            return None
        values[t.name] = v
    return values


def _same_dtype(a, b: np.dtype) -> bool:
    try:
        return np.dtype(a) == b
    except TypeError:
        return False


def _evaluate(nodes: list[gs.Node], wanted: list[gs.Tensor], opsets, ir_version: int) -> dict[str, np.ndarray]:
    """Run ``nodes`` in one onnxruntime session and return the values of ``wanted`` (float
    arithmetic alone: with numpy, see :func:`_evaluate_numpy`)."""
    values = _evaluate_numpy(nodes, wanted, opsets)
    if values is not None:
        return values
    consts: dict[str, gs.Constant] = {}
    for n in nodes:
        for t in n.inputs:
            if isinstance(t, gs.Constant):
                consts[t.name] = t
    node_protos = [OnnxExporter.export_node(n) for n in nodes]
    inits = []
    for c in consts.values():
        proto = constant_proto(c)  # (gs's own writes a loaded int4 weight unpacked)
        if model_io._is_on_disk(proto):  # onnxruntime refuses absolute external locations
            proto = model_io._read_on_disk(proto)
        inits.append(proto)
    outputs = []
    for t in wanted:
        elem = tensor_elem_type(t)
        outputs.append(
            onnx.helper.make_tensor_value_info(t.name, elem, None) if elem else onnx.helper.make_empty_tensor_value_info(t.name)
        )
    graph = onnx.helper.make_graph(node_protos, "fold", [], outputs, initializer=inits)
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    model.ir_version = max(ir_version, 4)
    from graphpass.check import verify as _verify  # onnxruntime's runner: imported on the first fold it does

    sess = _verify.session(model)
    return _verify.run(sess, {})


def _reads_only_constants(node: gs.Node, produced: set[int]) -> bool:
    """``node`` reads something, and only constants and tensors of ``produced`` (a loop, asked of
    every node every round: most fail at their first input)."""
    named = False
    for t in node.inputs:
        if t.name:
            if not (isinstance(t, gs.Constant) or id(t) in produced):
                return False
            named = True
    return named


@register
class FoldConstants(Pass):
    """Replaces everything computable from constants by its value.

    Cases:
      1. Constant nodes become initializers;
      2. Shape/Size of a tensor whose shape is static become constants (after
         ``specialize_shapes`` this collapses Shape -> Gather -> ... -> Reshape chains);
      3. pure default-domain nodes whose inputs are all constant are evaluated by onnxruntime;
      4. a boundary result replaces its subgraph only when the file does not grow (the folded
         bytes <= the bytes of the constants only that subgraph read + 64 per node removed;
         results sharing a node or a constant are decided together, then one by one); refused:
         ``would_grow``. With ``fold_growing`` a growing result up to ``size_limit`` bytes folds
         too (over it: ``too_large``);
      5. before onnxruntime runs, every output of the set is sized from its inputs' shapes and
         constant values (ConstantOfShape, Expand, Tile, Range, Reshape, Pad, Resize, OneHot
         from their shape operands): a node whose output cannot be sized, grows past the limit
         (an intermediate may reach 64x the limit or 8x its inputs), or would not fit in the memory budget
         (``max_memory``, see :mod:`graphpass.ir.limits`) is not evaluated, nor anything after it;
         a node whose shape operand is computed in the same batch waits for the next round;
      6. a result that would become an invalid shape operand (a Reshape dim below -1, a
         negative Expand/Tile dim: Cast of NaN to int64, a Range bound that is not a scalar) is
         not folded;
      7. a result read as an input onnxruntime prepacks when it is constant (LSTM/GRU weights W
         and R: other rounding than on the computed value) is folded to a constant read through
         an Identity, so the kernel still gets a computed value.
    Options (constructor arguments): ``size_limit`` (bytes), ``fold_growing``, ``max_iterations``,
    ``max_single_retries``.
    """

    name = "fold_constants"
    summary = "Evaluate constant subgraphs with onnxruntime (never grows the file unless fold_growing)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    def __init__(self, *, size_limit: int = DEFAULT_SIZE_LIMIT, fold_growing: bool = False, max_iterations: int = 32,
                 max_single_retries: int = 500):
        """Args:
            size_limit: with ``fold_growing``, the largest constant a fold that grows the file may
                store; it also bounds what onnxruntime may compute (Case 5).
            fold_growing: fold even when the file grows (a ConstantOfShape weight fill stored as
                the weight), up to ``size_limit`` per tensor; off by default.
            max_iterations: rounds of fold -> re-infer shapes -> fold within one application.
            max_single_retries: nodes retried one by one after a batch failed to evaluate.
        """
        self.size_limit = int(size_limit)
        self.fold_growing = bool(fold_growing)
        self.max_iterations = int(max_iterations)
        self.max_single_retries = int(max_single_retries)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        """Fold, and while folding made new Shape/Size inputs static, re-infer and fold again.

        onnx's data propagation stops at many exporter-written Shape -> Gather -> Concat chains,
        so each dynamic Reshape becomes static only after the chain before it is folded; the
        loop runs at most ``max_iterations`` (default 32) times and only while it progresses.
        """
        total: dict[str, int] = {}
        # bytes the saved model may still grow by (spent by the folds); None until a fold would
        # grow the file (computing it walks the whole model)
        room: list[int | None] = [None]
        candidates = [0]  # nodes that read only constants, seen by the sweeps
        for _ in range(self.max_iterations):
            result = self._fold_once(graph, ctx, room, candidates)
            for k, v in result.stats.items():
                total[k] = total.get(k, 0) + v
            if not result.modified:
                break
            deferred = result.stats.get("deferred", 0)
            if not _has_unresolved_shape(graph):
                if deferred:
                    continue  # Case 5: values this round computed now bound the deferred nodes
                break
            if not refresh_shapes(graph) and not deferred:
                break
        if total.get("folded") and count_unresolved(graph):
            refresh_shapes(graph)  # the last round's folds made shapes inferable that nobody re-inferred
        modified = any(total.get(k) for k in ("constant_nodes", "shapes", "folded", "removed"))
        # no node reads only constants: an edit that swaps a constant for an equal one leaves every
        # input as constant as it was, so none does after it either (the Constant nodes and
        # Shape/Size it left are not read through a constant's identity or readers)
        survives = frozenset({MERGE_EQUAL_CONSTANTS}) if not modified and not candidates[0] else frozenset()
        return PassResult(modified, total, survives=survives)

    def _fold_once(self, graph: gs.Graph, ctx: PassContext, room: list[int], candidates: list[int]) -> PassResult:
        limit = self.size_limit
        retries = self.max_single_retries
        opsets = [
            onnx.helper.make_opsetid(d, v)
            for d, v in model_io.model_info(graph).get("opset_import", [("", graph.opset)])
        ]
        ir_version = int(graph.ir_version or 8)
        names = None
        budget = model_io.budget(graph)
        stats = {"constant_nodes": 0, "shapes": 0, "folded": 0, "too_large": 0, "failed": 0, "removed": 0,
                 "invalid_shape": 0, "over_memory": 0, "would_grow": 0}
        for g in list(iter_graphs(graph)):
            outs = {id(t) for t in g.outputs}
            lowered = _lower_constant_nodes(g, outs)
            stats["constant_nodes"] += len(lowered)
            remove_nodes(g, lowered)

            # Case 2: Shape/Size from static shapes, computed here (no runtime needed).
            shape_nodes = []
            for node in [n for n in g.nodes if n.op in _SHAPE_OPS]:  # (the op first: one comprehension)
                if is_onnx_op(node) and node.inputs and len(node.outputs) == 1:
                    out = node.outputs[0]
                    if isinstance(out, gs.Constant) or id(out) in outs or not len(out.outputs):
                        continue
                    value = _shape_value(node)
                    if value is not None:
                        names = names or NameGen(graph)
                        node.outputs[0] = gs.Variable(names(out.name))
                        out.to_constant(value)
                        node.inputs.clear()
                        shape_nodes.append(node)
                        stats["shapes"] += 1
            remove_nodes(g, shape_nodes)

            # Case 3: the foldable set, in topological order.
            foldable: list[gs.Node] = []
            produced: set[int] = set()
            for node in g.nodes:
                if not node.outputs or not _reads_only_constants(node, produced) or not is_pure(node):
                    continue
                foldable.append(node)
                produced.update(id(t) for t in node.outputs)
            candidates[0] += len(foldable)
            if not foldable:
                stats["removed"] += self._sweep(g, [])
                continue
            # Case 5: every tensor of the session sized from its inputs before it runs.
            allowed, bounds = bound_nodes(foldable, limit, budget.room())
            for k, v in bounds.items():
                stats[k] = stats.get(k, 0) + v
            foldable = [n for n in foldable if id(n) in allowed]
            if not foldable:
                continue
            fold_ids = {id(n) for n in foldable}
            wanted: list[gs.Tensor] = []
            guarded: set[int] = set()  # Case 7: folded, but read through an Identity
            inserted: dict[int, gs.Node] = {}
            for node in foldable:
                for t in node.outputs:
                    if not t.name or id(t) in outs:
                        continue
                    if any(id(c) not in fold_ids for c in t.outputs):
                        if t.dtype is not None and _kind(t.dtype) in "OSU?":
                            continue  # strings, and ONNX-only types numpy cannot name (bfloat16 as 16)
                        if any(prepacked_operand(c, k) for c in t.outputs for k, x in enumerate(c.inputs) if x is t):
                            if node.op == "Identity" and isinstance(node.inputs[0], gs.Constant):
                                continue  # Case 7, done: the kernel reads the constant through an Identity
                            guarded.add(id(t))
                        wanted.append(t)
            # Case 4: the size policy, first on the sizes shapes give (unknown: decided after)
            memo = SizeMemo()  # (nothing changes the batch's nodes or constants until both decisions are made)
            wanted = self._size_policy(graph, wanted, foldable, {id(t): _nbytes_known(t) or 0 for t in wanted}, outs, stats,
                                       room, spend=False, memo=memo)
            if not wanted:
                continue
            needed = self._needed(wanted, fold_ids)
            nodes = [n for n in foldable if id(n) in needed]
            try:
                values = _evaluate(nodes, wanted, opsets, ir_version)
            except BadModelError as e:
                log.info("fold_constants: batch evaluation failed (%s); retrying node by node", e)
                values = self._one_by_one(nodes, wanted, opsets, ir_version, retries, stats)
            names = names or NameGen(graph)
            computed: list[gs.Tensor] = []
            for t in wanted:
                v = values.get(t.name)
                if v is None or not isinstance(v, np.ndarray) or v.dtype.kind in "OSU":
                    continue
                if not all(valid_shape_operand(c.op, k, v) for c in t.outputs if id(c) not in fold_ids
                           for k, x in enumerate(c.inputs) if x is t):
                    stats["invalid_shape"] += 1  # Case 6
                    log.warning("fold_constants: '%s' would become an invalid shape operand %s; left unfolded",
                                t.name, np.array2string(v.reshape(-1)[:8]))
                    continue
                computed.append(t)
            # Case 4 again on the computed sizes, over the tensors that can fold
            for t in self._size_policy(graph, computed, foldable, {id(t): int(values[t.name].nbytes) for t in computed},
                                       outs, stats, room, memo=memo):
                v = values[t.name]
                if not budget.fits(v.nbytes):
                    stats["over_memory"] += 1
                    continue
                budget.take(v.nbytes)
                prod = t.inputs[0]
                prod.outputs[prod.outputs.index(t)] = gs.Variable(names(t.name))
                if id(t) in guarded:  # Case 7: t stays a computed value, of the folded constant
                    value = gs.Constant(names(f"{t.name}_folded"), np.asarray(v, order="C"))
                    inserted[id(prod)] = gs.Node("Identity", name=names(f"{t.name}_computed"), inputs=[value],
                                                 outputs=[t])
                    stats["prepacked"] = stats.get("prepacked", 0) + 1
                else:
                    t.to_constant(np.asarray(v, order="C"))  # ascontiguousarray would make a 0-d value 1-d
                stats["folded"] += 1
            if inserted:
                g.nodes = [m for n in g.nodes for m in ((inserted[id(n)], n) if id(n) in inserted else (n,))]
            stats["removed"] += self._sweep(g, foldable)
        modified = any(stats[k] for k in ("constant_nodes", "shapes", "folded", "removed"))
        return PassResult(modified, stats)

    def _size_policy(self, graph: gs.Graph, wanted: list[gs.Tensor], foldable: list[gs.Node], sizes: dict[int, int],
                     outs: set[int], stats: dict[str, int], room: list[int | None], *,
                     spend: bool = True, memo: SizeMemo | None = None) -> list[gs.Tensor]:
        """Case 4: the tensors of ``wanted`` whose fold does not grow the file (see ``_fold_size``);
        ``room[0]`` (the model-wide room, computed when first needed) is lowered by what the folds
        chosen spend of it (with ``spend``)."""
        def resolve() -> int:
            if room[0] is None:
                room[0] = self._room(graph)
            return room[0]

        fold, grow, over, used = plan(wanted, foldable, sizes, outs, self.size_limit if self.fold_growing else None,
                                      room[0] if room[0] is not None else resolve, memo)
        if used and spend:
            room[0] = resolve() - used
        stats["would_grow"] += len(grow)
        stats["too_large"] += len(over)
        return fold

    def _room(self, graph: gs.Graph) -> int:
        """Bytes the model may grow by before it is bigger than it was loaded (0 when its source
        size is not known, e.g. a graph built in Python)."""
        if self.fold_growing:
            return 0
        model = model_of(graph, attach=False)
        source = model.meta.get(SOURCE_BYTES)
        return max(0, int(source) - bytes_bound(graph, model)) if source is not None else 0

    @staticmethod
    def _needed(wanted: list[gs.Tensor], fold_ids: set[int]) -> set[int]:
        needed: set[int] = set()
        stack = [t.inputs[0] for t in wanted if t.inputs]
        while stack:
            n = stack.pop()
            if id(n) in needed or id(n) not in fold_ids:
                continue
            needed.add(id(n))
            stack.extend(t.inputs[0] for t in n.inputs if len(t.inputs))
        return needed

    @staticmethod
    def _one_by_one(nodes, wanted, opsets, ir_version, retries, stats) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = {}
        known: dict[int, gs.Tensor] = {}
        wanted_ids = {id(t) for t in wanted}
        for n in nodes[:retries]:
            if not all((not t.name) or isinstance(t, gs.Constant) or id(t) in known for t in n.inputs):
                continue
            # Evaluate on fresh tensors only: gs disconnects by equality, and a probe wired to the
            # real tensors would unhook the real node (the mutated-model probe found this).
            tmp_inputs = []
            for t in n.inputs:
                if id(t) in known:
                    tmp_inputs.append(known[id(t)])
                elif isinstance(t, gs.Constant):
                    tmp_inputs.append(gs.Constant(t.name, t._values))
                else:
                    tmp_inputs.append(gs.Variable.empty())
            probe_outs = [gs.Variable(t.name, t.dtype) for t in n.outputs]
            probe = gs.Node(n.op, n.name, dict(n.attrs), tmp_inputs, probe_outs, n.domain)
            try:
                out = _evaluate([probe], [t for t in probe_outs if t.name], opsets, ir_version)
            except BadModelError as e:
                stats["failed"] += 1
                log.warning("fold_constants: cannot evaluate %s '%s': %s", n.op, n.name, e)
                continue
            finally:
                probe.inputs.clear()
                probe.outputs.clear()
            for t in n.outputs:
                if t.name in out and isinstance(out[t.name], np.ndarray):
                    known[id(t)] = gs.Constant(t.name, np.asarray(out[t.name]))
                    if id(t) in wanted_ids:
                        values[t.name] = out[t.name]
        return values

    @staticmethod
    def _sweep(g: gs.Graph, candidates: list[gs.Node]) -> int:
        """Remove folded nodes whose outputs nobody reads any more (reverse topological order)."""
        outs = {id(t) for t in g.outputs}
        dead = []
        for n in reversed(candidates):
            if all(not len(t.outputs) and id(t) not in outs for t in n.outputs):
                n.inputs.clear()
                dead.append(n)
        return remove_nodes(g, dead)
