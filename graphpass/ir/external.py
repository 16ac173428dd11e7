"""External data: checking and reading weights kept beside the model, lazy weight values, and
writing weights (streamed into the model file, or to ``<name>.data`` past 2 GB).

Reading: every external tensor's location must lie in the model's folder and name a byte
range its file holds (:func:`load_external_data`); a model loaded lazily keeps its weights on
disk (locations made absolute) and reads them one at a time (:class:`ExternalValues`,
:func:`read_on_disk`, :func:`iter_external_bytes`).

Writing: the exporter leaves big weights out of the proto (see
:func:`graphpass.ir.serialize.save`); :func:`write_streaming` appends them one record at a
time, :func:`write_external` puts them in a 64-byte-aligned data file.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import external_data_helper

from graphpass.errors import BadModelError
from graphpass.ir import limits
from graphpass.ir.validate import _expected_bytes, _has_typed_data, _itemsize, _numel

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "ExternalLayout",
    "ExternalValues",
    "is_on_disk",
    "iter_external_bytes",
    "layout_of",
    "load_external_data",
    "read_on_disk",
]

log = logging.getLogger(__name__)

#: Serialized size beyond which a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 2_000_000_000 - 64 * 1024 * 1024


@dataclass(frozen=True)
class ExternalLayout:
    """How a model's weights are laid out beside it, kept from load to save.

    ``per_tensor``: one file per tensor (else one ``<name>.data`` file); ``threshold``: a main-graph
    tensor of at least this many bytes goes to external data, a smaller one stays in the model.
    """

    per_tensor: bool = False
    threshold: int = 1024


#: the layout of a model written with external data that had none (past 2 GB, or when asked)
DEFAULT_LAYOUT = ExternalLayout()


def layout_of(model: onnx.ModelProto, tensors: list | None = None) -> ExternalLayout | None:
    """The layout of ``model``'s external data (checked by :func:`load_external_data`), or None
    when it has none: one file per tensor when every external tensor has its own file, the
    threshold the smallest external tensor's length (the torch dynamo exporter puts tensors
    of 864 bytes in its ``.data`` file, ``onnx.save`` those of 1 KiB and more). ``tensors``:
    ``list(_external_tensors(model))`` when the caller has it."""
    if tensors is None:
        tensors = list(_external_tensors(model))
    if not tensors:
        return None
    locations, lengths = set(), []
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        locations.add(info.get("location", ""))
        try:
            lengths.append(int(info.get("length") or _numel(t) * _itemsize(t)))
        except (TypeError, ValueError):
            lengths.append(0)
    per_tensor = len(tensors) > 1 and len(locations) == len(tensors)
    return ExternalLayout(per_tensor=per_tensor, threshold=max(1, min(lengths)))


def _external_tensors(model: onnx.ModelProto):
    """An iterator over the tensors of ``model`` stored as external data, in the order of
    :func:`_all_tensors`."""
    external = onnx.TensorProto.EXTERNAL
    return iter([t for t in _all_tensors(model) if t.data_location == external])


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def _all_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """``list(onnx.external_data_helper._get_all_tensors(model))`` (every initializer of every
    graph, then every tensor of a node attribute, of the graphs and of the local functions, in
    the same order) from one walk of each graph's nodes, not two, without a generator frame per
    attribute."""
    inits: list = []
    in_attrs: list = []

    def walk(g, inits: list) -> None:
        if inits is not ignored:
            inits.extend(g.initializer)
        for node in g.node:
            attrs = node.attribute
            if not len(attrs):
                continue
            for a in attrs:
                if a.HasField("t"):
                    in_attrs.append(a.t)
                if len(a.tensors):
                    in_attrs.extend(a.tensors)
                if a.type == _GRAPH:
                    walk(a.g, inits)
                elif a.type == _GRAPHS:
                    for sub in a.graphs:
                        walk(sub, inits)

    ignored: list = []  # a function (no initializers) and the graphs in its nodes: onnx lists none of theirs
    walk(model.graph, inits)
    for f in model.functions:
        walk(f, ignored)
    return inits + in_attrs


_MAX_LOCATION = 4096  # PATH_MAX; a longer location cannot name a file


def _external_info(t: onnx.TensorProto, where: str) -> tuple[str, int, int | None]:
    """(location, offset, length or None) of an external tensor, each checked."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if not location:
        raise BadModelError(f"{where}: tensor '{t.name}' has external data without a location")
    if "\0" in location:
        raise BadModelError(f"{where}: tensor '{t.name}' has an external data location holding a NUL byte")
    if len(location) > _MAX_LOCATION or any(len(part.encode("utf-8", "replace")) > 255 for part in location.replace("\\", "/").split("/")):
        raise BadModelError(f"{where}: tensor '{t.name}' has an over-long external data location ({len(location)} characters)")
    numbers = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is None or text == "":
            numbers[key] = None
            continue
        try:
            value = int(text)
        except ValueError:
            raise BadModelError(f"{where}: tensor '{t.name}' has external data {key} '{text[:40]}', not a number") from None
        if value < 0:
            raise BadModelError(f"{where}: tensor '{t.name}' has a negative external data {key} ({value})")
        numbers[key] = value
    return location, numbers["offset"] or 0, numbers["length"]


def _load_external_data(model: onnx.ModelProto, base_dir: Path | None, where: str, lazy: bool = False,
                        limit: int | None = None, tensors: list | None = None) -> int:
    """Check (and unless ``lazy`` load) every external tensor; returns the bytes they declare.
    ``tensors``: ``list(_external_tensors(model))`` when the caller has it."""
    if tensors is None:
        tensors = list(_external_tensors(model))
    if not tensors:
        return 0
    if base_dir is None:
        raise BadModelError(
            f"{where}: the model refers to external data; load it from its file so the data can be found"
        )
    base = base_dir.resolve()
    sizes: dict[Path, int] = {}
    total = 0
    for t in tensors:
        location, offset, length = _external_info(t, where)
        if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location[:3]:
            raise BadModelError(
                f"{where}: tensor '{t.name}' has external data at an absolute path '{location}'; "
                "external data must lie in the model's folder"
            )
        try:
            target = (base / location).resolve()
        except (OSError, RuntimeError, ValueError) as e:
            raise BadModelError(f"{where}: tensor '{t.name}' has an unusable external data location: {e}") from e
        if base not in target.parents and target != base:
            raise BadModelError(
                f"{where}: tensor '{t.name}' has external data '{location}' outside the model's folder"
            )
        size = sizes.get(target)
        if size is None:
            try:
                st = os.stat(target)
            except OSError:
                raise BadModelError(f"{where}: external data file '{location}' of tensor '{t.name}' is missing") from None
            if not stat.S_ISREG(st.st_mode):
                raise BadModelError(f"{where}: external data '{location}' of tensor '{t.name}' is not a regular file")
            size = sizes[target] = st.st_size
        expected = _expected_bytes(t)
        if length is None:  # optional: the tensor's own size (never "the rest of the file")
            length = expected if expected is not None else max(0, size - offset)
            t.external_data.add(key="length", value=str(length))
        if offset + length > size:
            raise BadModelError(
                f"{where}: tensor '{t.name}' reads bytes {offset}..{offset + length} of '{location}', "
                f"which has only {size}"
            )
        if expected is not None and expected != length:
            raise BadModelError(
                f"{where}: tensor '{t.name}' of shape {list(t.dims)} needs {expected} bytes, "
                f"its external data holds {length}"
            )
        total += length
    if limit is not None and total > limit:
        raise limits.over_memory(
            f"{where}: the external data declares {total} bytes, over the memory limit")
    if lazy:
        for t in tensors:
            for e in t.external_data:
                if e.key == "location":
                    e.value = str((base / e.value).resolve())
        return total
    try:
        external_data_helper.load_external_data_for_model(model, str(base_dir))
    except Exception as e:
        raise BadModelError(f"{where}: cannot load external data: {e}") from e
    return total


class ExternalValues(gs.ir.tensor.LazyValues):
    """Values of a weight that stays in its external data file until a pass reads it.

    Unlike gs's LazyValues (whose ``onnx.numpy_helper.to_array`` would copy the bytes into the
    TensorProto for good) each ``load`` reads the tensor's byte range into a fresh array, so a
    model over 2 GB is never resident as a whole: only the weights a pass changes are.
    """

    def load(self):
        info = {e.key: e.value for e in self.tensor.external_data}
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)
        except Exception:  # noqa: BLE001 - exotic types: onnx's own loader, on a copy
            dtype = None
        if dtype is None or dtype.kind not in "biuf" or dtype.itemsize * int(np.prod(self.shape)) != int(info.get("length", -1)):
            return np.array(onnx.numpy_helper.to_array(_read_on_disk(self.tensor)))
        buf = bytearray(int(info["length"]))
        with open(info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0) or 0))
            f.readinto(buf)
        return np.frombuffer(buf, dtype=dtype.newbyteorder("<")).reshape(self.shape)


def _is_on_disk(t: onnx.TensorProto) -> bool:
    """An external tensor :func:`load_proto` left on disk (its location made absolute)."""
    if not (t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL):
        return False
    loc = next((e.value for e in t.external_data if e.key == "location"), "")
    return os.path.isabs(loc)


def _read_on_disk(t: onnx.TensorProto) -> onnx.TensorProto:
    """``t`` with its bytes read in (a new TensorProto; ``t`` is left as it is)."""
    info = {e.key: e.value for e in t.external_data}
    with open(info["location"], "rb") as f:
        f.seek(int(info.get("offset", 0) or 0))
        raw = f.read(int(info["length"])) if info.get("length") else f.read()
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = raw
    return copy


def iter_external_bytes(t: onnx.TensorProto, chunk: int = 1 << 22):
    """The bytes of an external tensor that :func:`read_as_stored` (or ``load_proto(...,
    lazy_external=True)``) checked, in chunks of at most ``chunk`` bytes; never the whole file."""
    info = {e.key: e.value for e in t.external_data}
    offset = int(info.get("offset", 0) or 0)
    left = int(info["length"]) if info.get("length") else None
    with open(info["location"], "rb") as f:
        f.seek(offset)
        while left is None or left > 0:
            block = f.read(chunk if left is None else min(chunk, left))
            if not block:
                break
            if left is not None:
                left -= len(block)
            yield block


def _header(t: onnx.TensorProto) -> onnx.TensorProto:
    """A TensorProto with ``t``'s name, type and dims but none of its data."""
    h = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, doc_string=t.doc_string)
    if t.HasField("segment"):
        h.segment.CopyFrom(t.segment)
    h.metadata_props.extend(t.metadata_props)
    return h


def _as_proto(name: str, original: "onnx.TensorProto | np.ndarray", header: onnx.TensorProto | None = None
              ) -> onnx.TensorProto:
    """The full tensor for an exported ``header``: the header's ``metadata_props`` (the
    annotations written at export) replace the ones the original was loaded with."""
    if isinstance(original, np.ndarray):
        proto = onnx.numpy_helper.from_array(original, name)
    else:
        proto = original
    if proto.name != name:  # a weight renamed since it was loaded: its bytes under the new name
        proto = onnx.TensorProto()
        proto.CopyFrom(original)
        proto.name = name
    if header is not None and list(header.metadata_props) != list(proto.metadata_props):
        if proto is original:
            proto = onnx.TensorProto()
            proto.CopyFrom(original)
        del proto.metadata_props[:]
        proto.metadata_props.extend(header.metadata_props)
    return proto


def _nbytes(original: "onnx.TensorProto | np.ndarray") -> int:
    if isinstance(original, np.ndarray):
        return int(original.nbytes)
    return _numel(original) * _itemsize(original)


def _payload_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for t in _all_tensors(model):
        n = len(t.raw_data)  # (each read of raw_data is a copy of the bytes)
        total += n
        if not n:
            total += 8 * _numel(t) if _has_typed_data(t) else 0
    return total


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(field: int, payload_len: int) -> bytes:
    return _varint((field << 3) | 2) + _varint(payload_len)


_GRAPH_FIELD = 7  # ModelProto.graph


_INITIALIZER_FIELD = 5  # GraphProto.initializer


def _write_streaming(model: onnx.ModelProto, originals: dict, dst: Path) -> None:
    disk = [i for i in model.graph.initializer if i.name not in originals and _is_on_disk(i)]
    keep = [i for i in model.graph.initializer if i.name not in originals and not _is_on_disk(i)]
    headers = {i.name: i for i in model.graph.initializer if i.name in originals}
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    records = [(name, lambda name=name, o=o: _record_body(name, o, headers.get(name))) for name, o in originals.items()]
    records += [(t.name, lambda t=t: _read_on_disk(t).SerializeToString()) for t in disk]
    with open(dst, "wb") as f:
        f.write(model.SerializeToString())
        # one weight made at a time; the records of small ones go out together (a write call
        # each was ~4,000 calls for a 10k-node CNN), at most _WRITE_BATCH bytes held besides
        batch: list[bytes] = []
        held = 0
        for _, make in records:
            body = make()
            inner = _len_field(_INITIALIZER_FIELD, len(body))
            batch += (_len_field(_GRAPH_FIELD, len(inner) + len(body)), inner, body)
            held += len(body)
            if held >= _WRITE_BATCH:
                f.writelines(batch)
                batch.clear()
                held = 0
        f.writelines(batch)


#: bytes of small weights' records :func:`_write_streaming` holds before writing them out
_WRITE_BATCH = 1 << 20


def _bytes_as_is() -> dict:
    """numpy dtype -> ONNX element type of the arrays :func:`onnx.numpy_helper.from_array`
    writes as their own bytes (numbers and bools in the machine's order, when it is little
    endian: no packing, no byte swap, no strings)."""
    if sys.byteorder != "little":
        return {}
    kinds = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64)
    return {np.dtype(k): onnx.helper.np_dtype_to_tensor_dtype(np.dtype(k)) for k in kinds}


_BYTES_AS_IS = _bytes_as_is()


def _record_body(name: str, original: "onnx.TensorProto | np.ndarray", header: onnx.TensorProto | None = None
                 ) -> bytes:
    """``_as_proto(name, original, header).SerializeToString()``. For an array of a plain type
    (:func:`_bytes_as_is`) with a name, its header without annotations, the message
    ``from_array`` makes (dims, data_type, name, raw_data) is written directly, in the order
    protobuf writes its fields: the same bytes without the message and a second copy of the
    array's bytes (the 10k CNN's 1,332 folded weights: ~10 -> ~4.5 ms)."""
    if isinstance(original, np.ndarray) and name and (header is None or not len(header.metadata_props)):
        elem = _BYTES_AS_IS.get(original.dtype)
        if elem is not None:
            raw = original.tobytes()
            encoded = name.encode("utf-8")
            parts = [b"\x08" + _varint(d) for d in original.shape]  # dims (1), one record each
            parts += (b"\x10" + _varint(elem), b"\x42" + _varint(len(encoded)), encoded,  # data_type (2), name (8)
                      b"\x4a" + _varint(len(raw)), raw)  # raw_data (9)
            return b"".join(parts)
    return _as_proto(name, original, header).SerializeToString()


def _data_names(name: str, per_tensor: bool, avoid: frozenset[str] = frozenset()):
    """File names for external data beside the model ``name``: ``<name>.data``, or one per
    tensor, ``<name>.<tensor>.data`` (the tensor name made a safe, unique file name). A name in
    ``avoid`` (a file the model being saved still reads its weights from) gets a number."""
    used: set[str] = {a.lower() for a in avoid}
    single: list[str] = []

    def unique(stem: str) -> str:
        candidate, k = f"{stem}.data", 0
        while candidate.lower() in used:
            k += 1
            candidate = f"{stem}.{k}.data"
        used.add(candidate.lower())
        return candidate

    def of(tensor: str) -> str:
        if not per_tensor:
            if not single:
                single.append(unique(name))
            return single[0]
        return unique(f"{name}.{re.sub(r'[^A-Za-z0-9._-]', '_', tensor)[:120] or 'tensor'}")

    return of


def _write_external(model: onnx.ModelProto, originals: dict, folder: Path, name: str,
                    layout: ExternalLayout = DEFAULT_LAYOUT, avoid: frozenset[str] = frozenset()) -> None:
    """Write the main graph's tensors of at least ``layout.threshold`` bytes to external data in
    ``folder`` (64-byte aligned in one file, or one file per tensor) and the model to
    ``folder/name``; smaller tensors are written into the model. File names in ``avoid`` are
    not used (the input's own data files, when the output goes beside them)."""
    file_of = _data_names(name, layout.per_tensor, avoid)
    offsets: dict[str, int] = {}
    handles: dict[str, object] = {}
    try:
        for init in model.graph.initializer:
            original = originals.get(init.name)
            nbytes = _nbytes(original) if original is not None else (
                int(next((e.value for e in init.external_data if e.key == "length"), 0) or 0) if _is_on_disk(init)
                else _numel(init) * _itemsize(init))
            if nbytes < layout.threshold or not _externalizable(init, original):
                if original is not None:
                    init.CopyFrom(_as_proto(init.name, original, init))
                elif _is_on_disk(init):
                    init.CopyFrom(_read_on_disk(init))
                continue
            if isinstance(original, np.ndarray):
                raw = np.ascontiguousarray(original).reshape(-1).view(np.uint8).data  # len() = bytes
            elif original is not None:
                raw = original.raw_data if original.HasField("raw_data") else _proto_bytes(original)
            elif _is_on_disk(init):
                raw = _read_on_disk(init).raw_data
            else:
                raw = init.raw_data if init.HasField("raw_data") else _proto_bytes(init)
            data_name = file_of(init.name)
            data = handles.get(data_name)
            if data is None:
                data = handles[data_name] = open(folder / data_name, "wb")
                offsets[data_name] = 0
            offset = offsets[data_name]
            pad = (-offset) % 64  # keep every tensor 64-byte aligned, as onnx does for mmap
            data.write(b"\0" * pad)
            offset += pad
            data.write(raw)
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                init.ClearField(field)
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            init.external_data.add(key="location", value=data_name)
            init.external_data.add(key="offset", value=str(offset))
            init.external_data.add(key="length", value=str(len(raw)))
            offsets[data_name] = offset + len(raw)
    finally:
        for h in handles.values():
            h.close()
    with open(folder / name, "wb") as f:
        f.write(model.SerializeToString())


_PLAIN_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
})


def _externalizable(init: onnx.TensorProto, original) -> bool:
    """Whether a tensor's bytes can be moved out as stored: raw bytes (an array a pass computed,
    raw_data, a tensor already on disk), or a typed field of a plain numeric type (strings and
    packed types, int4 and the like, stay in the model)."""
    if isinstance(original, np.ndarray):
        return True
    proto = original if original is not None else init
    if _is_on_disk(proto) or proto.HasField("raw_data"):
        return proto.data_type != onnx.TensorProto.STRING
    return _has_typed_data(proto) and proto.data_type in _PLAIN_TYPES


def _proto_bytes(t: onnx.TensorProto) -> bytes:
    """The little-endian bytes of a tensor stored in a typed field (as raw_data would hold them)."""
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(t)).raw_data


# public names for the helpers the rest of graphpass uses
load_external_data = _load_external_data
is_on_disk = _is_on_disk
read_on_disk = _read_on_disk
