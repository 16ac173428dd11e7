"""What several cleanup passes need to know about ops."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.ir.graph import has_subgraph

__all__ = ["NONDETERMINISTIC_OPS", "is_onnx_op", "is_pure", "outputs_free", "local_producer"]

#: Ops whose result is not a function of their inputs: never folded, merged or hoisted.
NONDETERMINISTIC_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)


def is_onnx_op(node: gs.Node, *ops: str) -> bool:
    """True for a node of the default ONNX domain (optionally one of ``ops``)."""
    return (node.domain in (None, "", "ai.onnx")) and (not ops or node.op in ops)


def is_pure(node: gs.Node) -> bool:
    """A default-domain node without subgraphs whose outputs depend only on its inputs."""
    return (
        is_onnx_op(node)
        and node.op not in NONDETERMINISTIC_OPS
        and not node.op.startswith(("Sequence", "Optional"))
        and node.op not in ("SplitToSequence", "ConcatFromSequence")
        and not has_subgraph(node)
        and not any(isinstance(v, gs.Node.AttributeRef) for v in node.attrs.values())
    )


def outputs_free(node: gs.Node, graph: gs.Graph) -> bool:
    """True when no output of ``node`` is consumed or is an output of ``graph``."""
    outs = {id(t) for t in graph.outputs}
    return all(not len(t.outputs) and id(t) not in outs for t in node.outputs)


def local_producer(tensor: gs.Tensor, local: set[int], *ops: str) -> gs.Node | None:
    """The node of this graph (ids in ``local``) that produces ``tensor``, if it is one of ``ops``."""
    p = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if p is not None and id(p) in local and is_onnx_op(p, *ops):
        return p
    return None
