"""Lowerings of ops Ascend cannot run well (required: the cost model cannot veto them)."""

from graphpass.passes.lowering.lower_dynamic_topk import LowerDynamicTopK
from graphpass.passes.lowering.lower_extract_image_patches import LowerExtractImagePatches

__all__ = ["LowerDynamicTopK", "LowerExtractImagePatches"]
