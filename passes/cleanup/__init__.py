"""Hardware-neutral cleanup passes (each in its own module, registered on import)."""

from graphpass.passes.cleanup.eliminate_cast_pairs import EliminateCastPairs
from graphpass.passes.cleanup.eliminate_common_subexpressions import EliminateCommonSubexpressions
from graphpass.passes.cleanup.eliminate_dead_nodes import EliminateDeadNodes
from graphpass.passes.cleanup.eliminate_empty_slices import EliminateEmptySlices
from graphpass.passes.cleanup.merge_slices import MergeSlices
from graphpass.passes.cleanup.eliminate_identity import EliminateIdentity
from graphpass.passes.cleanup.fold_constants import FoldConstants
from graphpass.passes.cleanup.inline_control_flow import InlineControlFlow
from graphpass.passes.cleanup.merge_reshapes import MergeReshapes
from graphpass.passes.cleanup.merge_transposes import MergeTransposes
from graphpass.passes.cleanup.simplify_shapes import SimplifyShapes
from graphpass.passes.cleanup.specialize_shapes import SpecializeShapes
from graphpass.passes.cleanup.strip_debug_info import StripDebugInfo

__all__ = [
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
]
