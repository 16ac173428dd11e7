"""What several cleanup passes need to know about ops."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.ir.graph import has_subgraph

__all__ = ["NONDETERMINISTIC_OPS", "is_onnx_op", "is_pure"]

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
