"""Helpers the layout passes share: creating and removing TransData nodes."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.ir import annotations as A
from graphpass.ir import model_io
from graphpass.ir.device_ops import DOMAIN, ensure_function, is_transdata, transdata_function
from graphpass.ir.graph import NameGen, is_graph_output, producer, replace_uses

__all__ = ["make_transdata", "bypass_transdata", "is_transdata"]


def make_transdata(graph: gs.Graph, names: NameGen, src: gs.Tensor, src_fmt: str, dst_fmt: str,
                   pass_name: str, reason: str, out: gs.Tensor | None = None) -> gs.Node:
    """A ``graphpass.ascend::TransData`` from ``src`` (in ``src_fmt``) to a new tensor (or ``out``)."""
    if not any(f.domain == DOMAIN and f.name == "TransData" for f in graph.functions):  # built once, not per node
        ensure_function(graph, transdata_function(model_io.opset_of(graph) or graph.opset or 13))
    if out is None:
        out = gs.Variable(names(f"{src.name}_{dst_fmt}"), dtype=src.dtype, shape=src.shape)
    node = gs.Node("TransData", name=names(f"TransData_{dst_fmt}"), domain=DOMAIN,
                   attrs={"src_format": src_fmt, "dst_format": dst_fmt}, inputs=[src], outputs=[out])
    A.set_format(out, dst_fmt)
    A.mark_created(node, pass_name)
    A.set(node, A.REASON, reason)
    graph.nodes.append(node)
    return node


def bypass_transdata(graph: gs.Graph, node: gs.Node) -> bool:
    """Disconnect ``node`` (a TransData of ``graph``): its readers read its input instead. The
    caller drops the disconnected node from ``graph.nodes`` (in one batch: removing nodes one
    by one from the list would be quadratic).

    When its output is a graph output, the input's producer writes that output directly (the
    output keeps its name). Returns False, leaving the node, when that is impossible (the input
    is itself a graph input or output, or has no producer).
    """
    x, y = node.inputs[0], node.outputs[0]
    if not is_graph_output(y, graph):
        replace_uses(y, x)
        node.inputs.clear()
        node.outputs.clear()
        return True
    p = producer(x)
    if p is None or is_graph_output(x, graph) or any(t is x for t in graph.inputs):
        return False
    node.inputs.clear()
    node.outputs.clear()
    j = next(i for i, t in enumerate(p.outputs) if t is x)
    p.outputs[j] = y
    replace_uses(x, y)
    return True
