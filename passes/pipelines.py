"""The pipelines graphpass runs, assembled in one place (like onnxscript's default rule set).

A pipeline is an ordered tuple of pass names; the pass manager repeats it to a fixed point.
"""

from __future__ import annotations

from graphpass.errors import UsageError
from graphpass.passes.framework.registry import all_passes

__all__ = ["PIPELINES", "DEFAULT_PIPELINE", "get_pipeline", "build"]

#: Hardware-neutral cleanup, in the order each pass feeds the next.
CLEANUP = (
    "specialize_shapes",
    "fold_constants",
    "eliminate_identity",
    "merge_transposes",
    "merge_reshapes",
    "eliminate_cast_pairs",
    "eliminate_common_subexpressions",
    "hoist_loop_invariants",
    "eliminate_dead_nodes",
)

#: Lowerings first: they make the graph compilable, and fusions may then apply to their output.
LOWERING = (
    "lower_dynamic_topk",
    "lower_extract_image_patches",
)

#: Fusions, after cleanup has exposed them (BN before bias: a folded BN leaves a Conv bias).
FUSION = (
    "fold_pad",
    "merge_concats",
    "fold_batchnorm",
    "fuse_conv_scale",
    "fuse_conv_bias",
    "fuse_conv_activation",
    "fuse_matmul_add",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_channel_shuffle",
    "fuse_gather_split",
)

#: Layout after fusion (formats are chosen for the ops that will actually run).
LAYOUT = (
    "propagate_layout",
    "eliminate_transdata",
)

#: Placement last: engines and sinking depend on what the graph has become.
PLACEMENT = (
    "place_and_sink",
)

#: Hardware-neutral: cleanup plus the fusions whose result is standard ONNX any runtime runs
#: (no device op, no Ascend cost decision). What benchmarks/peers.py compares with onnxsim & co.
NEUTRAL = CLEANUP + ("fold_pad", "merge_concats", "fold_batchnorm", "fuse_conv_scale", "fuse_conv_bias",
                     "fuse_matmul_add")

PIPELINES: dict[str, tuple[str, ...]] = {
    "cleanup": CLEANUP,
    "neutral": NEUTRAL,
    "lowering": LOWERING,
    "fusion": FUSION,
    "layout": LAYOUT,
    "placement": PLACEMENT,
    "default": CLEANUP + LOWERING + FUSION + LAYOUT + PLACEMENT,
    # mixed_precision is default-off: --mixed-precision MODE (or --enable) switches it on
}

DEFAULT_PIPELINE = "default"


def get_pipeline(name: str) -> tuple[str, ...]:
    try:
        return PIPELINES[name]
    except KeyError:
        raise UsageError(f"unknown pipeline '{name}'; known pipelines: {', '.join(PIPELINES)}") from None


def build(
    pipeline: str | None = None,
    passes: list[str] | None = None,
    disable: set[str] | None = None,
    enable: set[str] | None = None,
) -> list[str]:
    """The list of pass names to run.

    ``passes`` (an explicit list) wins over ``pipeline``; default-off passes in a pipeline run
    only when named in ``enable``; ``enable`` also appends passes the pipeline lacks. Every name
    is checked: an unknown one raises UsageError listing the known passes. Names in ``disable``
    are checked but kept in the list; the pass manager skips them and reports them as disabled.
    """
    known = all_passes()
    for name in list(passes or []) + sorted(disable or ()) + sorted(enable or ()):
        if name not in known:
            raise UsageError(f"unknown pass '{name}'; known passes: {', '.join(known)}")
    enable = set(enable or ())
    if passes:
        names = list(passes)
    else:
        names = [n for n in get_pipeline(pipeline or DEFAULT_PIPELINE) if known[n].default_enabled or n in enable]
        names += [n for n in sorted(enable) if n not in names]
    return names  # disabled passes stay in the list: the pass manager skips and reports them
