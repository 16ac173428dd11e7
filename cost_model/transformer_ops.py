"""Which target runs the transformer device ops (data/transformer_ops.toml) and why not.

``refusal(target, op, dtype, ...)`` is what a fusion asks before it forms ``graphpass.ascend::op``:
None when the target's CANN kernel takes it, else one sentence naming the limit and its source.
A target without hardware facts (``none``) has no limits here: the op is formed (it still runs
everywhere through its ONNX body).
"""

from __future__ import annotations

import functools
import tomllib
from typing import Any

from graphpass.cost_model.profiles import DATA_DIR

__all__ = ["attention_refusal", "kernel_dtype", "load_table", "refusal", "row"]


@functools.lru_cache(maxsize=None)
def load_table() -> dict[str, Any]:
    return tomllib.loads((DATA_DIR / "transformer_ops.toml").read_text(encoding="utf-8"))["ops"]


def row(target_name: str, op: str) -> dict[str, Any] | None:
    """The table's row for ``op`` on ``target_name`` (None: no row)."""
    return load_table().get(op, {}).get("targets", {}).get(target_name)


def refusal(target: Any, op: str, dtype: str | None, *, head_dim: int | None = None,
            split_dim: int | None = None, itemsize: int | None = None) -> str | None:
    """Why ``target`` cannot run the device op ``op`` on a ``dtype`` tensor (None if it can).

    ``head_dim``: RotaryEmbedding's last axis; ``split_dim`` and ``itemsize``: SwiGlu's split
    axis (its halves' alignment)."""
    if target is None or not getattr(target, "has_hardware", False):
        return None
    name = target.name
    r = row(name, op)
    cann = load_table().get(op, {}).get("cann", op)
    if r is None:
        return f"no facts on {cann} for target {name} (cost_model/data/transformer_ops.toml): not formed"
    src = f" ({r.get('src', '?')}, {r.get('tag', '?')})"
    if not r.get("supported", False):
        return f"target {name} has no {cann} kernel{src}"
    if dtype is not None and dtype not in r.get("dtypes", ()):
        return f"{cann} on {name} takes {', '.join(r['dtypes'])}, not {dtype}{src}"
    if head_dim is not None:
        mult, top = r.get("head_dim_multiple"), r.get("head_dim_max")
        if (mult and head_dim % mult) or (top and head_dim > top):
            return f"{cann} on {name} takes a head dim that is a multiple of {mult} up to {top}, not {head_dim}{src}"
    if split_dim is not None and itemsize is not None and r.get("align_bytes"):
        half = split_dim // 2 * itemsize
        if half % r["align_bytes"]:
            return f"{cann} on {name} needs each half of the split axis {r['align_bytes']}-byte aligned, not {half} bytes{src}"
    return None


def kernel_dtype(target: Any, dtype: str | None, precision_mode: str | None) -> tuple[str | None, str]:
    """The dtype a Cube op's kernel sees for a ``dtype`` tensor under ``precision_mode`` (the
    target's default when None), and the mode: a float32 op runs in the type the mode lowers
    float32 to (ATC's force_fp16 and allow_fp32_to_fp16 put Cube work in float16; the *_bf16
    modes in bfloat16); must_keep_origin_dtype and force_fp32 keep float32."""
    mode = precision_mode or (target.default_precision_mode if target is not None else None) or ""
    if dtype != "float32":
        return dtype, mode
    for m in getattr(target, "precision_modes", ()):
        if m.name == mode:
            return (m.low if m.lowers or m.low == "bfloat16" else "float32"), mode
    return dtype, mode


def attention_refusal(target: Any, dtype: str | None, precision_mode: str | None, *, head_dim: int,
                      num_heads: int, kv_heads: int) -> str | None:
    """Why ``target`` cannot run an attention on ``dtype`` tensors with these head counts as
    CANN's PromptFlashAttention (None if it can); see data/transformer_ops.toml [ops.Attention]."""
    if target is None or not getattr(target, "has_hardware", False):
        return None
    name = target.name
    r = row(name, "Attention")
    cann = load_table()["Attention"]["cann"]
    if r is None:
        return f"no facts on {cann} for target {name} (cost_model/data/transformer_ops.toml): not formed"
    src = f" ({r.get('src', '?')}, {r.get('tag', '?')})"
    if not r.get("supported", False):
        return f"target {name} has no {cann} kernel{src}"
    kdt, mode = kernel_dtype(target, dtype, precision_mode)
    if kdt not in r.get("dtypes", ()):
        how = f" ({dtype} under precision mode {mode})" if kdt != dtype or dtype == "float32" else ""
        return f"{cann} on {name} takes {', '.join(r['dtypes'])}, not {kdt}{how}{src}"
    top = r.get("head_dim_max")
    if top and head_dim > top:
        return f"{cann} on {name} takes a head dim up to {top}, not {head_dim}{src}"
    top = r.get("num_heads_max")
    if top and num_heads > top:
        return f"{cann} on {name} takes up to {top} heads, not {num_heads}{src}"
    if r.get("kv_heads_divide") and (kv_heads <= 0 or num_heads % kv_heads):
        return f"{cann} on {name} needs num_heads ({num_heads}) a multiple of num_key_value_heads ({kv_heads}){src}"
    return None
