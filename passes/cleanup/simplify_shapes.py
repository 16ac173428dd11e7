"""Partial-shape evaluation: shape arithmetic folded where the dims it reads are known.

    Shape(x)[...] -> Gather/Slice/Concat/Unsqueeze/Squeeze/Cast/Add/Sub/Mul/Div -> v
        every element of v known                                    =>  constant v
    Reshape(x, t), t partly known                                    =>  Reshape(x, constant t')
        t' keeps the known entries, writes 0 ("copy") for an entry that is dim i of x itself at
        position i (under allowzero=1 too, by writing allowzero=0, when t holds no literal 0),
        and -1 for the one entry left unknown when the product of the other entries is known
        and nonzero (so the -1 can only stand for that entry's value)
    Reshape(x, t) with t equal to x's own shape                      =>  x
    Expand(x, t) with broadcast(shape(x), t) == shape(x)             =>  x
    Tile(x, r) with r all ones                                       =>  x
    Slice(x, ...) taking every element                               =>  x

Each int64/int32 scalar or vector of at most ``_shape_values.MAX_ELEMS`` elements is evaluated
symbolically in one walk over the graph (and every If/Loop/Scan body, outer-scope values
visible): each element is a known int, "dim i of tensor t" (a symbolic dim, equal only to
itself), or unknown. A tensor's dims are followed back through the ops that keep or compute them
(elementwise and broadcasting ops, Transpose, Reshape, Slice, Concat, Split, Gather, MatMul,
Conv/pool windows), in graph order so no recursion runs deep; the ints proven where a tensor's
shape says symbolic or nothing are written into its shape for the passes after this one. Two symbolic dims with the
same ``dim_param`` name are not assumed equal unless ``trust_dim_params`` says so.

Exactness (for every input on which the original model runs): a folded element is the value the
original computes; Div is folded only for non-negative operands and a nonzero divisor (onnxruntime
truncates, ONNX does not say); a symbolic dim survives a Cast only to int64; a Reshape target gets
a -1 only where the other entries' product is a known nonzero number (onnxruntime refuses to infer
a -1 next to a 0 product, so an unknown 0 there would turn a run into an error or a wrong shape).

Where it lives: the symbolic values in ``_shape_values`` (``Vec``, ``Dim``, ``Product``); the
per-op value rules in ``_shape_eval``; the walk and the dims analysis in ``_shape_analysis``
(``ShapeAnalysis``); the rewrites in ``_shape_rules``; this module holds the pass.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphpass.passes.cleanup._shape_analysis import ShapeAnalysis
from graphpass.passes.cleanup._shape_rules import ExpandNoop, Fold, ReshapeNoop, ReshapeTarget, SliceNoop, TileNoop
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, MERGE_EQUAL_CONSTANTS
from graphpass.passes.framework.rewrite import RulePass, apply_rules

__all__ = ["SimplifyShapes"]


@register
class SimplifyShapes(RulePass):
    """Evaluates shape arithmetic symbolically and folds what it finds.

    Cases:
      1. an int shape value (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze, Cast, Identity,
         Add, Sub, Mul, Div) whose elements are all known, even though the tensor it measures
         has symbolic dims, becomes a constant;
      2. a computed Reshape target that is partly known becomes a constant: 0 for an entry that
         is the input's own dim at that position, -1 for the one entry left unknown;
      3. a Reshape to the shape its input already has is removed;
      4. an Expand whose target broadcasts to the input's own shape is removed;
      5. a Tile whose repeats are all ones is removed;
      6. a Slice that takes every element is removed.
    """

    name = "simplify_shapes"
    summary = "Fold Shape arithmetic whose used dims are known; constant Reshape targets; drop no-op Reshape/Expand/Tile."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    runs_after = ("fold_constants",)
    runs_before = ("merge_reshapes",)

    def __init__(self, *, trust_dim_params: bool = False):
        """Args:
            trust_dim_params: take two dims with the same ``dim_param`` name as equal (what the
                ONNX IR intends and torch's dynamo exporter guarantees), so a Reshape target
                built from one input's dims may copy another's. Off by default: onnxruntime
                does not check it, and a pass promising EXACT must hold for every input it runs.
        """
        self.trust_dim_params = bool(trust_dim_params)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        analysis = ShapeAnalysis(graph, self.trust_dim_params)
        rules = (Fold(analysis), ReshapeNoop(analysis), ReshapeTarget(analysis), ExpandNoop(analysis),
                 TileNoop(analysis), SliceNoop(analysis))
        counts = apply_rules(graph, rules, ctx, self.name)
        stats = {k: counts.total(k) for k in ("folded", "reshape_targets", "noop_removed")}
        stats["refused"] = counts.total("refused")
        stats["dims_resolved"] = analysis.refined
        stats["rules"] = counts
        # nothing matched and no dim was proven: the analysis reads a constant by its values and
        # shape only, so after equal constants are merged it finds the same (nothing)
        quiet = not counts.total("matched") and not analysis.refined
        return PassResult(counts.total("rewritten") > 0, stats,
                          survives=frozenset({MERGE_EQUAL_CONSTANTS}) if quiet else frozenset())
