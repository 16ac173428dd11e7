"""Exporter debug information dropped, like a compiler's output without ``-g``.

    node  metadata_props: namespace, pkg.torch.onnx.stack_trace, ...   =>  node without them
    tensor metadata_props: pkg.torch.export.graph_signature...          =>  tensor without them

torch's dynamo exporter writes, on every node, where it came from: the Python stack trace (with
the exporting machine's file paths), the module hierarchy, the FX node and name scopes; and on
tensors, torch.export's signature. That is most of a small model's file (192 of the 241 kB
of a small GPT-2), nothing after graphpass reads it (ATC, onnxruntime), and it stops being true
for the nodes graphpass fuses or folds. onnxsim, onnxslim, onnxruntime's optimizer and
Polygraphy drop it too (they drop every ``metadata_props``). This pass drops only the keys under
:data:`DEBUG_PREFIXES` and the node key ``namespace`` (both the torch exporters' and
onnxscript's); graphpass's own annotations and anybody else's keys stay.

Keep them with ``--disable strip_debug_info`` (``disable=["strip_debug_info"]`` in Python).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.ir.annotations import meta, stored_meta
from graphpass.ir.graph import iter_graphs
from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT

__all__ = ["StripDebugInfo", "DEBUG_PREFIXES", "is_debug_key"]

#: key prefixes of exporter provenance (torch.onnx's dynamo exporter, torch.export, onnxscript)
DEBUG_PREFIXES = ("pkg.torch.", "pkg.onnxscript.")
#: keys the dynamo exporter writes on nodes without a prefix
_DEBUG_NODE_KEYS = frozenset({"namespace"})


def is_debug_key(key: str, on_node: bool) -> bool:
    return key.startswith(DEBUG_PREFIXES) or (on_node and key in _DEBUG_NODE_KEYS)


def _strip(obj, on_node: bool) -> int:
    """Bytes of debug keys and values removed from ``obj``'s annotations."""
    d = stored_meta(obj)
    if not d:
        return 0
    dropped = [k for k in d if is_debug_key(k, on_node)]
    if dropped:
        d = meta(obj)  # the edit goes through annotations.meta, which the undo log records
    freed = 0
    for k in dropped:
        freed += len(k.encode()) + len(d.pop(k).encode())
    return freed


@register
class StripDebugInfo(Pass):
    """Drops exporter provenance from node and tensor ``metadata_props``.

    Cases:
      1. a node key under ``pkg.torch.`` / ``pkg.onnxscript.`` or ``namespace``: dropped;
      2. a tensor key under those prefixes (graph inputs, outputs, initializers, value_info): dropped;
      3. the same inside If/Loop/Scan bodies;
      4. every other key (graphpass's own annotations, a user's) stays; the model's own
         ``metadata_props`` stay.
    """

    name = "strip_debug_info"
    summary = "Drop exporter debug metadata (stack traces, module paths); --disable strip_debug_info keeps it."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    run_once = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        count = {"nodes": 0, "tensors": 0, "bytes": 0}
        seen: set[int] = set()

        def strip(obj, kind: str) -> None:
            freed = _strip(obj, kind == "nodes")
            if freed:
                count[kind] += 1
                count["bytes"] += freed

        for g in iter_graphs(graph):
            nodes = g.nodes
            # the annotated ones first, in comprehensions (most objects have no annotation dict:
            # a synthetic or torchscript model's none, a dynamo export's nodes all)
            for n in [n for n in nodes if stored_meta(n)]:
                strip(n, "nodes")
            tensors = [t for t in g.inputs if stored_meta(t)] + [t for t in g.outputs if stored_meta(t)]
            tensors += [t for n in nodes for t in n.inputs if stored_meta(t)]
            tensors += [t for n in nodes for t in n.outputs if stored_meta(t)]
            for t in tensors:
                if id(t) not in seen:
                    seen.add(id(t))
                    strip(t, "tensors")
        return PassResult(count["nodes"] + count["tensors"] > 0, count)
