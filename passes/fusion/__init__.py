"""Switchable fusions (each registered with its ATC/FE counterpart name where one exists)."""

from graphpass.passes.fusion.fold_batchnorm import FoldBatchNorm
from graphpass.passes.fusion.fuse_attention import FuseAttention
from graphpass.passes.fusion.fold_pad import FoldPad
from graphpass.passes.fusion.fold_transposed_batchnorm import FoldTransposedBatchNorm
from graphpass.passes.fusion.fuse_channel_shuffle import FuseChannelShuffle
from graphpass.passes.fusion.fuse_conv_activation import FuseConvActivation
from graphpass.passes.fusion.fuse_conv_bias import FuseConvBias
from graphpass.passes.fusion.fuse_conv_scale import FuseConvScale
from graphpass.passes.fusion.fuse_gather_split import FuseGatherSplit
from graphpass.passes.fusion.fuse_gelu import FuseGelu
from graphpass.passes.fusion.fuse_layer_norm import FuseLayerNorm
from graphpass.passes.fusion.fuse_matmul_add import FuseMatMulAdd
from graphpass.passes.fusion.fuse_rms_norm import FuseRmsNorm
from graphpass.passes.fusion.fuse_rotary_embedding import FuseRotaryEmbedding
from graphpass.passes.fusion.fuse_swiglu import FuseSwiGlu
from graphpass.passes.fusion.gather_to_split import GatherToSplit
from graphpass.passes.fusion.merge_concats import MergeConcats

__all__ = ["FoldBatchNorm", "FoldTransposedBatchNorm", "FoldPad", "MergeConcats", "FuseChannelShuffle", "FuseConvActivation",
           "FuseConvBias", "FuseConvScale", "FuseGatherSplit", "FuseGelu", "FuseLayerNorm", "FuseMatMulAdd", "FuseRmsNorm",
           "FuseRotaryEmbedding", "FuseSwiGlu", "FuseAttention", "GatherToSplit"]
