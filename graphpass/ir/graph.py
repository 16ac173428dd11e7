"""Graph helpers over onnx-graphsurgeon that every pass uses.

All helpers are linear in the size of the graph they are given; none rescans a graph per match.
Subgraphs (If/Loop/Scan bodies) refer to outer-scope tensors by the same gs Tensor objects as the
outer graph does, so a consumer list (``tensor.outputs``) includes nodes inside bodies.
"""

from __future__ import annotations

import collections
import sys
from typing import Iterable, Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.errors import BadModelError

__all__ = [
    "iter_graphs",
    "subgraph_holders",
    "may_have_subgraph",
    "CONTROL_FLOW_OPS",
    "SUBGRAPHLESS_DOMAINS",
    "subgraphs_of",
    "graph_attributes",
    "subgraph_pairs",
    "has_subgraph",
    "captured_tensors",
    "toposort",
    "remove_nodes",
    "replace_uses",
    "count_nodes",
    "op_histogram",
    "op_types",
    "fingerprint",
    "NameGen",
    "constant_array",
    "is_graph_output",
    "producer",
    "node_dependencies",
]


#: Default-domain ops that carry graph attributes. Custom-domain nodes are checked in full,
#: but for graphpass's own device ops (their domain is reserved at load: a model's own functions
#: in it are moved to another), which never carry one: a fused transformer holds thousands.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})
_NO_SUBGRAPHS = frozenset({None, "", "ai.onnx", "graphpass.ascend"})


def _may_have_subgraph(node: gs.Node) -> bool:
    return node.op in _CONTROL_FLOW or node.domain not in _NO_SUBGRAPHS


#: whether a node may hold a subgraph (its attributes are not looked at): a pass inlining
#: :func:`node_dependencies`' common case asks it
may_have_subgraph = _may_have_subgraph

#: ``may_have_subgraph(n)`` is ``n.op in CONTROL_FLOW_OPS or n.domain not in SUBGRAPHLESS_DOMAINS``
#: (for a loop over every node that spells it out instead of a call per node)
CONTROL_FLOW_OPS = _CONTROL_FLOW
SUBGRAPHLESS_DOMAINS = _NO_SUBGRAPHS


def subgraphs_of(node: gs.Node) -> list[gs.Graph]:
    """The subgraph attributes of ``node`` (If branches, Loop/Scan bodies), in attribute order."""
    if not _may_have_subgraph(node):
        return []
    return graph_attributes(node)


def graph_attributes(node: gs.Node) -> list[gs.Graph]:
    """Every gs.Graph in ``node``'s attributes (one, or in a list), in attribute order, whatever
    the op (:func:`subgraphs_of` looks only where a subgraph may be)."""
    subs: list[gs.Graph] = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            subs.append(value)
        elif isinstance(value, (list, tuple)):
            subs.extend(v for v in value if isinstance(v, gs.Graph))
    return subs


def subgraph_pairs(proto_node, node: gs.Node):
    """Pairs (GraphProto, gs.Graph) of a node's subgraph attributes, matched by attribute name.

    Used wherever a graph is walked beside its exported/imported proto (gs keeps node order).
    """
    if not has_subgraph(node):  # do not touch the proto attributes of the other 99.9% of nodes
        return
    import onnx

    for attr in proto_node.attribute:
        value = node.attrs.get(attr.name)
        if attr.type == onnx.AttributeProto.GRAPH and isinstance(value, gs.Graph):
            yield attr.g, value
        elif attr.type == onnx.AttributeProto.GRAPHS and isinstance(value, (list, tuple)):
            for g_proto, g in zip(attr.graphs, value):
                if isinstance(g, gs.Graph):
                    yield g_proto, g


def graph_protos(g):
    """``g`` (a GraphProto) and every graph nested in its nodes' attributes, depth first."""
    import onnx

    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from graph_protos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from graph_protos(sub)


def has_subgraph(node: gs.Node) -> bool:
    return _may_have_subgraph(node) and any(
        isinstance(v, gs.Graph)
        or (isinstance(v, (list, tuple)) and any(isinstance(x, gs.Graph) for x in v))
        for v in node.attrs.values()
    )


#: Graphs the pass manager found to hold no subgraph when the running application started (id ->
#: (graph, the count of gs.Graph objects made under an undo log then, ``journal.graphs_made``)):
#: while that count stands no body can have appeared in one, and :func:`iter_graphs` yields it
#: without walking its nodes (``journal.flat_graph`` registers a graph, only while a log records).
_FLAT: dict[int, tuple[gs.Graph, int]] = {}
_graphs_made = None  # graphpass.ir.journal.graphs_made (set there: that module imports this one)


def iter_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
    """``graph`` and every subgraph nested in it, outermost first."""
    if _FLAT:
        flat = _FLAT.get(id(graph))
        if flat is not None and flat[0] is graph and flat[1] == _graphs_made():
            yield graph
            return
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in subgraph_holders(g):
            if node.attrs:
                stack.extend(reversed(subgraphs_of(node)))


def subgraph_holders(graph: gs.Graph) -> list[gs.Node]:
    """The nodes of ``graph`` (not nested) that may hold a subgraph: control flow and custom
    domains (``_may_have_subgraph`` inlined in one comprehension: most passes start with this walk)."""
    cf, plain = _CONTROL_FLOW, _NO_SUBGRAPHS
    return [n for n in graph.nodes if n.op in cf or n.domain not in plain]


def captured_tensors(subgraph: gs.Graph) -> list[gs.Tensor]:
    """Outer-scope tensors that ``subgraph`` (or anything nested in it) reads, in first-use order."""
    defined: set[int] = {id(t) for t in subgraph.inputs}
    for node in subgraph.nodes:
        defined.update(id(t) for t in node.outputs)
    seen: set[int] = set()
    out: list[gs.Tensor] = []

    def use(t: gs.Tensor) -> None:
        if t.name and id(t) not in defined and id(t) not in seen and not isinstance(t, gs.Constant):
            seen.add(id(t))
            out.append(t)

    for node in subgraph.nodes:
        for t in node.inputs:
            use(t)
        for sub in subgraphs_of(node):
            for t in captured_tensors(sub):
                use(t)
    for t in subgraph.outputs:
        use(t)
    return out


def node_dependencies(node: gs.Node) -> list[gs.Tensor]:
    """Every tensor ``node`` reads: its inputs plus what its subgraphs capture from outside."""
    deps = [t for t in node.inputs if t.name]
    if not _may_have_subgraph(node):
        return deps
    for sub in subgraphs_of(node):
        deps.extend(captured_tensors(sub))
    return deps


def toposort(graph: gs.Graph, recurse: bool = True) -> None:
    """Sort ``graph.nodes`` topologically in place (Kahn, stable), and each subgraph if ``recurse``.

    Raises:
        BadModelError: the graph has a cycle; names one node on it.
    """
    nodes = graph.nodes
    # (a comprehension: ~2x a loop of stores; a tensor written twice keeps its last writer)
    producer_of: dict[int, int] = {id(t): i for i, n in enumerate(nodes) for t in n.outputs}
    holders = subgraph_holders(graph)  # subgraphs_of is empty for the other nodes
    if _is_sorted(nodes, producer_of, holders):
        if recurse:
            for n in holders:
                for sub in subgraphs_of(n):
                    toposort(sub, recurse=True)
        return
    indegree = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        preds = set()
        for t in node_dependencies(n):
            p = producer_of.get(id(t))
            if p is not None and p != i:
                preds.add(p)
            elif p == i:
                raise BadModelError(f"node '{n.name or n.op}' ({n.op}) reads its own output '{t.name}'")
        indegree[i] = len(preds)
        for p in preds:
            users[p].append(i)
    ready = collections.deque(i for i in range(len(nodes)) if indegree[i] == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i in range(len(nodes)) if indegree[i] > 0)
        raise BadModelError(
            f"graph '{graph.name}' has a cycle through node '{stuck.name or '?'}' ({stuck.op})"
        )
    graph.nodes = [nodes[i] for i in order]
    if recurse:
        for n in graph.nodes:
            for sub in subgraphs_of(n):
                toposort(sub, recurse=True)


def _is_sorted(nodes: list[gs.Node], producer_of: dict[int, int], holders: list[gs.Node]) -> bool:
    """Whether no node reads (directly, or from a subgraph when it is one of ``holders``) a tensor
    written at or after its own position. Asked after every pass that does not keep the order,
    and at load and save: the loop over plain nodes has no per-node test but its inputs'."""
    get = producer_of.get
    if holders:
        special = {id(n) for n in holders}
        for i, n in enumerate(nodes):
            for t in node_dependencies(n) if id(n) in special else n.inputs:
                if get(id(t), -1) >= i:
                    return False
        return True
    i = 0
    for n in nodes:
        for t in n.inputs:
            if get(id(t), -1) >= i:
                return False
        i += 1
    return True


def remove_nodes(graph: gs.Graph, dead: Iterable[gs.Node]) -> int:
    """Disconnect and drop ``dead`` from ``graph`` in one sweep. Returns how many were removed."""
    dead_ids = {id(n) for n in dead}
    if not dead_ids:
        return 0
    kept = []
    for n in graph.nodes:
        if id(n) in dead_ids:
            n.inputs.clear()
            n.outputs.clear()
        else:
            kept.append(n)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = kept
    return removed


def replace_uses(old: gs.Tensor, new: gs.Tensor, graph: gs.Graph | None = None) -> None:
    """Make every consumer of ``old`` (in any scope) read ``new``; also ``graph``'s outputs if given.

    Linear in the inputs of ``old``'s consumers: a consumer reading ``old`` k times is visited once.
    """
    replace_uses_many([(old, new)], graph)


def replace_uses_many(pairs: Iterable[tuple[gs.Tensor, gs.Tensor]], graph: gs.Graph | None = None) -> None:
    """:func:`replace_uses` for many (old, new) pairs in one sweep over their consumers.

    Replacing n inputs of one variadic node (a Sum of 100,000 constants) one call at a time
    walked its input list n times; this walks it once.
    """
    pairs = [(old, new) for old, new in pairs if old is not new]
    if not pairs:
        return
    if len(pairs) == 1 and graph is None:  # (one pair, as replace_uses gives: the same edits in the same order)
        old, new = pairs[0]
        readers = old.outputs
        if len(readers) == 1:
            consumers = [readers[0]]
        else:
            consumers = list({id(c): c for c in readers}.values())
        for consumer in consumers:
            inputs = consumer.inputs
            for i, t in enumerate(list(inputs)):
                if t is old:
                    inputs[i] = new
        return
    mapping = {id(old): new for old, new in pairs}
    consumers: dict[int, gs.Node] = {}
    for old, _ in pairs:
        for consumer in old.outputs:
            consumers.setdefault(id(consumer), consumer)
    for consumer in consumers.values():
        inputs = consumer.inputs
        for i, t in enumerate(list(inputs)):
            new = mapping.get(id(t))
            if new is not None:
                inputs[i] = new
    if graph is not None:
        graph.outputs = [mapping.get(id(t), t) for t in graph.outputs]


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    return any(t is tensor for t in graph.outputs)


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) else None


def count_nodes(graph: gs.Graph, recursive: bool = True) -> int:
    if not recursive:
        return len(graph.nodes)
    return sum(len(g.nodes) for g in iter_graphs(graph))


def op_types(graph: gs.Graph, graphs: "list[gs.Graph] | None" = None) -> frozenset[str]:
    """Every op type (without its domain) of ``graph``, its bodies and its local functions
    (``graphs``: those graphs, when the caller has listed them already)."""
    if graphs is None:
        graphs = [g for root in (graph, *(getattr(graph, "functions", None) or ())) for g in iter_graphs(root)]
    return frozenset(n.op for g in graphs for n in g.nodes)


def op_histogram(graph: gs.Graph, recursive: bool = True) -> collections.Counter:
    graphs = iter_graphs(graph) if recursive else [graph]
    c: collections.Counter = collections.Counter()
    for g in graphs:
        for n in g.nodes:
            c[n.op if not n.domain or n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op}"] += 1
    return c


def fingerprint(graph: gs.Graph) -> str:
    """A cheap structural fingerprint: node identities, ops, wiring and graph I/O, recursively.

    Attribute values are not hashed (too costly on big graphs); a pass that changes only
    attributes is trusted when it says so. Node order does not count.
    """
    # Node order is not semantic (any topological order computes the same), so node hashes are
    # summed, not chained. Python's tuple hash is enough to catch a pass that misreports.
    total = 0
    count = 0
    for g in iter_graphs(graph):
        total += hash((id(g), tuple(map(id, g.inputs)), tuple(map(id, g.outputs))))
        for n in g.nodes:
            total += hash((id(g), id(n), n.op, tuple(map(id, n.inputs)), tuple(map(id, n.outputs))))
            count += 1
    return f"{count}:{total & 0xFFFFFFFFFFFFFFFF:016x}"


class NameGen:
    """Unique tensor/node names for one graph (and everything nested in it)."""

    def __init__(self, graph: gs.Graph):
        used: set[str] = set()
        for g in iter_graphs(graph):  # (comprehensions: ~3x faster than a set.add per name)
            nodes = g.nodes
            used.update([t.name for t in g.inputs])
            used.update([n.name for n in nodes])
            used.update([t.name for n in nodes for t in n.inputs])
            used.update([t.name for n in nodes for t in n.outputs])
        self._used = used
        self._counters: dict[str, int] = collections.defaultdict(int)

    def __call__(self, prefix: str) -> str:
        while True:
            self._counters[prefix] += 1
            name = f"{prefix}__gp{self._counters[prefix]}"
            if name not in self._used:
                self._used.add(name)
                return name


#: TensorProto element types whose raw bytes are a numpy array as they are (little-endian)
_RAW_DTYPES = {
    onnx.TensorProto.FLOAT: np.dtype(np.float32), onnx.TensorProto.DOUBLE: np.dtype(np.float64),
    onnx.TensorProto.FLOAT16: np.dtype(np.float16), onnx.TensorProto.INT64: np.dtype(np.int64),
    onnx.TensorProto.INT32: np.dtype(np.int32), onnx.TensorProto.INT16: np.dtype(np.int16),
    onnx.TensorProto.INT8: np.dtype(np.int8), onnx.TensorProto.UINT64: np.dtype(np.uint64),
    onnx.TensorProto.UINT32: np.dtype(np.uint32), onnx.TensorProto.UINT16: np.dtype(np.uint16),
    onnx.TensorProto.UINT8: np.dtype(np.uint8), onnx.TensorProto.BOOL: np.dtype(np.bool_),
} if sys.byteorder == "little" else {}


def _raw_view(lazy: gs.ir.tensor.LazyValues) -> np.ndarray | None:
    """gs's own LazyValues of a common type held as raw bytes in memory, as a read-only array
    over those bytes (None for anything else)."""
    if type(lazy) is gs.ir.tensor.LazyValues:
        tp = lazy.tensor
        dtype = _RAW_DTYPES.get(tp.data_type)
        if dtype is not None and tp.data_location != onnx.TensorProto.EXTERNAL and tp.HasField("raw_data"):
            return np.frombuffer(tp.raw_data, dtype=dtype).reshape(tuple(tp.dims))
    return None


def load_lazy(lazy: gs.ir.tensor.LazyValues) -> np.ndarray:
    """``lazy.load()``: the same (writable) array; for gs's own LazyValues of a common type held
    as raw bytes in memory, decoded directly (``onnx.numpy_helper.to_array`` spends ~20 us a call
    on dtype tables and checks; fold_batchnorm reads six small tensors per fold)."""
    view = _raw_view(lazy)
    return view.copy() if view is not None else lazy.load()


def peek_values(tensor: gs.Constant) -> np.ndarray:
    """A Constant's values without caching them in the tensor (gs's ``values`` keeps a weight
    read from disk in memory for as long as the tensor lives, even after a rewrite drops it)."""
    v = tensor._values
    return load_lazy(v) if isinstance(v, gs.ir.tensor.LazyValues) else v


def read_values(tensor: gs.Constant) -> np.ndarray:
    """:func:`peek_values` for a reader that never writes into the array: a weight held as raw
    bytes is a read-only view of them (no copy; a caller converting it, e.g. to float64, copies once)."""
    v = tensor._values
    if isinstance(v, gs.ir.tensor.LazyValues):
        view = _raw_view(v)
        return view if view is not None else v.load()
    return v


def constant_array(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of a gs Constant as a numpy array, or None for a Variable."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    return None
