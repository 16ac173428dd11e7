"""The pipelines graphpass runs, assembled in one place (like onnxscript's default rule set).

A pipeline is an ordered tuple of pass names; the pass manager repeats it to a fixed point.
The order a pass needs is declared on the pass (``Pass.runs_after`` / ``Pass.runs_before``:
pass names or whole kinds) and :func:`build` checks every list it returns against it.
"""

from __future__ import annotations

from graphpass.errors import UsageError
from graphpass.passes.framework.pass_base import Pass, PassKind
from graphpass.passes.framework.registry import all_passes

__all__ = ["PIPELINES", "DEFAULT_PIPELINE", "get_pipeline", "build", "check_order"]

#: Hardware-neutral cleanup, in the order each pass feeds the next.
CLEANUP = (
    "strip_debug_info",
    "specialize_shapes",
    "fold_constants",
    "inline_control_flow",
    "simplify_shapes",
    "eliminate_identity",
    "merge_transposes",
    "merge_reshapes",
    "merge_slices",
    "eliminate_empty_slices",
    "eliminate_cast_pairs",
    "eliminate_common_subexpressions",
    "hoist_loop_invariants",
    "eliminate_dead_nodes",
)

#: Lowerings before fusions (declared: ``runs_before = (PassKind.FUSION,)`` on each lowering).
LOWERING = (
    "lower_dynamic_topk",
    "lower_extract_image_patches",
    "lower_reflect_pad",
    "lower_conv1d_to_conv2d",
    "split_avgpool",
    "split_large_kernel_conv",
    "transpose_wide_conv",
    "narrow_int64",
    "split_qkv_matmul",
)

#: Fusions, after cleanup has exposed them (fuse_conv_bias declares ``runs_after = ("fold_batchnorm",)``).
FUSION = (
    "fold_pad",
    "merge_concats",
    "fold_batchnorm",
    "fold_transposed_batchnorm",
    "fuse_conv_scale",
    "fuse_conv_bias",
    "fuse_conv_activation",
    "fuse_matmul_add",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_rms_norm",
    "fuse_rotary_embedding",
    "fuse_swiglu",
    "fuse_attention",
    "fuse_channel_shuffle",
    "fuse_gather_split",
    "gather_to_split",
)

#: Layout after lowering and fusion (declared on propagate_layout; eliminate_transdata runs after it).
LAYOUT = (
    "propagate_layout",
    "eliminate_transdata",
)

#: Placement last (declared on place_and_sink: after lowering, fusion and layout).
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
    # mixed_precision is default-off: --mixed-precision MODE (or --enable) switches it on;
    # resize_to_nearest (an approximation) too: --enable resize_to_nearest, placed before the fusions
}

DEFAULT_PIPELINE = "default"


def get_pipeline(name: str) -> tuple[str, ...]:
    try:
        return PIPELINES[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(PIPELINES), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown pipeline '{name}'; {hint}known pipelines: {', '.join(PIPELINES)}") from None


def build(
    pipeline: str | None = None,
    passes: list[str] | None = None,
    disable: set[str] | None = None,
    enable: set[str] | None = None,
) -> list[str]:
    """The list of pass names to run.

    ``passes`` (an explicit list) wins over ``pipeline``; default-off passes in a pipeline run
    only when named in ``enable``; ``enable`` also adds passes the pipeline lacks, at the end
    unless their declared order puts them earlier (the pipeline's own order is kept). Every name
    is checked: an unknown one raises UsageError naming the closest. The default pipeline also
    runs every registered default-enabled pass of a user's (a plugin's) at the position its
    ``runs_after``/``runs_before`` declare (else last). Names in ``disable``
    are checked but kept in the list; the pass manager skips them and reports them as disabled.
    The order is checked against what the passes declare (:func:`check_order`).
    """
    from graphpass.passes.framework.registry import unknown_pass

    known = all_passes()
    for name in list(passes or []) + sorted(disable or ()) + sorted(enable or ()):
        if name not in known:
            raise unknown_pass(name)
    enable = set(enable or ())
    if passes:
        names = list(passes)
    else:
        names = [n for n in get_pipeline(pipeline or DEFAULT_PIPELINE) if known[n].default_enabled or n in enable]
        if (pipeline or DEFAULT_PIPELINE) == DEFAULT_PIPELINE:  # a user's default-enabled passes join it
            builtin = {n for names_ in PIPELINES.values() for n in names_}
            users = [n for n, c in known.items() if c.default_enabled and n not in builtin and n not in enable]
        else:
            users = []
        extra = users + [n for n in sorted(enable) if n not in names]
        if extra:
            names = _stable_order(names + extra, known)
    check_order(names, known)
    return names  # disabled passes stay in the list: the pass manager skips and reports them


def _must_precede(a: type[Pass], b: type[Pass]) -> bool:
    """``a`` must come before ``b`` by what either declares."""
    return any(_matches(e, a) for e in b.runs_after) or any(_matches(e, b) for e in a.runs_before)


def _stable_order(names: list[str], known: dict[str, type[Pass]]) -> list[str]:
    """The declared order, otherwise as listed: a stable topological sort (always the earliest
    listed pass whose predecessors are placed). A list that already obeys the declarations
    comes back unchanged; one with a cycle too (``check_order`` then names the problem)."""
    left = list(dict.fromkeys(names))
    out: list[str] = []
    while left:
        ready = next((n for n in left if not any(_must_precede(known[m], known[n]) for m in left if m != n)), None)
        if ready is None:
            return names
        out.append(ready)
        left.remove(ready)
    return out


def _matches(entry: str | PassKind, cls: type[Pass]) -> bool:
    return cls.kind is entry if isinstance(entry, PassKind) else cls.name == entry


def _label(entry: str | PassKind) -> str:
    return f"every {entry.value} pass" if isinstance(entry, PassKind) else f"'{entry}'"


def check_order(names: list[str], known: dict[str, type[Pass]] | None = None) -> None:
    """Raise UsageError when ``names`` puts a pass on the wrong side of one its
    ``runs_after`` / ``runs_before`` names (a pass name or a whole kind). Each pass is judged
    at its first occurrence; passes the list does not hold impose nothing."""
    known = known or all_passes()
    first: dict[str, int] = {}
    for i, n in enumerate(names):
        first.setdefault(n, i)
    for n, i in first.items():
        cls = known[n]
        for entry in cls.runs_after:
            late = [m for m, j in first.items() if j > i and m != n and _matches(entry, known[m])]
            if late:
                raise UsageError(f"pass order: '{n}' must run after {_label(entry)}, but comes before "
                                 f"{', '.join(repr(m) for m in late)}; move it later in the list")
        for entry in cls.runs_before:
            early = [m for m, j in first.items() if j < i and m != n and _matches(entry, known[m])]
            if early:
                raise UsageError(f"pass order: '{n}' must run before {_label(entry)}, but comes after "
                                 f"{', '.join(repr(m) for m in early)}; move it earlier in the list")
