"""Loading and saving models: ModelProto <-> gs.Graph with everything gs would lose kept.

What this layer adds to onnx-graphsurgeon:

* input validation with one clear error per problem (not an ONNX file, unsupported opset,
  a node input nothing produces, duplicate producers, a cycle, bad external data);
* external data confined to the model's folder, and saved automatically past 2 GB;
* model-level data gs does not carry (model ``metadata_props``, ``doc_string``, ``domain``,
  ``model_version``) and graphpass annotations (see :mod:`graphpass.ir.annotations`);
* atomic writes: a temp file in the target folder, then ``os.replace``.

IR versions below 4 list every initializer as a graph input; gs imports such initializers as
constants (which is how onnxruntime treats them for IR < 4), so a saved model is raised to IR 4,
which does not change the meaning of any opset-9+ op. A model that carries local functions is
raised to IR 8 (the first IR with functions); the opset is never changed.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
import onnx.version_converter
import onnx_graphsurgeon as gs
from onnx import external_data_helper

from graphpass.errors import BadModelError, ResourceLimitError, UsageError
from graphpass.ir import annotations, limits
from graphpass.ir.graph import graph_protos, iter_graphs, subgraph_pairs, toposort

__all__ = [
    "MIN_OPSET",
    "ModelSource",
    "load",
    "load_proto",
    "read_npz",
    "from_proto",
    "to_proto",
    "save",
    "save_proto",
    "infer_shapes",
    "EXTERNAL_DATA_THRESHOLD",
]

log = logging.getLogger(__name__)

gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]

#: The oldest default-domain opset the passes work in. An older model is converted to it with
#: onnx's version converter on load (logged); one the converter cannot convert is refused.
MIN_OPSET = 7

#: Serialized size beyond which a model is saved with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 2_000_000_000 - 64 * 1024 * 1024

_MODEL_INFO = "_gp_model"


class gc_paused:
    """Pause Python's cyclic GC while building or exporting a big graph.

    gs creates several objects per node; with the collector on, each generation-2 sweep walks
    the whole (growing) heap, which made importing a 100k-node model about 50% slower.
    """

    def __enter__(self):
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was_enabled:
            gc.enable()
        return False


class gc_frozen:
    """Move every object alive now out of the collector's sight for the duration (gc.freeze).

    After a big model is loaded, each generation-2 sweep during the passes would walk all of
    its gs objects again; freezing them cut the cleanup pipeline on a 100k-node graph from
    7.3 s to 4.9 s. Objects created inside the block are still collected; ``unfreeze`` puts
    the frozen ones back on exit.
    """

    def __enter__(self):
        self.active = gc.isenabled()
        if self.active:
            gc.freeze()

    def __exit__(self, *exc):
        if self.active:
            gc.unfreeze()
        return False


# --------------------------------------------------------------------------------------------
# loading


def load_proto(source: ModelSource, lazy_external: bool = False, *, max_memory: int | str | None = None) -> onnx.ModelProto:
    """Read and validate a ModelProto from a path, bytes or a ModelProto; external data loaded.

    ``lazy_external``: leave external data on disk; each external tensor's location becomes the
    absolute path of its (checked) file, which :func:`load` reads tensor by tensor on demand.
    ``max_memory``: bytes (or "8G"); the model plus the external data it declares must fit
    (default :func:`graphpass.ir.limits.default_max_memory`).

    Raises:
        BadModelError: with one line saying what is wrong and where
            (:class:`~graphpass.errors.ResourceLimitError` when it is too big).
    """
    return _load_proto(source, lazy_external, limits.resolve_max_memory(max_memory))[0]


def _load_proto(source: ModelSource, lazy_external: bool, limit: int) -> tuple[onnx.ModelProto, int]:
    """:func:`load_proto` and the bytes graphpass will hold for it (model + external data)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)  # never mutate the caller's proto
        base_dir = None
        held = model.ByteSize()
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "<bytes>")
        base_dir = None
        held = len(source)
    else:
        path = Path(source)
        data = _read_regular_file(path, limit, "model")
        held = len(data)
        model = _parse(data, str(path))
        del data
        base_dir = path.resolve().parent
    where = str(source) if not isinstance(source, (bytes, bytearray, onnx.ModelProto)) else "<model>"
    validate(model, where)
    external = _load_external_data(model, base_dir, where, lazy=lazy_external, limit=limit - held)
    held += external
    limits.Budget(limit).require(held, f"{where}: the model and its external data")
    held += _densify_sparse(model, where, limit - held)
    return _upgrade_old_opset(model), held


def _densify_sparse(model: onnx.ModelProto, where: str, room: int) -> int:
    """Replace every sparse initializer by the dense initializer of the same name, dtype and
    values (onnx-graphsurgeon has no sparse tensors). Returns the bytes added; the dense size
    is computed from the dims first and refused above ``room``."""
    added = 0
    for g in graph_protos(model.graph):
        if not len(g.sparse_initializer):
            continue
        for sp in g.sparse_initializer:
            name = sp.values.name
            dims = [int(d) for d in sp.dims]
            if any(not 0 <= d <= limits.MAX_DIM for d in dims):
                raise ResourceLimitError(f"{where}: sparse initializer '{name}' has dims {dims}, outside 0..2^31")
            try:
                values = onnx.numpy_helper.to_array(_read_on_disk(sp.values) if _is_on_disk(sp.values) else sp.values)
                indices = onnx.numpy_helper.to_array(_read_on_disk(sp.indices) if _is_on_disk(sp.indices) else sp.indices)
            except Exception as e:  # noqa: BLE001 - malformed values or indices
                raise BadModelError(f"{where}: sparse initializer '{name}' cannot be read: {e}") from e
            n = int(np.prod(dims, dtype=object))
            nbytes = n * values.dtype.itemsize
            if added + nbytes > room:
                raise ResourceLimitError(
                    f"{where}: sparse initializer '{name}' would take {nbytes} bytes dense, over the memory limit "
                    "(raise it with --max-memory or GRAPHPASS_MAX_MEMORY)"
                )
            values = values.reshape(-1)
            if indices.ndim == 2 and indices.shape[1] == len(dims) and len(dims) > 0:
                if ((indices < 0) | (indices >= np.array(dims))).any():
                    raise BadModelError(f"{where}: sparse initializer '{name}' has an index outside its shape {dims}")
                flat = np.ravel_multi_index(tuple(indices.T), dims) if len(indices) else np.zeros(0, np.int64)
            elif indices.ndim == 1 or indices.size == 0:
                flat = indices.reshape(-1)
                if ((flat < 0) | (flat >= n)).any():
                    raise BadModelError(f"{where}: sparse initializer '{name}' has an index outside its shape {dims}")
            else:
                raise BadModelError(f"{where}: sparse initializer '{name}' has indices of shape {list(indices.shape)}")
            if len(flat) != len(values):
                raise BadModelError(
                    f"{where}: sparse initializer '{name}' has {len(values)} values for {len(flat)} indices"
                )
            dense = np.zeros(n, dtype=values.dtype)
            dense[flat] = values
            tensor = onnx.numpy_helper.from_array(dense.reshape(dims), name)
            if tensor.data_type != sp.values.data_type:
                tensor = onnx.helper.make_tensor(name, sp.values.data_type, dims, dense.tobytes(), raw=True)
            g.initializer.append(tensor)
            added += nbytes
        log.info("%s: %d sparse initializer(s) stored dense", where, len(g.sparse_initializer))
        del g.sparse_initializer[:]
    return added


def _read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, read only if it is a regular file no larger than ``limit``
    (:func:`_read_regular_file_check`)."""
    st = _read_regular_file_check(path, limit, what)
    try:
        with open(path, "rb") as f:
            data = f.read(st.st_size + 1)
    except OSError as e:
        raise BadModelError(f"{path}: cannot read: {e.strerror}") from e
    if len(data) > st.st_size:
        raise BadModelError(f"{path}: the file grew while it was read")
    return data


def read_npz(path: str | os.PathLike, max_memory: int | str | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (inputs for ``verify``), read safely.

    Only from a regular file; the uncompressed sizes its zip directory declares must fit in
    ``max_memory`` before any array is read; pickled (object) arrays are refused; a corrupt
    archive or array is one :class:`BadModelError` line naming the file (and the array).
    """
    import zipfile

    p = Path(path)
    limit = limits.resolve_max_memory(max_memory)
    _read_regular_file_check(p, limit, "inputs (.npz)")
    try:
        with zipfile.ZipFile(p) as z:
            members = z.infolist()
            total = sum(m.file_size for m in members)
            if total > limit:
                raise ResourceLimitError(
                    f"{p}: the arrays take {total} bytes uncompressed, over the memory limit of {limit} "
                    "(raise it with --max-memory or GRAPHPASS_MAX_MEMORY)"
                )
    except zipfile.BadZipFile as e:
        raise BadModelError(f"{p}: not a valid .npz file ({e})") from e
    except OSError as e:
        raise BadModelError(f"{p}: cannot read: {e.strerror or e}") from e
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(p, allow_pickle=False) as data:
            for name in data.files:
                try:
                    out[name] = data[name]
                except Exception as e:  # noqa: BLE001 - corrupt member: zlib, header or length errors
                    raise BadModelError(f"{p}: array '{name}' cannot be read: {type(e).__name__}: {e}") from e
    except BadModelError:
        raise
    except Exception as e:  # noqa: BLE001 - anything else numpy raises on a damaged archive
        raise BadModelError(f"{p}: not a valid .npz file ({type(e).__name__}: {e})") from e
    return out


def _read_regular_file_check(path: Path, limit: int, what: str) -> os.stat_result:
    """Refuse ``path`` unless it is a regular file no larger than ``limit``; its ``os.stat``.

    A FIFO would block forever and a device (``/dev/zero``) never ends: both are refused from
    ``os.stat`` before the file is opened.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadModelError(f"{path}: no such file") from None
    except OSError as e:
        raise BadModelError(f"{path}: cannot read: {e.strerror}") from e
    if stat.S_ISDIR(st.st_mode):
        raise BadModelError(f"{path}: is a folder, not " + ("an ONNX model" if what == "model" else f"the {what}"))
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode))
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise BadModelError(f"{path}: is {kind}, not a regular file; graphpass reads the {what} only from a regular file")
    if st.st_size > limit:
        raise ResourceLimitError(
            f"{path}: the {what} is {st.st_size} bytes, over the memory limit of {limit} "
            "(raise it with --max-memory or GRAPHPASS_MAX_MEMORY)"
        )
    return st


def _upgrade_old_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Bring a model older than :data:`MIN_OPSET` forward with onnx's version converter."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or version >= MIN_OPSET:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(
            f"model uses opset {version}, too old for graphpass ({MIN_OPSET}+), and onnx's version converter "
            f"cannot bring it forward: {reason}"
        ) from e
    log.warning("model uses opset %d; converted to opset %d with onnx's version converter", version, MIN_OPSET)
    return converted


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise BadModelError(f"{where}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeError from upb
        raise BadModelError(f"{where}: not an ONNX model (protobuf parse failed: {e})") from e
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise BadModelError(f"{where}: not an ONNX model (no ir_version or no graph)")
    return model


def _external_tensors(model: onnx.ModelProto):
    for t in external_data_helper._get_all_tensors(model):
        if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


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
                        limit: int | None = None) -> int:
    """Check (and unless ``lazy`` load) every external tensor; returns the bytes they declare."""
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
        raise ResourceLimitError(
            f"{where}: the external data declares {total} bytes, over the memory limit "
            "(raise it with --max-memory or GRAPHPASS_MAX_MEMORY)"
        )
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


def _expected_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes of ``t``'s data as ``raw_data`` (sub-byte types packed); None for strings/unknown."""
    size = limits.elem_size(t.data_type)
    if size is None:
        return None
    n = _numel(t)
    if size < 1:
        per_byte = int(round(1 / size))
        return -(-n // per_byte)
    return n * int(size)


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


def validate(model: onnx.ModelProto, where: str = "model") -> None:
    """Structural checks that make the rest of graphpass safe; linear in the model size.

    Beyond the graph structure: every default-domain node needs a default-domain opset import;
    main-graph inputs need a type; a Constant needs exactly one value; an attribute of a known
    default-domain op must have the type the op declares; initializer names are unique per
    graph; concrete dims lie in 0..2^31; an initializer's data matches its shape.
    """
    if model.ir_version > onnx.IR_VERSION:
        raise BadModelError(
            f"model IR version {model.ir_version} is newer than this onnx ({onnx.__version__}) supports "
            f"(max {onnx.IR_VERSION})"
        )
    opsets = {o.domain or "": o.version for o in model.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    newest = onnx.defs.onnx_opset_version()
    if default is not None:
        if default < 1:
            raise BadModelError(f"model declares default-domain opset {default}, which does not exist")
        if default > newest:
            raise BadModelError(f"model uses opset {default}, newer than this onnx supports ({newest})")
    _check_graph(model.graph, outer=frozenset(), path=model.graph.name or "main")
    for vi in model.graph.input:
        if not vi.HasField("type") or vi.type.WhichOneof("value") is None:
            raise BadModelError(f"{where}: graph input '{vi.name}' has no type")
    _check_content(model, default)


_VALUE_ATTRS = frozenset({"value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                          "value_strings", "sparse_value"})


def _check_content(model: onnx.ModelProto, default_opset: int | None) -> None:
    """Opset imports, attribute types, Constant values, tensor data vs shape; linear."""
    schemas: dict[str, object] = {}

    def schema(op: str):
        if op not in schemas:
            try:
                schemas[op] = onnx.defs.get_schema(op, default_opset or 1, "")
            except Exception:  # noqa: BLE001 - unknown op: its checks are the runtime's
                schemas[op] = None
        return schemas[op]

    local_functions = {(f.domain, f.name) for f in model.functions}
    for path, g in _graphs_with_paths(model.graph, model.graph.name or "main"):
        seen: set[str] = set()
        for t in g.initializer:
            if t.name in seen:
                raise BadModelError(
                    f"{path}: two initializers are named '{t.name}' (runtimes disagree on which one wins)"
                )
            seen.add(t.name)
            _check_tensor(t, f"{path}: initializer '{t.name}'")
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is not None and tt.HasField("shape"):
                for d in tt.shape.dim:
                    if d.HasField("dim_value") and not 0 <= d.dim_value <= limits.MAX_DIM:
                        raise ResourceLimitError(
                            f"{path}: tensor '{vi.name}' has dimension {d.dim_value}, outside 0..2^31"
                        )
        for node in g.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            name = node.name or node.op_type
            if default_opset is None and (node.domain, node.op_type) not in local_functions:
                raise BadModelError(
                    f"{path}: node '{name}' ({node.op_type}) uses the default ONNX domain, "
                    "which the model does not import (no opset_import for '')"
                )
            if node.op_type == "Constant":
                values = [a for a in node.attribute if a.name in _VALUE_ATTRS]
                if len(values) != 1:
                    raise BadModelError(
                        f"{path}: Constant node '{name}' has {len(values)} values (it needs exactly one)"
                    )
            sch = schema(node.op_type)
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    _check_tensor(a.t, f"{path}: node '{name}' attribute '{a.name}'")
                if sch is None or a.ref_attr_name:
                    continue
                decl = sch.attributes.get(a.name)
                if decl is not None and a.type != 0 and int(decl.type) != int(a.type):
                    raise BadModelError(
                        f"{path}: node '{name}' ({node.op_type}) has attribute '{a.name}' of type "
                        f"{onnx.AttributeProto.AttributeType.Name(a.type)}; the operator takes "
                        f"{onnx.AttributeProto.AttributeType.Name(int(decl.type))}"
                    )


def _graphs_with_paths(graph: onnx.GraphProto, path: str):
    yield path, graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs_with_paths(a.g, f"{path}/{node.name or node.op_type}.{a.name}")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for k, sub in enumerate(a.graphs):
                    yield from _graphs_with_paths(sub, f"{path}/{node.name or node.op_type}.{a.name}[{k}]")


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _check_tensor(t: onnx.TensorProto, what: str) -> None:
    """Dims in 0..2^31; data (inline) of exactly the size the shape needs."""
    for d in t.dims:
        if not 0 <= d <= limits.MAX_DIM:
            raise ResourceLimitError(f"{what} has dimension {d}, outside 0..2^31")
    if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL:
        return  # checked against its file by _load_external_data
    n = _numel(t)
    if t.HasField("raw_data"):
        expected = _expected_bytes(t)
        if expected is not None and expected != len(t.raw_data):
            raise BadModelError(
                f"{what} of shape {list(t.dims)} needs {expected} bytes, its raw_data holds {len(t.raw_data)}"
            )
        return
    have = [f for f in _TYPED_FIELDS if len(getattr(t, f))]
    if not have:
        if n:
            raise BadModelError(f"{what} of shape {list(t.dims)} holds no data")
        return
    count = len(getattr(t, have[0]))
    if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        count //= 2
    elif limits.elem_size(t.data_type) in (0.5, 0.25) and have[0] == "int32_data":
        count *= int(1 / limits.elem_size(t.data_type))  # packed: ceil(n / per_byte) int32 entries
        if count - n >= int(1 / limits.elem_size(t.data_type)):
            count = -1
        else:
            count = n
    if count != n:
        raise BadModelError(f"{what} of shape {list(t.dims)} holds {len(getattr(t, have[0]))} values in {have[0]}, not {n}")


def _check_names(graph: onnx.GraphProto, path: str) -> None:
    """Every name in ``graph`` is text (protobuf hands back bytes for invalid UTF-8)."""
    def bad(what: str, value) -> BadModelError:
        return BadModelError(f"{path}: {what} {bytes(value)[:40]!r} is not valid UTF-8")

    for holder, what in ((graph.input, "graph input"), (graph.output, "graph output"),
                         (graph.initializer, "initializer"), (graph.value_info, "value_info")):
        for t in holder:
            if not isinstance(t.name, str):
                raise bad(what + " name", t.name)
    for node in graph.node:
        if not isinstance(node.name, str):
            raise bad("node name", node.name)
        for t in list(node.input) + list(node.output):
            if not isinstance(t, str):
                raise bad(f"tensor name of node '{node.name}'", t)
        for a in node.attribute:
            if not isinstance(a.name, str):
                raise bad(f"attribute name of node '{node.name}'", a.name)


def _check_graph(graph: onnx.GraphProto, outer: frozenset, path: str) -> None:
    _check_names(graph, path)
    defined: set[str] = set(outer)
    defined.update(i.name for i in graph.input)
    defined.update(i.name for i in graph.initializer)
    defined.update(i.values.name for i in graph.sparse_initializer)
    produced: dict[str, str] = {}
    for node in graph.node:
        op = node.op_type
        if not isinstance(op, str) or not op.isidentifier():
            raise BadModelError(f"{path}: node '{node.name if isinstance(node.name, str) else '?'}' has an invalid op_type {op!r}")
        if not isinstance(node.domain, str):
            raise BadModelError(f"{path}: node '{node.name}' ({op}) has an invalid domain")
        for o in node.output:
            if not o:
                continue
            if o in produced:
                raise BadModelError(
                    f"{path}: tensor '{o}' is produced twice (by '{produced[o]}' and '{node.name or node.op_type}')"
                )
            produced[o] = node.name or node.op_type
    defined.update(produced)
    for node in graph.node:
        for i in node.input:
            if i and i not in defined:
                raise BadModelError(
                    f"{path}: node '{node.name or '?'}' ({node.op_type}) reads '{i}', "
                    "which no node, graph input or initializer produces"
                )
    for out in graph.output:
        if out.name not in defined:
            raise BadModelError(f"{path}: graph output '{out.name}' is produced by nothing")
    scope = frozenset(defined)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _check_graph(attr.g, scope, f"{path}/{node.name or node.op_type}.{attr.name}")
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for k, g in enumerate(attr.graphs):
                    _check_graph(g, scope, f"{path}/{node.name or node.op_type}.{attr.name}[{k}]")


def _apply_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name, shape in input_shapes.items():
        if name not in inputs:
            raise UsageError(
                f"--input-shape names '{name}', which is not a graph input (inputs: {', '.join(inputs) or 'none'})"
            )
        vi = inputs[name]
        tt = vi.type.tensor_type
        dims = tt.shape.dim if tt.HasField("shape") else None
        if dims is not None and len(dims) and len(dims) != len(shape):
            raise UsageError(
                f"--input-shape {name}: rank {len(shape)} given, the model's input has rank {len(dims)}"
            )
        for k, v in enumerate(shape):
            if int(v) <= 0:
                raise UsageError(f"--input-shape {name}: dimension {k} must be positive, got {v}")
            if int(v) > limits.MAX_DIM:
                raise UsageError(f"--input-shape {name}: dimension {k} is {v}, above the limit of 2^31")
            if dims is not None and k < len(dims) and dims[k].HasField("dim_value") and dims[k].dim_value not in (0, int(v)):
                raise UsageError(
                    f"--input-shape {name}: dimension {k} is fixed to {dims[k].dim_value} in the model, got {v}"
                )
        tt.ClearField("shape")
        for v in shape:
            tt.shape.dim.add().dim_value = int(v)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference (with data propagation) on a copy whose big weights are left out.

    The copy lists each initializer over 1 KiB as a typed graph input instead (a header, no
    bytes), so inference sees its shape without serializing or copying the weights; this also
    keeps models over 2 GB inferable. Symbolic dims keep their names. The model's own
    value_info for outputs of default-domain nodes of the main graph is left out, so inference
    derives those shapes itself instead of trusting them. Inference runs without data
    propagation first; only if that leaves a shape unknown, and data propagation is safe (see
    :func:`_data_prop_safe`: it allocates per element of the 1-D tensors it follows), it runs
    again with it. Returns the inferred copy; on failure logs a warning and returns ``model``
    unchanged.
    """
    light = _light_copy(model)
    try:
        first = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=False)
    except Exception as e:  # inference is advisory: passes fall back to unknown shapes
        log.warning("shape inference failed, continuing without inferred shapes: %s", str(e).splitlines()[0])
        return model
    if not _has_unknown_shapes(first.graph):
        return first
    if not _data_prop_safe(model, first.graph):
        log.info("shape inference without data propagation: the model has a big integer Constant or 1-D tensor")
        return first
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - keep what inference without data propagation found
        log.info("shape inference with data propagation failed (%s); using it without", str(e).splitlines()[0])
        return first


def _has_unknown_shapes(graph: onnx.GraphProto) -> bool:
    """Some node output of the main graph has no shape, a dim with neither value nor name, or a
    dim named by a symbol no graph input carries (unbound: e.g. the ``N`` a declared output kept
    after ``--input-shape`` fixed the input's ``N`` to 1)."""
    known = {}
    for vi in list(graph.value_info) + list(graph.output):
        known[vi.name] = vi
    bound = {d.dim_param for vi in graph.input if vi.type.HasField("tensor_type")
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}
    for n in graph.node:
        for o in n.output:
            if not o:
                continue
            vi = known.get(o)
            if vi is None or not vi.type.HasField("tensor_type"):
                if vi is None:
                    return True
                continue
            tt = vi.type.tensor_type
            if not tt.HasField("shape") or any(
                not d.HasField("dim_value") and (not d.HasField("dim_param") or d.dim_param.startswith("unk__")
                                                 or d.dim_param not in bound)
                for d in tt.shape.dim
            ):
                return True  # onnx names the dims it could not infer unk__N
    return False


#: Data propagation is skipped when a Constant holds more integers than this (see infer_shapes).
_DATA_PROP_MAX_ELEMS = 4096
#: ... or when the 1-D node outputs hold more elements than this together (~40 MB of messages).
_DATA_PROP_MAX_TOTAL = 1 << 18


def _data_prop_safe(model: onnx.ModelProto, inferred: onnx.GraphProto) -> bool:
    """Data propagation allocates per element of every 1-D node output it computes (one protobuf
    message each, ~150 bytes measured: 50 Adds of 65,536 elements took 500 MB): safe only while
    the 1-D node outputs hold at most :data:`_DATA_PROP_MAX_TOTAL` elements together and no
    Constant holds more than :data:`_DATA_PROP_MAX_ELEMS` integers."""
    produced = {o for n in inferred.node for o in n.output}
    total = 0
    for vi in list(inferred.value_info) + list(inferred.output):
        if vi.name not in produced:
            continue
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape") and len(tt.shape.dim) == 1:
            d = tt.shape.dim[0]
            total += d.dim_value if d.HasField("dim_value") else 1
            if total > _DATA_PROP_MAX_TOTAL:
                return False
    nodes = [n for g in graph_protos(model.graph) for n in g.node]
    nodes += [n for f in model.functions for n in f.node]
    for n in nodes:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx"):
            continue
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type not in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                onnx.TensorProto.BFLOAT16, onnx.TensorProto.STRING,
            ) and _numel(a.t) > _DATA_PROP_MAX_ELEMS:
                return False
            if len(a.ints) > _DATA_PROP_MAX_ELEMS:
                return False
    return True


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4), producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    for n in src.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            copy = dst.node.add()
            copy.CopyFrom(n)  # subgraph bodies: their declared value_info is dropped too
            for a in copy.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    _drop_inferable_value_info(g)
        else:
            dst.node.append(n)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    inferable = {o for n in src.node if n.domain in ("", "ai.onnx") for o in n.output}
    dst.value_info.extend(vi for vi in src.value_info if vi.name not in inferable)
    dst.sparse_initializer.extend(src.sparse_initializer)
    inputs = {i.name for i in src.input}
    for t in src.initializer:
        if _numel(t) * _itemsize(t) > 1024 or (t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL):
            if t.name not in inputs:
                dst.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            dst.initializer.append(t)
    return light


def _drop_inferable_value_info(g: onnx.GraphProto) -> None:
    """Remove the value_info of outputs of default-domain nodes in ``g`` and its subgraphs."""
    inferable = {o for n in g.node if n.domain in ("", "ai.onnx") for o in n.output}
    keep = [vi for vi in g.value_info if vi.name not in inferable]
    if len(keep) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(keep)
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                _drop_inferable_value_info(sub)


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def _has_typed_data(t: onnx.TensorProto) -> bool:
    return bool(
        len(t.float_data) or len(t.int32_data) or len(t.int64_data) or len(t.double_data)
        or len(t.uint64_data) or len(t.string_data)
    )


def from_proto(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
    freeze_initializer_inputs: bool = False,
) -> gs.Graph:
    """Import a validated ModelProto into a gs.Graph with annotations and model data attached.

    ``model`` is changed in place (inferred value_info, initializers moved aside).

    An initializer that is also a main-graph input (IR >= 4) stays a graph input (a gs.Variable)
    unless ``freeze_initializer_inputs``; its initializer is kept aside and written back by the
    exporter while the input exists (see :func:`_finish`).

    Functions the model defines itself in graphpass's reserved ``graphpass.ascend`` domain, with
    bodies graphpass does not write, move to their own domain first (calls too): graphpass's
    device ops are never confused with them.
    """
    from graphpass.ir.device_ops import free_reserved_domain

    free_reserved_domain(model)
    defaults: dict[str, onnx.TensorProto] = {}
    if not freeze_initializer_inputs and model.ir_version >= 4:
        inputs = {i.name for i in model.graph.input}
        if any(t.name in inputs for t in model.graph.initializer):
            keep = []
            for t in model.graph.initializer:
                if t.name in inputs:
                    defaults[t.name] = t
                else:
                    keep.append(t)
            del model.graph.initializer[:]
            model.graph.initializer.extend(keep)
    elif freeze_initializer_inputs:
        inits = {t.name for t in model.graph.initializer}
        if any(i.name in inits for i in model.graph.input):
            keep = [i for i in model.graph.input if i.name not in inits]
            del model.graph.input[:]
            model.graph.input.extend(keep)
    if input_shapes:
        model2 = onnx.ModelProto()
        model2.CopyFrom(model)
        model = model2
        _apply_input_shapes(model, input_shapes)
    if shape_inference:
        inferred = infer_shapes(model)
        if inferred is not model:
            _copy_value_info(inferred.graph, model.graph)
    try:
        with gc_paused():
            graph = gs.import_onnx(model)
    except Exception as e:
        raise BadModelError(f"cannot import the model: {type(e).__name__}: {e}") from e
    annotations.read_from_proto(model.graph, graph)
    _remember_types(model.graph, graph)
    _remember_raw_attrs(model.graph, graph)
    graph.__dict__[_MODEL_INFO] = {
        "metadata_props": {p.key: p.value for p in model.metadata_props},
        "doc_string": model.doc_string,
        "domain": model.domain,
        "model_version": model.model_version,
        "opset_import": [(o.domain, o.version) for o in model.opset_import],
        "input_defaults": defaults,
    }
    toposort(graph)
    return graph


_TYPE_KEY = "_gp_type"


def _remember_types(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    """Keep the TypeProto of every non-tensor value (sequence, optional, map, ...) on its gs tensor.

    gs cannot export optional/map/opaque types and flattens nested sequence types; the
    exporter puts these types back from what is kept here (see :func:`_restore_types`).
    """
    types: dict[str, onnx.TypeProto] = {}
    for g in graph_protos(graph_proto):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value") not in (None, "tensor_type"):
                types[vi.name] = vi.type
    if not types:
        return
    for g in iter_graphs(graph):
        tensors = list(g.inputs) + list(g.outputs) + [t for n in g.nodes for t in list(n.inputs) + list(n.outputs)]
        for t in tensors:
            if t.name in types:
                t.__dict__[_TYPE_KEY] = types[t.name]


_RAW_ATTRS_KEY = "_gp_raw_attrs"
_RAW_ATTR_TYPES = (onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS)


def _node_pairs(graph_proto: onnx.GraphProto, graph: gs.Graph):
    """(NodeProto, gs.Node) pairs of a graph and its subgraphs (gs keeps node order)."""
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        yield proto_node, node
        for gp, g in subgraph_pairs(proto_node, node):
            yield from _node_pairs(gp, g)


def _remember_raw_attrs(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    """Keep attributes gs cannot represent (TYPE_PROTO, e.g. Optional's ``type``) on the node."""
    for proto_node, node in _node_pairs(graph_proto, graph):
        raw = [a for a in proto_node.attribute if a.type in _RAW_ATTR_TYPES]
        if raw:
            node.__dict__[_RAW_ATTRS_KEY] = raw


def _restore_raw_attrs(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    for proto_node, node in _node_pairs(graph_proto, graph):
        raw = node.__dict__.get(_RAW_ATTRS_KEY)
        if raw:
            have = {a.name for a in proto_node.attribute}
            proto_node.attribute.extend(a for a in raw if a.name not in have)


class _types_hidden:
    """During export: hide the dtype of non-tensor values from gs; collect their TypeProtos."""

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self.types: dict[str, onnx.TypeProto] = {}
        self.saved: list[tuple[gs.Tensor, object]] = []

    def __enter__(self):
        for g in iter_graphs(self.graph):
            tensors = list(g.inputs) + list(g.outputs) + [t for n in g.nodes for t in n.outputs]
            for t in tensors:
                tp = t.__dict__.get(_TYPE_KEY)
                if tp is not None and id(t) not in {id(x) for x, _ in self.saved[-1:]}:
                    self.types[t.name] = tp
                    self.saved.append((t, t.dtype))
                    t.dtype = None
        return self.types

    def __exit__(self, *exc):
        for t, dtype in self.saved:
            t.dtype = dtype
        return False


def _restore_types(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> None:
    if not types:
        return
    for g in graph_protos(model.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            tp = types.get(vi.name)
            if tp is not None:
                vi.type.CopyFrom(tp)


def _copy_value_info(src: onnx.GraphProto, dst: onnx.GraphProto) -> int:
    """Put the inferred value_info of ``src`` into ``dst`` (same structure); returns how many of
    dst's own entries contradicted inference (a concrete dim, the rank or the dtype differs) and
    were replaced. Dims inference left unknown keep dst's value."""
    inferred = {vi.name: vi for vi in src.value_info}
    contradicted = 0
    first = None
    for vi in dst.value_info:
        new = inferred.pop(vi.name, None)
        if new is None or new == vi:
            continue
        merged, conflict = _merge_value_info(vi, new)
        if conflict:
            contradicted += 1
            first = first or (vi.name, _dims_text(vi), _dims_text(new))
        vi.CopyFrom(merged)
    dst.value_info.extend(inferred.values())
    outputs = {o.name: o for o in dst.output}
    for o in src.output:
        d = outputs.get(o.name)
        if d is not None and (not d.type.HasField("tensor_type") or not d.type.tensor_type.HasField("shape")):
            if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
                d.type.CopyFrom(o.type)
    if first:
        log.warning("value_info of %d tensor(s) contradicted shape inference (first: '%s' declared %s, inferred %s); "
                    "the inferred shapes are used", contradicted, *first)
    for n_src, n_dst in zip(src.node, dst.node):
        for a_src, a_dst in zip(n_src.attribute, n_dst.attribute):
            if a_src.type == onnx.AttributeProto.GRAPH:
                contradicted += _copy_value_info(a_src.g, a_dst.g)
            elif a_src.type == onnx.AttributeProto.GRAPHS:
                for g_src, g_dst in zip(a_src.graphs, a_dst.graphs):
                    contradicted += _copy_value_info(g_src, g_dst)
    return contradicted


def _dims_text(vi: onnx.ValueInfoProto) -> str:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return "?"
    return "[" + ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim) + "]"


def _merge_value_info(old: onnx.ValueInfoProto, new: onnx.ValueInfoProto) -> tuple[onnx.ValueInfoProto, bool]:
    """Inferred ``new`` over declared ``old``: (merged, whether they contradicted)."""
    if not (old.type.HasField("tensor_type") and new.type.HasField("tensor_type")):
        return new, old.type.WhichOneof("value") != new.type.WhichOneof("value")
    ot, nt = old.type.tensor_type, new.type.tensor_type
    merged = onnx.ValueInfoProto()
    merged.CopyFrom(new)
    conflict = bool(ot.elem_type and nt.elem_type and ot.elem_type != nt.elem_type)
    if not nt.elem_type and ot.elem_type:
        merged.type.tensor_type.elem_type = ot.elem_type
    if not ot.HasField("shape"):
        return merged, conflict
    if not nt.HasField("shape"):
        if not conflict:
            merged.type.tensor_type.shape.CopyFrom(ot.shape)
        return merged, conflict
    if len(ot.shape.dim) != len(nt.shape.dim):
        return merged, True
    for od, md in zip(ot.shape.dim, merged.type.tensor_type.shape.dim):
        if md.HasField("dim_value"):
            if od.HasField("dim_value") and od.dim_value != md.dim_value:
                conflict = True
        elif od.HasField("dim_value") or (od.HasField("dim_param") and not md.HasField("dim_param")):
            md.CopyFrom(od)
    if not old.metadata_props or merged.metadata_props:
        return merged, conflict
    merged.metadata_props.extend(old.metadata_props)
    return merged, conflict


def load(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
    *,
    max_memory: int | str | None = None,
    freeze_initializer_inputs: bool = False,
) -> gs.Graph:
    """Load a model into the graphpass IR (a gs.Graph).

    Args:
        source: a path, the serialized bytes, or a ModelProto.
        input_shapes: fixes graph input dims before shape inference (static-shape specialization).
        shape_inference: run onnx shape inference so passes see tensor shapes and dtypes.
        max_memory: bytes (or "8G") graphpass may hold for this model: the file, its external
            data and every tensor a pass folds (see :mod:`graphpass.ir.limits`).
        freeze_initializer_inputs: an initializer that is also a graph input (IR >= 4) is a
            default the caller may override; by default it stays an input. True treats it as a
            constant (and drops the input), so passes can fold it.
    """
    limit = limits.resolve_max_memory(max_memory)
    model, held = _load_proto(source, True, limit)
    graph = from_proto(model, input_shapes=input_shapes, shape_inference=shape_inference,
                       freeze_initializer_inputs=freeze_initializer_inputs)
    graph.__dict__[_BUDGET] = limits.Budget(limit, held)
    for g in iter_graphs(graph):
        for node in g.nodes:
            for t in node.inputs:
                v = t.__dict__.get("_values") if isinstance(t, gs.Constant) else None
                if type(v) is gs.ir.tensor.LazyValues and _is_on_disk(v.tensor):
                    t._values = ExternalValues(v.tensor)
    return graph


_BUDGET = "_gp_budget"


def budget(graph: gs.Graph) -> limits.Budget:
    """The memory budget of a loaded graph (model + external data held; passes add what they fold).

    A graph built another way gets the default limit, with nothing counted yet.
    """
    b = graph.__dict__.get(_BUDGET)
    if b is None:
        b = graph.__dict__[_BUDGET] = limits.Budget(limits.default_max_memory())
    return b


# --------------------------------------------------------------------------------------------
# saving


def _header(t: onnx.TensorProto) -> onnx.TensorProto:
    """A TensorProto with ``t``'s name, type and dims but none of its data."""
    h = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, doc_string=t.doc_string)
    if t.HasField("segment"):
        h.segment.CopyFrom(t.segment)
    h.metadata_props.extend(t.metadata_props)
    return h


def _export_weightless(graph: gs.Graph) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """Export with every weight over 1 KiB as a data-less header.

    gs's exporter copies every initializer twice (make_graph, then make_model); for a model of
    a gigabyte that was most of the save time. Instead the exporter sees header-only protos
    (swapped in and back, no bytes copied); the caller puts the real tensors in. Returns the
    model and, by name, the original TensorProto (or, for a weight a pass computed, the numpy
    array) of each weight left out. Weights still on disk (:class:`ExternalValues`) are exported
    as their external reference; :func:`to_proto` reads them in, :func:`save` copies them over.
    """
    originals: dict[str, onnx.TensorProto | np.ndarray] = {}
    swapped: list[tuple[gs.ir.tensor.LazyValues, onnx.TensorProto]] = []
    arrays: list[tuple[gs.Constant, np.ndarray]] = []
    seen: set[int] = set()
    for g in iter_graphs(graph):
        for node in g.nodes:
            for t in node.inputs:
                if not isinstance(t, gs.Constant) or id(t) in seen:
                    continue
                seen.add(id(t))
                values = t._values
                if isinstance(values, np.ndarray) and getattr(t, "data_location", None) is not None:
                    # gs copies data_location from the tensor it imported: an array written with
                    # EXTERNAL and no location was a corrupt model (tiny external weights)
                    t.data_location = None
                if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
                    # strings, int4/uint4, bfloat16, float8 (ml_dtypes): gs writes them as raw
                    # bytes of the unpacked array; onnx's own conversion packs them right
                    try:
                        proto = onnx.numpy_helper.from_array(values, t.name)
                    except Exception as e:  # noqa: BLE001 - let gs's exporter say what it cannot do
                        log.debug("cannot convert '%s' (%s): %s", t.name, values.dtype, e)
                    else:
                        arrays.append((t, values))
                        t._values = gs.ir.tensor.LazyValues(proto)
                        continue
                if (isinstance(values, np.ndarray) and values.nbytes > 1024 and values.dtype.kind in "biuf"
                        and getattr(t, "export_dtype", None) in (None, values.dtype)):
                    # a weight a pass computed: the exporter would copy it twice; it gets a header
                    header = onnx.TensorProto(name=t.name, dims=list(values.shape),
                                              data_type=onnx.helper.np_dtype_to_tensor_dtype(values.dtype))
                    arrays.append((t, values))
                    originals[t.name] = values
                    t._values = gs.ir.tensor.LazyValues(header)
                    continue
                if isinstance(values, gs.ir.tensor.LazyValues) and values.nbytes > 1024:
                    original = values.tensor
                    if original.HasField("data_location") and original.data_location == onnx.TensorProto.EXTERNAL:
                        continue
                    swapped.append((values, original))
                    originals[t.name] = original
                    values.tensor = _header(original)
    try:
        with gc_paused(), _types_hidden(graph) as types:
            model = gs.export_onnx(graph, do_type_check=False)
        _restore_types(model, types)
        _restore_raw_attrs(model.graph, graph)
    finally:
        for values, original in swapped:
            values.tensor = original
        for t, arr in arrays:
            t._values = arr
    return model, originals


def _finish(graph: gs.Graph, model: onnx.ModelProto, originals: dict | None = None) -> onnx.ModelProto:
    info = graph.__dict__.get(_MODEL_INFO, {})
    annotations.write_to_proto(graph, model.graph)
    for k, v in info.get("metadata_props", {}).items():
        model.metadata_props.add(key=k, value=v)
    model.doc_string = info.get("doc_string", "")
    model.domain = info.get("domain", "")
    model.model_version = info.get("model_version", 0)
    _merge_opsets(model, info.get("opset_import", []))
    defaults = info.get("input_defaults") or {}
    if defaults:
        have = {t.name for t in model.graph.initializer}
        for i in model.graph.input:
            t = defaults.get(i.name)
            if t is None or i.name in have:
                continue
            if originals is not None and not _is_on_disk(t) and t.ByteSize() > 1024:
                model.graph.initializer.append(_header(t))  # the bytes by reference, as for weights
                originals[i.name] = t
            else:
                model.graph.initializer.append(_read_on_disk(t) if _is_on_disk(t) else t)
    min_ir = 4 if any(len(g.initializer) for g in graph_protos(model.graph)) else 3
    if len(model.functions):
        min_ir = 8
    if model.ir_version < min_ir:
        model.ir_version = min_ir
    return model


def _export(graph: gs.Graph, emit: str = "device") -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    if emit not in ("device", "portable"):
        raise UsageError(f"--emit must be 'device' or 'portable', got '{emit}'")
    toposort(graph)
    try:
        model, originals = _export_weightless(graph)
    except Exception as e:
        raise BadModelError(f"cannot export the graph: {type(e).__name__}: {e}") from e
    model = _finish(graph, model, originals)
    if emit == "portable":
        from graphpass.ir.device_ops import to_portable

        model = to_portable(model)
    return model, originals


def to_proto(graph: gs.Graph, emit: str = "device") -> onnx.ModelProto:
    """Export the IR as a complete ModelProto with annotations and model-level data restored.

    Args:
        emit: ``"device"`` keeps ``graphpass.ascend`` ops as nodes (with their function
            bodies); ``"portable"`` inlines them into standard ONNX (see ``device_ops``).
    """
    model, originals = _export(graph, emit)
    for g in graph_protos(model.graph):
        for init in g.initializer:
            original = originals.get(init.name)
            if original is not None:
                init.CopyFrom(_as_proto(init.name, original))
            elif _is_on_disk(init):
                init.CopyFrom(_read_on_disk(init))
    return model


def snapshot(graph: gs.Graph) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``graph`` to roll back to, without copying its weights: the structure as a
    weightless proto, the weights by reference. Passes replace a Constant rather than change
    its array in place, so the referenced weights are still the old ones at restore time."""
    return _export(graph, "device")


def restore(snap: tuple[onnx.ModelProto, dict]) -> gs.Graph:
    """The graph :func:`snapshot` saw."""
    model, originals = snap
    graph = from_proto(model, shape_inference=False)
    defaults = model_info(graph).get("input_defaults") or {}
    for name in list(defaults):
        if isinstance(originals.get(name), onnx.TensorProto):
            defaults[name] = originals[name]  # the snapshot held a header; the bytes by reference
    for g in iter_graphs(graph):
        for node in g.nodes:
            for t in node.inputs:
                if not isinstance(t, gs.Constant):
                    continue
                original = originals.get(t.name)
                if isinstance(original, np.ndarray):
                    t._values = original
                elif original is not None:
                    t._values = gs.ir.tensor.LazyValues(original)
                elif type(t._values) is gs.ir.tensor.LazyValues and _is_on_disk(t._values.tensor):
                    t._values = ExternalValues(t._values.tensor)
    return graph


def _as_proto(name: str, original: "onnx.TensorProto | np.ndarray") -> onnx.TensorProto:
    if isinstance(original, np.ndarray):
        return onnx.numpy_helper.from_array(original, name)
    return original


def _nbytes(original: "onnx.TensorProto | np.ndarray") -> int:
    if isinstance(original, np.ndarray):
        return int(original.nbytes)
    return _numel(original) * _itemsize(original)


def _merge_opsets(model: onnx.ModelProto, original: list[tuple[str, int]]) -> None:
    """Keep every opset the input imported (gs drops unused custom ones); add what nodes need."""
    have = {o.domain: o for o in model.opset_import}
    for domain, version in original:
        if domain not in have:
            model.opset_import.add(domain=domain, version=version)
        else:
            have[domain].version = version
    # '' and 'ai.onnx' are the same domain; keep one.
    domains = [o.domain for o in model.opset_import]
    if "" in domains and "ai.onnx" in domains:
        keep = [o for o in model.opset_import if o.domain != "ai.onnx"]
        del model.opset_import[:]
        model.opset_import.extend(keep)


def _payload_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for t in external_data_helper._get_all_tensors(model):
        total += len(t.raw_data)
        if not t.raw_data:
            total += 8 * _numel(t) if _has_typed_data(t) else 0
    return total


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path whose folder does not exist or that is a folder (before any work)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"output folder '{parent}' does not exist")
    if p.is_dir():
        raise UsageError(f"output path '{p}' is a folder")
    return p


def save_proto(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool | None = None) -> Path:
    """Write ``model`` atomically; external data next to it when asked or when past 2 GB.

    The external data file is ``<name>.data`` in the same folder (a relative location).
    """
    out = check_output_path(path)
    if external_data is None:
        external_data = _payload_bytes(model) > EXTERNAL_DATA_THRESHOLD
    folder = out.parent if str(out.parent) else Path(".")
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=folder))
    try:
        tmp_model = tmpdir / out.name
        if external_data:
            data_name = out.name + ".data"
            onnx.save_model(
                model,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=1024,
                convert_attribute=False,
            )
            if (tmpdir / data_name).exists():
                os.replace(tmpdir / data_name, folder / data_name)
        else:
            with open(tmp_model, "wb") as f:
                f.write(model.SerializeToString())
        os.replace(tmp_model, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out


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


def save(graph: gs.Graph, path: str | os.PathLike, external_data: bool | None = None, emit: str = "portable") -> Path:
    """Export ``graph`` and write it atomically, without assembling the weights in memory twice.

    ``emit="portable"`` (the default: the next step is ATC or another runtime) inlines the
    ``graphpass.ascend`` device ops into standard ONNX; ``emit="device"`` keeps them.

    The weightless model is serialized first; each main-graph weight is then appended as its
    own ``graph.initializer`` record (protobuf merges repeated embedded-message fields, so the
    file parses as one model). Past 2 GB, or when ``external_data`` is True, the weights go to
    ``<name>.data`` beside the model instead.
    """
    out = check_output_path(path)
    model, originals = _export(graph, emit)
    main_inits = {init.name for init in model.graph.initializer}
    for g in list(graph_protos(model.graph))[1:]:  # weights inside subgraphs: put back in place
        for init in g.initializer:
            if init.name in originals and init.name not in main_inits:
                init.CopyFrom(_as_proto(init.name, originals.pop(init.name)))
            elif _is_on_disk(init):
                init.CopyFrom(_read_on_disk(init))
    on_disk = sum(int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
                  for t in model.graph.initializer if _is_on_disk(t))
    payload = sum(_nbytes(t) for t in originals.values()) + _payload_bytes(model) + on_disk
    if external_data is None:
        external_data = payload > EXTERNAL_DATA_THRESHOLD
    folder = out.parent if str(out.parent) else Path(".")
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=folder))
    try:
        tmp_model = tmpdir / out.name
        if external_data:
            _write_external(model, originals, tmpdir, out.name)
            data_name = out.name + ".data"
            if (tmpdir / data_name).exists():
                os.replace(tmpdir / data_name, folder / data_name)
        else:
            _write_streaming(model, originals, tmp_model)
        os.replace(tmp_model, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out


def _itemsize(t: onnx.TensorProto) -> int:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:  # noqa: BLE001 - unusual types: a rough size is enough for the 2 GB choice
        return 4


def _write_streaming(model: onnx.ModelProto, originals: dict, dst: Path) -> None:
    disk = [i for i in model.graph.initializer if i.name not in originals and _is_on_disk(i)]
    keep = [i for i in model.graph.initializer if i.name not in originals and not _is_on_disk(i)]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    records = [(name, lambda name=name, o=o: _as_proto(name, o)) for name, o in originals.items()]
    records += [(t.name, lambda t=t: _read_on_disk(t)) for t in disk]
    with open(dst, "wb") as f:
        f.write(model.SerializeToString())
        for _, make in records:  # one weight in memory at a time
            body = make().SerializeToString()
            inner = _len_field(_INITIALIZER_FIELD, len(body))
            f.write(_len_field(_GRAPH_FIELD, len(inner) + len(body)))
            f.write(inner)
            f.write(body)


def _write_external(model: onnx.ModelProto, originals: dict, folder: Path, name: str) -> None:
    from onnx import numpy_helper

    data_name = name + ".data"
    offset = 0
    with open(folder / data_name, "wb") as data:
        for init in model.graph.initializer:
            original = originals.get(init.name)
            if isinstance(original, np.ndarray):
                raw = np.ascontiguousarray(original).reshape(-1).view(np.uint8).data  # len() = bytes
            elif original is not None:
                raw = original.raw_data if original.HasField("raw_data") else numpy_helper.to_array(original).tobytes()
            elif _is_on_disk(init):
                raw = _read_on_disk(init).raw_data
            elif init.ByteSize() > 1024 and (init.HasField("raw_data") or _has_typed_data(init)):
                raw = init.raw_data if init.HasField("raw_data") else numpy_helper.to_array(init).tobytes()
            else:
                continue
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
            offset += len(raw)
    with open(folder / name, "wb") as f:
        f.write(model.SerializeToString())


def model_info(graph: gs.Graph) -> dict:
    return graph.__dict__.get(_MODEL_INFO, {})


def opset_of(graph: gs.Graph, domain: str = "") -> int | None:
    for d, v in model_info(graph).get("opset_import", []):
        if (d or "") == domain or (domain == "" and d == "ai.onnx"):
            return v
    return graph.opset if domain == "" else None


# --------------------------------------------------------------------------------------------
# reading a model as it is stored (graphpass diff)


def read_as_stored(source: ModelSource, where: str | None = None) -> onnx.ModelProto:
    """A model as stored: parsed and checked as :func:`load_proto` does (external data files must
    exist, lie in the model's folder and hold the byte ranges named), without the opset upgrade
    and with external data left on disk (locations made absolute; read them with
    :func:`iter_external_bytes`). A ModelProto is checked in place, not copied.

    Raises:
        BadModelError: with one line saying what is wrong and where.
    """
    if isinstance(source, onnx.ModelProto):
        _load_external_data(source, None, where or "<model>", lazy=True)
        _validate_at(source, where or "<model>")
        return source
    if isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), where or "<bytes>")
        _load_external_data(model, None, where or "<bytes>", lazy=True)
        _validate_at(model, where or "<bytes>")
        return model
    path = Path(source)
    where = where or str(path)
    data = _read_regular_file(path, limits.resolve_max_memory(None), "model")
    model = _parse(data, where)
    del data
    _load_external_data(model, path.resolve().parent, where, lazy=True)
    _validate_at(model, where)
    return model


def _validate_at(model: onnx.ModelProto, where: str) -> None:
    """:func:`validate`, its message prefixed with where the model came from."""
    try:
        validate(model)
    except BadModelError as e:
        raise BadModelError(f"{where}: {e}") from None


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


class InvalidOutputError(RuntimeError):
    """graphpass wrote a model the ONNX checker refuses from an input it accepts: a graphpass bug
    (exit 3), never the user's."""


def _checker_problem(model: str | onnx.ModelProto) -> str | None:
    """The full ONNX checker's first complaint about ``model`` (a path or a proto), or None."""
    try:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:  # noqa: BLE001
            if "Cannot parse data from external tensors" not in str(e):
                raise
            # onnx's shape inference cannot read a shape operand kept in external data: that is
            # the checker's limit, not the model's; the structural checks still run
            onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError and C++ errors alike
        text = str(e).strip().splitlines()
        return (text[0] if text else type(e).__name__)[:400]
    return None


def check_written(path: str | Path, source: ModelSource) -> None:
    """Refuse to hand on an invalid model: run the full ONNX checker on the model graphpass wrote
    at ``path``; if it fails and the input ``source`` fails it too, the input is at fault
    (:class:`BadModelError`, exit 2, naming the checker's complaint); if the input passes, graphpass
    broke it (:class:`InvalidOutputError`, exit 3). Only on failure is the input checked."""
    problem = _checker_problem(str(path))
    if problem is None:
        return
    original = str(source) if isinstance(source, (str, Path)) else (
        source if isinstance(source, onnx.ModelProto) else _parse(bytes(source), "<bytes>"))
    where = str(source) if isinstance(source, (str, Path)) else "<model>"
    input_problem = _checker_problem(original)
    if input_problem is not None:
        raise BadModelError(f"{where}: not a valid ONNX model, and graphpass does not repair this: {input_problem}")
    raise InvalidOutputError(f"graphpass wrote a model the ONNX checker refuses (a graphpass bug): {problem}")
