"""Lowerings of ops Ascend cannot run well: those that make a graph compilable are required (the
cost model cannot veto them); issue 25's Ascend knowledges are scored (vetoed where they do not pay)."""

from graphpass.passes.lowering.lower_dynamic_topk import LowerDynamicTopK
from graphpass.passes.lowering.lower_extract_image_patches import LowerExtractImagePatches
from graphpass.passes.lowering.lower_reflect_pad import LowerReflectPad
from graphpass.passes.lowering.lower_conv1d_to_conv2d import LowerConv1dToConv2d
from graphpass.passes.lowering.split_avgpool import SplitAvgPool
from graphpass.passes.lowering.split_large_kernel_conv import SplitLargeKernelConv
from graphpass.passes.lowering.transpose_wide_conv import TransposeWideConv
from graphpass.passes.lowering.narrow_int64 import NarrowInt64
from graphpass.passes.lowering.split_qkv_matmul import SplitQkvMatMul
from graphpass.passes.lowering.resize_to_nearest import ResizeToNearest

__all__ = ["LowerDynamicTopK", "LowerExtractImagePatches", "LowerReflectPad", "LowerConv1dToConv2d", "SplitAvgPool",
           "SplitLargeKernelConv", "TransposeWideConv", "NarrowInt64", "SplitQkvMatMul", "ResizeToNearest"]
