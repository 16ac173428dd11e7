"""graphpass.passes: every built-in pass, also callable as a plain function of the same name.

    from graphpass.passes import FoldConstants, fold_constants
    FoldConstants(size_limit=4 << 20)(model)   # -> PassResult(modified, stats, model)
    fold_constants(model, size_limit=4 << 20)  # the same; the signature is the pass's own:
                                               # (model, ctx=None, *, size_limit=..., ...)

Users' own rewrites: :class:`Rule`, :class:`RuleSet` and :func:`rule_pass` (the pass class they
build, ``RulePass``, lives in :mod:`graphpass.passes.framework.rewrite`: every class exported here is a pass).
"""

from graphpass.passes.cleanup import (
    EliminateCastPairs,
    EliminateCommonSubexpressions,
    EliminateDeadNodes,
    EliminateEmptySlices,
    MergeSlices,
    EliminateIdentity,
    FoldConstants,
    InlineControlFlow,
    MergeReshapes,
    MergeTransposes,
    SimplifyShapes,
    SpecializeShapes,
    StripDebugInfo,
)
from graphpass.passes.placement import HoistLoopInvariants, PlaceAndSink
from graphpass.passes.layout import EliminateTransData, PropagateLayout
from graphpass.passes.lowering import LowerDynamicTopK, LowerExtractImagePatches
from graphpass.passes.lowering import LowerConv1dToConv2d, LowerReflectPad, SplitAvgPool, SplitLargeKernelConv, TransposeWideConv
from graphpass.passes.lowering import NarrowInt64
from graphpass.passes.lowering import ResizeToNearest, SplitQkvMatMul
from graphpass.passes.fusion import FoldTransposedBatchNorm
from graphpass.passes.precision import MixedPrecision
from graphpass.passes.framework.rewrite import Match, MatchResult, Rule, RuleSet, rule, rule_pass
from graphpass.passes.fusion import FoldBatchNorm, FoldPad, MergeConcats, FuseChannelShuffle, FuseConvActivation, FuseConvBias, FuseConvScale, FuseGatherSplit, FuseGelu, FuseLayerNorm, FuseMatMulAdd
from graphpass.passes.fusion import GatherToSplit

eliminate_cast_pairs = EliminateCastPairs.as_function()
eliminate_common_subexpressions = EliminateCommonSubexpressions.as_function()
eliminate_dead_nodes = EliminateDeadNodes.as_function()
eliminate_empty_slices = EliminateEmptySlices.as_function()
merge_slices = MergeSlices.as_function()
eliminate_identity = EliminateIdentity.as_function()
fold_constants = FoldConstants.as_function()
inline_control_flow = InlineControlFlow.as_function()
merge_reshapes = MergeReshapes.as_function()
merge_transposes = MergeTransposes.as_function()
simplify_shapes = SimplifyShapes.as_function()
specialize_shapes = SpecializeShapes.as_function()
strip_debug_info = StripDebugInfo.as_function()
fold_batchnorm = FoldBatchNorm.as_function()
mixed_precision = MixedPrecision.as_function()
lower_extract_image_patches = LowerExtractImagePatches.as_function()
lower_dynamic_topk = LowerDynamicTopK.as_function()
hoist_loop_invariants = HoistLoopInvariants.as_function()
place_and_sink = PlaceAndSink.as_function()
fold_pad = FoldPad.as_function()
merge_concats = MergeConcats.as_function()
fuse_channel_shuffle = FuseChannelShuffle.as_function()
fuse_conv_activation = FuseConvActivation.as_function()
fuse_conv_bias = FuseConvBias.as_function()
fuse_conv_scale = FuseConvScale.as_function()
fuse_gather_split = FuseGatherSplit.as_function()
gather_to_split = GatherToSplit.as_function()
fuse_gelu = FuseGelu.as_function()
fuse_layer_norm = FuseLayerNorm.as_function()
from graphpass.passes.fusion import FuseAttention, FuseRmsNorm, FuseRotaryEmbedding, FuseSwiGlu  # noqa: E402  (issue 26)
fuse_rms_norm = FuseRmsNorm.as_function()
fuse_rotary_embedding = FuseRotaryEmbedding.as_function()
fuse_swiglu = FuseSwiGlu.as_function()
fuse_attention = FuseAttention.as_function()
fuse_matmul_add = FuseMatMulAdd.as_function()
propagate_layout = PropagateLayout.as_function()
eliminate_transdata = EliminateTransData.as_function()
# issue 25, Ascend knowledges (conv/pool)
lower_reflect_pad = LowerReflectPad.as_function()
lower_conv1d_to_conv2d = LowerConv1dToConv2d.as_function()
split_avgpool = SplitAvgPool.as_function()
split_large_kernel_conv = SplitLargeKernelConv.as_function()
transpose_wide_conv = TransposeWideConv.as_function()
narrow_int64 = NarrowInt64.as_function()  # issue 25, int64 to int32
fold_transposed_batchnorm = FoldTransposedBatchNorm.as_function()
split_qkv_matmul = SplitQkvMatMul.as_function()  # issue 25, transformer projections
resize_to_nearest = ResizeToNearest.as_function()  # issue 25, opt-in approximation

__all__ = [
    "FuseConvScale",
    "fuse_conv_scale",
    "PropagateLayout",
    "propagate_layout",
    "EliminateTransData",
    "eliminate_transdata",
    "EliminateCastPairs",
    "EliminateCommonSubexpressions",
    "EliminateDeadNodes",
    "EliminateEmptySlices",
    "MergeSlices",
    "EliminateIdentity",
    "FoldConstants",
    "InlineControlFlow",
    "MergeReshapes",
    "MergeTransposes",
    "SimplifyShapes",
    "SpecializeShapes",
    "StripDebugInfo",
    "FoldBatchNorm",
    "MixedPrecision",
    "LowerExtractImagePatches",
    "LowerDynamicTopK",
    "HoistLoopInvariants",
    "PlaceAndSink",
    "FoldPad",
    "MergeConcats",
    "FuseChannelShuffle",
    "FuseConvActivation",
    "FuseConvBias",
    "FuseGatherSplit",
    "GatherToSplit",
    "FuseGelu",
    "FuseLayerNorm",
    "FuseMatMulAdd",
    "eliminate_cast_pairs",
    "eliminate_common_subexpressions",
    "eliminate_dead_nodes",
    "eliminate_empty_slices",
    "merge_slices",
    "eliminate_identity",
    "fold_constants",
    "inline_control_flow",
    "merge_reshapes",
    "merge_transposes",
    "simplify_shapes",
    "specialize_shapes",
    "strip_debug_info",
    "fold_batchnorm",
    "mixed_precision",
    "lower_extract_image_patches",
    "lower_dynamic_topk",
    "hoist_loop_invariants",
    "place_and_sink",
    "fold_pad",
    "merge_concats",
    "fuse_channel_shuffle",
    "fuse_conv_activation",
    "fuse_conv_bias",
    "fuse_gather_split",
    "gather_to_split",
    "fuse_gelu",
    "fuse_layer_norm",
    "FuseRmsNorm",
    "fuse_rms_norm",
    "FuseRotaryEmbedding",
    "fuse_rotary_embedding",
    "FuseSwiGlu",
    "FuseAttention",
    "fuse_swiglu",
    "fuse_attention",
    "fuse_matmul_add",
    # issue 25, Ascend knowledges (conv/pool)
    "LowerReflectPad", "lower_reflect_pad", "LowerConv1dToConv2d", "lower_conv1d_to_conv2d", "SplitAvgPool",
    "split_avgpool", "SplitLargeKernelConv", "split_large_kernel_conv", "TransposeWideConv", "transpose_wide_conv",
    "NarrowInt64", "narrow_int64",
    "FoldTransposedBatchNorm", "fold_transposed_batchnorm", "SplitQkvMatMul", "split_qkv_matmul",
    "ResizeToNearest", "resize_to_nearest",
    # the rewrite API: users' rules and rule passes (README: "Writing your own rewrite rule")
    "Match",
    "MatchResult",
    "Rule",
    "RuleSet",
    "rule",
    "rule_pass",
]
