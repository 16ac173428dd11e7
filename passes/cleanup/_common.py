"""What several cleanup passes need to know about ops."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.ir.graph import has_subgraph

__all__ = ["NONDETERMINISTIC_OPS", "is_onnx_op", "is_pure", "prepacked_operand"]

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


#: Inputs onnxruntime's CPU kernels prepack when they are initializers and then compute with other
#: rounding than on the same values computed at run time (measured with onnxruntime 1.2x, ~1e-8:
#: LSTM's and GRU's weights W and recurrence weights R, depending on the sizes; B, RNN, Conv,
#: Gemm and MatMul came out bit for bit). A rewrite that turns such an input into a constant is
#: not exact.
_PREPACKED = {"LSTM": frozenset({1, 2}), "GRU": frozenset({1, 2})}


def prepacked_operand(node: gs.Node, index: int) -> bool:
    """Whether input ``index`` of ``node`` computes differently when it is a constant."""
    return index in _PREPACKED.get(node.op, ()) and is_onnx_op(node)


def is_onnx_op(node: gs.Node, *ops: str) -> bool:
    """True for a node of the default ONNX domain (optionally one of ``ops``)."""
    return (node.domain in (None, "", "ai.onnx")) and (not ops or node.op in ops)


def is_pure(node: gs.Node) -> bool:
    """A default-domain node without subgraphs whose outputs depend only on its inputs."""
    op = node.op
    if (node.domain not in (None, "", "ai.onnx") or op in NONDETERMINISTIC_OPS
            or op.startswith(("Sequence", "Optional")) or op in ("SplitToSequence", "ConcatFromSequence")):
        return False
    attrs = node.attrs
    if not attrs:  # asked per node by every cleanup sweep: most nodes stop here
        return True
    if has_subgraph(node):
        return False
    ref = gs.Node.AttributeRef
    for v in attrs.values():  # a loop, not a generator: every node with attributes, every sweep
        if isinstance(v, ref):
            return False
    return True
