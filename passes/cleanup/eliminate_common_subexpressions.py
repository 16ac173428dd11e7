"""Common-subexpression elimination.

    a = op(x, y; attrs),  b = op(x, y; attrs)   =>  b's readers read a
    two small constants with equal dtype, shape and bytes  =>  one constant

Nodes are keyed by (domain, op, input identities, attributes) in topological order, so chains
of duplicates collapse in one sweep. Nondeterministic ops and nodes with subgraphs are never
merged. A duplicate whose output is a graph output is kept (output names never change).
Equal constants are merged model-wide, whatever their size (compared by dtype, shape and
bytes: exact), outer ones kept; a graph input with a default initializer is never merged.
"""

from __future__ import annotations

import hashlib
import math
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir import annotations as A

from graphpass.passes.framework import Pass, PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import EXACT, MERGE_EQUAL_CONSTANTS
from graphpass.ir.graph import iter_graphs, load_lazy, remove_nodes, replace_uses, replace_uses_many
from graphpass.passes.cleanup._common import is_pure

__all__ = ["EliminateCommonSubexpressions"]

#: id(dtype object) -> (the object, its key): numpy's ``dtype.name`` costs a few microseconds
#: and the pass asks it twice per constant per round; the object is kept, so its id stays its own
_DTYPE_KEYS: dict[int, tuple[object, tuple[str, str]]] = {}


def _dtype_key(dtype) -> tuple[str, str]:
    """A dtype's identity: its byte layout and its name (ml_dtypes' int4, uint4, float4_e2m1fn
    and the float8 types are all '<V1' to numpy; only the name tells them apart)."""
    hit = _DTYPE_KEYS.get(id(dtype))
    if hit is not None and hit[0] is dtype:
        return hit[1]
    d = np.dtype(dtype)
    key = (d.str, d.name)
    if len(_DTYPE_KEYS) >= 256:  # dtype objects made per array (byte-swapped, structured): bounded
        _DTYPE_KEYS.clear()
    _DTYPE_KEYS[id(dtype)] = (dtype, key)
    return key


#: id(object) -> (the object, str(object)) for the export dtypes ``_value_key`` names (numpy's
#: ``str(dtype)`` asks ``issubdtype`` a few times per call)
_STRS: dict[int, tuple[object, str]] = {}


def _str_of(obj) -> str:
    hit = _STRS.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    text = str(obj)
    if len(_STRS) >= 256:
        _STRS.clear()
    _STRS[id(obj)] = (obj, text)
    return text


def _attr_key(value):
    if isinstance(value, gs.Constant):
        arr = _bytes_of(value)  # not cached: a Constant node's value stays as it was stored
        return ("T", _dtype_key(arr.dtype), getattr(value, "export_dtype", None), arr.shape, arr.tobytes())
    if isinstance(value, np.ndarray):
        return ("A", _dtype_key(value.dtype), value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, float):
        return ("f", repr(value))
    return value


def _attrs_key(node: gs.Node) -> tuple | None:
    """The key of ``node``'s attributes (None when one is unhashable: the node is never merged)."""
    try:
        key = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _bytes_of(t: gs.Constant) -> np.ndarray:
    """The value of ``t``; a weight on disk is read for this call only (never cached on it)."""
    values = t._values
    if isinstance(values, gs.ir.tensor.LazyValues):
        return np.asarray(load_lazy(values))
    return np.asarray(values)


def _raw(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


#: constants up to this size are keyed by their bytes; larger ones by a digest, then compared
#: byte for byte (either key cached on the constant with the values object it was read from)
_SMALL_KEY_BYTES = 64
#: constants over this size are first told apart by a sample of their bytes
_KEY_BYTES = 64 * 1024


#: ONNX types whose ``raw_data`` holds exactly the bytes ``onnx.numpy_helper.to_array`` gives
#: (little-endian, one element after another); not int4/float4 (packed) or bfloat16/float8
_RAW_IS_ARRAY = {
    onnx.TensorProto.FLOAT: np.dtype("<f4"), onnx.TensorProto.DOUBLE: np.dtype("<f8"),
    onnx.TensorProto.FLOAT16: np.dtype("<f2"), onnx.TensorProto.BOOL: np.dtype(bool),
    onnx.TensorProto.INT8: np.dtype("i1"), onnx.TensorProto.INT16: np.dtype("<i2"),
    onnx.TensorProto.INT32: np.dtype("<i4"), onnx.TensorProto.INT64: np.dtype("<i8"),
    onnx.TensorProto.UINT8: np.dtype("u1"), onnx.TensorProto.UINT16: np.dtype("<u2"),
    onnx.TensorProto.UINT32: np.dtype("<u4"), onnx.TensorProto.UINT64: np.dtype("<u8"),
}


def _stored_bytes(t: gs.Constant) -> tuple[np.dtype, tuple[int, ...], memoryview] | None:
    """(dtype, shape, bytes) of a weight not read yet whose TensorProto stores it as raw bytes
    of a plain numeric type: the key is computed from those bytes (equal to the decoded
    array's on a little-endian machine) instead of decoding the weight. None otherwise."""
    v = t._values
    if type(v) is not gs.ir.tensor.LazyValues or sys.byteorder != "little":
        return None
    tp = v.tensor
    dtype = _RAW_IS_ARRAY.get(tp.data_type)
    if dtype is None or not tp.HasField("raw_data") or tp.HasField("data_location") and tp.data_location != 0:
        return None
    shape = tuple(tp.dims)  # (protobuf's repeated int64: Python ints already)
    raw = tp.raw_data
    if len(raw) != math.prod(shape) * dtype.itemsize:
        return None  # malformed: the decode path says what is wrong
    return np.dtype(dtype.type), shape, memoryview(raw)


def _value_key(t: gs.Constant) -> tuple | None:
    """(dtype, shape, bytes or sha256 of the bytes, export dtype, annotations) of ``t``; the
    first three are cached on ``t`` while its value object is the same (graphpass's passes
    replace a Constant's values, never change them in place: the pass runs once per round, and
    reads each constant once, not once per round), but for a small key of a writable array
    (see below). None for strings."""
    values = t._values
    cached = t.__dict__.get("_gp_digest")
    small_hit = None if cached is not None and cached[0] is values else t.__dict__.get("_gp_small")
    if cached is not None and cached[0] is values:
        key = cached[1]
    elif (small_hit is not None and small_hit[0] is values and values.dtype is small_hit[1]
          and values.shape == small_hit[2][1] and values.tobytes() == small_hit[2][2]):
        # a small writable array keyed before: its bytes compared again, in place of the key
        # made again (its dtype and shape, then its bytes: what the key holds; fold_batchnorm's
        # biases, ~13k at 100k nodes, asked on every later run of the pass)
        key = small_hit[2]
    else:
        stored = _stored_bytes(t)
        if stored is not None:  # the stored bytes are the array's: no decode
            dtype, shape, raw = stored
        else:
            arr = _bytes_of(t)
            if arr.dtype.kind in "OSU":
                return None
            dtype, shape, raw = arr.dtype, arr.shape, _raw(arr)
        small = raw.nbytes <= _SMALL_KEY_BYTES
        body = raw.tobytes() if small else ("sha256", hashlib.sha256(raw).digest())
        key = (_dtype_key(dtype), shape, body)
        # a key of the bytes themselves is trusted as they are (no byte compare): not cached
        # over an array something may still write into (a user's pass: ``c.values[...] = v``);
        # a digest is (a match is compared byte for byte), as is a key read from the stored
        # bytes of a weight not loaded yet or from a read-only array
        if not small or type(values) is not np.ndarray or not values.flags.writeable:
            t.__dict__["_gp_digest"] = (values, key)
        else:
            t.__dict__["_gp_small"] = (values, values.dtype, key)
    if type(t) is gs.Constant:  # gs's export_dtype property without its two property calls
        export = t.__dict__.get("_export_dtype")
        key = key + (_str_of(export if export is not None else values.dtype),)
    else:
        key = key + (_str_of(getattr(t, "export_dtype", None)),)
    meta = A.stored_meta(t)  # a read: no empty dict made, nothing for an undo log to save
    return key + (tuple(sorted(meta.items())),) if meta else key


def _sample_key(t: gs.Constant) -> bytes:
    """A cheap fingerprint of a big weight (its first and last 256 bytes, 4 KiB strided through
    it): two weights that differ here are not hashed whole. Cached like the digest."""
    cached = t.__dict__.get("_gp_sample")
    if cached is not None and cached[0] is t._values:
        return cached[1]
    raw = _raw(_bytes_of(t))
    key = raw[:256].tobytes() + raw[-256:].tobytes() + raw[:: max(1, raw.size // 4096)].tobytes()
    t.__dict__["_gp_sample"] = (t._values, key)
    return key


def _header_key(t: gs.Constant) -> tuple | None:
    try:
        if type(t) is gs.Constant:  # gs's dtype and shape properties read their values object's
            values = t._values
            return (_dtype_key(values.dtype), tuple(map(int, values.shape)))
        return (_dtype_key(t.dtype), tuple(map(int, t.shape)))
    except TypeError:
        return None


def _dedupe_constants(graph: gs.Graph, graphs: list[gs.Graph] | None = None) -> int:
    """Case 1: equal constants (dtype, shape, bytes; -0.0 is not 0.0, NaN payloads count) read
    anywhere in the model become the first one (outermost graph first). A constant of the
    main graph is visible in every body; one that ends up read by several graphs is saved
    once, in the main graph (``graphpass.ir.serialize``). Graph inputs with a default
    initializer are inputs (gs Variables), never merged. Weights are compared by header first,
    then (over 64 KiB) by a sample of their bytes, then by a digest read one weight at a time,
    then byte for byte. ``graphs``: ``list(iter_graphs(graph))`` when the caller has it."""
    graphs = graphs if graphs is not None else list(iter_graphs(graph))
    outputs = {id(t) for g in graphs for t in g.outputs}
    groups: dict[tuple, list[gs.Constant]] = {}
    seen: set[int] = set()
    for g in graphs:
        for node in g.nodes:
            for t in node.inputs:
                if not isinstance(t, gs.Constant) or id(t) in seen:
                    continue
                seen.add(id(t))
                key = _header_key(t) if id(t) not in outputs else None
                if key is not None:
                    groups.setdefault(key, []).append(t)
    candidates: list[list[gs.Constant]] = []
    for (dtype, shape), members in groups.items():
        if len(members) < 2:
            continue
        if math.prod(shape) * np.dtype(dtype[0]).itemsize <= _KEY_BYTES:
            candidates.append(members)
            continue
        by_sample: dict[bytes, list[gs.Constant]] = {}
        for t in members:
            by_sample.setdefault(_sample_key(t), []).append(t)
        candidates.extend(m for m in by_sample.values() if len(m) > 1)
    pairs: list[tuple[gs.Constant, gs.Constant]] = []
    for members in candidates:
        canon: dict[tuple, list[gs.Constant]] = {}
        for t in members:
            key = _value_key(t)
            if key is None:
                continue
            firsts = canon.setdefault(key, [])
            if isinstance(key[2], bytes):  # keyed by the bytes themselves: equal keys, equal bytes
                same = firsts[0] if firsts else None
            else:  # a digest: compare the bytes (one weight in memory at a time besides the first)
                same = next((f for f in firsts if np.array_equal(_raw(_bytes_of(f)), _raw(_bytes_of(t)))), None)
            if same is None:
                firsts.append(t)
            else:
                pairs.append((t, same))
    replace_uses_many(pairs)  # one sweep: a Sum of 100,000 equal constants stays linear
    return len(pairs)


@register
class EliminateCommonSubexpressions(Pass):
    """Merges nodes that compute the same thing from the same inputs.

    Cases:
      1. equal constants become one, across the model's graphs (see ``_dedupe_constants``);
      2. pure nodes with identical op, inputs and attributes: the later one's readers read the
         earlier one's outputs, and the later one is removed;
      3. the same inside subgraph bodies, per body.
    """

    name = "eliminate_common_subexpressions"
    summary = "Merge duplicate nodes (same op, inputs, attributes) and equal constants (initializers shared)."
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True
    #: one sweep merges every group of equal constants and, in topological order with readers
    #: keyed through the merges, every chain of duplicate nodes (bodies after the graph around
    #: them); the refusals (graph outputs, impure nodes, unhashable attributes) stay refusals
    idempotent = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        # one walk for the graphs: merging constants rewires inputs only (no body made or dropped)
        graphs = list(iter_graphs(graph))
        stats = {"constants_merged": _dedupe_constants(graph, graphs), "nodes_merged": 0}
        for g in graphs:
            outs = {id(t) for t in g.outputs}
            # (domain, op, inputs, output count) -> [its first node, {attributes' key: first node}]:
            # the attributes are keyed only once a second node has the same head (most never do)
            table: dict[tuple, list] = {}
            dead = []
            # merged output -> the output it duplicates; keys read through it, and every reader is
            # rewired in one sweep at the end (per merge, a 100,000-input Sum was walked per merge)
            canon: dict[int, gs.Tensor] = {}
            pairs: list[tuple[gs.Tensor, gs.Tensor]] = []
            for node in g.nodes:
                if not node.outputs or not is_pure(node):
                    continue
                inputs = ([id(canon.get(id(t), t)) if t.name else None for t in node.inputs] if canon
                          else [id(t) if t.name else None for t in node.inputs])
                head = (node.domain or "", node.op, tuple(inputs), len(node.outputs))
                slot = table.get(head)
                if slot is None:
                    table[head] = [node, None]
                    continue
                if slot[1] is None:  # a second node with this head: the first one's attributes keyed now
                    slot[1] = {}
                    earlier = _attrs_key(slot[0])
                    if earlier is not None:
                        slot[1][earlier] = slot[0]
                attrs = _attrs_key(node)
                if attrs is None:  # an unhashable attribute: never merged
                    continue
                first = slot[1].setdefault(attrs, node)
                if first is node:
                    continue
                if any(id(t) in outs for t in node.outputs):
                    continue
                if any(bool(a.name) != bool(b.name) for a, b in zip(node.outputs, first.outputs)):
                    continue
                for a, b in zip(node.outputs, first.outputs):
                    if a.name:
                        canon[id(a)] = b
                        pairs.append((a, b))
                dead.append(node)
                stats["nodes_merged"] += 1
            replace_uses_many(pairs)
            for node in dead:
                node.inputs.clear()
            remove_nodes(g, dead)
        # equal constants only: readers of a constant read one equal to it (see MERGE_EQUAL_CONSTANTS)
        edit = MERGE_EQUAL_CONSTANTS if stats["constants_merged"] and not stats["nodes_merged"] else None
        return PassResult(bool(stats["constants_merged"] or stats["nodes_merged"]), stats, edit=edit)
