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
import tempfile
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
import onnx.version_converter
import onnx_graphsurgeon as gs
from onnx import external_data_helper

from graphpass.errors import BadModelError, UsageError
from graphpass.ir import annotations
from graphpass.ir.graph import graph_protos, iter_graphs, subgraph_pairs, toposort

__all__ = [
    "MIN_OPSET",
    "ModelSource",
    "load",
    "load_proto",
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


def load_proto(source: ModelSource, lazy_external: bool = False) -> onnx.ModelProto:
    """Read and validate a ModelProto from a path, bytes or a ModelProto; external data loaded.

    ``lazy_external``: leave external data on disk; each external tensor's location becomes the
    absolute path of its (checked) file, which :func:`load` reads tensor by tensor on demand.

    Raises:
        BadModelError: with one line saying what is wrong and where.
    """
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)  # never mutate the caller's proto
        base_dir = None
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "<bytes>")
        base_dir = None
    else:
        path = Path(source)
        if not path.exists():
            raise BadModelError(f"{path}: no such file")
        if path.is_dir():
            raise BadModelError(f"{path}: is a folder, not an ONNX model")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise BadModelError(f"{path}: cannot read: {e.strerror}") from e
        model = _parse(data, str(path))
        base_dir = path.resolve().parent
    _load_external_data(model, base_dir, str(source) if not isinstance(source, (bytes, bytearray, onnx.ModelProto)) else "<model>",
                        lazy=lazy_external)
    validate(model)
    return _upgrade_old_opset(model)


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


def _load_external_data(model: onnx.ModelProto, base_dir: Path | None, where: str, lazy: bool = False) -> None:
    tensors = list(_external_tensors(model))
    if not tensors:
        return
    if base_dir is None:
        raise BadModelError(
            f"{where}: the model refers to external data; load it from its file so the data can be found"
        )
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if not location:
            raise BadModelError(f"{where}: tensor '{t.name}' has external data without a location")
        if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location[:3]:
            raise BadModelError(
                f"{where}: tensor '{t.name}' has external data at an absolute path '{location}'; "
                "external data must lie in the model's folder"
            )
        target = (base_dir / location).resolve()
        if base_dir.resolve() not in target.parents and target != base_dir.resolve():
            raise BadModelError(
                f"{where}: tensor '{t.name}' has external data '{location}' outside the model's folder"
            )
        if not target.is_file():
            raise BadModelError(f"{where}: external data file '{location}' of tensor '{t.name}' is missing")
        size = target.stat().st_size
        offset = int(info.get("offset", 0) or 0)
        length = int(info.get("length", 0) or 0)
        if offset + length > size:
            raise BadModelError(
                f"{where}: tensor '{t.name}' reads bytes {offset}..{offset + length} of '{location}', "
                f"which has only {size}"
            )
    if lazy:
        for t in tensors:
            for e in t.external_data:
                if e.key == "location":
                    e.value = str((base_dir / e.value).resolve())
        return
    try:
        external_data_helper.load_external_data_for_model(model, str(base_dir))
    except Exception as e:
        raise BadModelError(f"{where}: cannot load external data: {e}") from e


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


def validate(model: onnx.ModelProto) -> None:
    """Structural checks that make the rest of graphpass safe; linear in the model size."""
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
    keeps models over 2 GB inferable. Symbolic dims keep their names. Returns the inferred
    copy; on failure logs a warning and returns ``model`` unchanged.
    """
    light = _light_copy(model)
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # inference is advisory: passes fall back to unknown shapes
        log.warning("shape inference failed, continuing without inferred shapes: %s", str(e).splitlines()[0])
        return model


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4), producer_name=model.producer_name)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    dst.sparse_initializer.extend(src.sparse_initializer)
    inputs = {i.name for i in src.input}
    for t in src.initializer:
        if _numel(t) * _itemsize(t) > 1024 or (t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL):
            if t.name not in inputs:
                dst.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            dst.initializer.append(t)
    return light


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
) -> gs.Graph:
    """Import a validated ModelProto into a gs.Graph with annotations and model data attached."""
    if input_shapes:
        model2 = onnx.ModelProto()
        model2.CopyFrom(model)
        model = model2
        _apply_input_shapes(model, input_shapes)
    if shape_inference:
        inferred = infer_shapes(model)
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


def _copy_value_info(src: onnx.GraphProto, dst: onnx.GraphProto) -> None:
    """Put the inferred value_info of ``src`` into ``dst`` (same structure), keeping dst's own."""
    have = {vi.name for vi in dst.value_info} | {o.name for o in dst.output}
    outputs = {o.name: o for o in dst.output}
    for vi in src.value_info:
        if vi.name not in have:
            dst.value_info.append(vi)
    for o in src.output:
        d = outputs.get(o.name)
        if d is not None and (not d.type.HasField("tensor_type") or not d.type.tensor_type.HasField("shape")):
            if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
                d.type.CopyFrom(o.type)
    for n_src, n_dst in zip(src.node, dst.node):
        for a_src, a_dst in zip(n_src.attribute, n_dst.attribute):
            if a_src.type == onnx.AttributeProto.GRAPH:
                _copy_value_info(a_src.g, a_dst.g)
            elif a_src.type == onnx.AttributeProto.GRAPHS:
                for g_src, g_dst in zip(a_src.graphs, a_dst.graphs):
                    _copy_value_info(g_src, g_dst)


def load(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
) -> gs.Graph:
    """Load a model into the graphpass IR (a gs.Graph).

    Args:
        source: a path, the serialized bytes, or a ModelProto.
        input_shapes: fixes graph input dims before shape inference (static-shape specialization).
        shape_inference: run onnx shape inference so passes see tensor shapes and dtypes.
    """
    graph = from_proto(load_proto(source, lazy_external=True), input_shapes=input_shapes, shape_inference=shape_inference)
    for g in iter_graphs(graph):
        for node in g.nodes:
            for t in node.inputs:
                v = t.__dict__.get("_values") if isinstance(t, gs.Constant) else None
                if type(v) is gs.ir.tensor.LazyValues and _is_on_disk(v.tensor):
                    t._values = ExternalValues(v.tensor)
    return graph


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
                if not isinstance(values, gs.ir.tensor.LazyValues) and t.data_location == onnx.TensorProto.EXTERNAL:
                    # an external weight a pass read (gs keeps the loaded array): its bytes are
                    # written inline now, so its proto must not say EXTERNAL (a corrupt model)
                    t.data_location = None
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


def _finish(graph: gs.Graph, model: onnx.ModelProto) -> onnx.ModelProto:
    info = graph.__dict__.get(_MODEL_INFO, {})
    annotations.write_to_proto(graph, model.graph)
    for k, v in info.get("metadata_props", {}).items():
        model.metadata_props.add(key=k, value=v)
    model.doc_string = info.get("doc_string", "")
    model.domain = info.get("domain", "")
    model.model_version = info.get("model_version", 0)
    _merge_opsets(model, info.get("opset_import", []))
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
    model = _finish(graph, model)
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
