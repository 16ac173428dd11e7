"""Lowerings of ops Ascend cannot run well (required: the cost model cannot veto them)."""

from graphpass.passes.lowering.lower_dynamic_topk import LowerDynamicTopK
from graphpass.passes.lowering.lower_extract_image_patches import LowerExtractImagePatches
from graphpass.passes.lowering.lower_reflect_pad import LowerReflectPad

__all__ = ["LowerDynamicTopK", "LowerExtractImagePatches", "LowerReflectPad"]
