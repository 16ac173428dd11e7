"""Serialization: ModelProto <-> the graphpass IR (a :class:`~graphpass.ir.model.Model` around a
gs.Graph), with everything gs would lose kept.

What this layer adds to onnx-graphsurgeon:

* loading: validation with one clear error per problem (:mod:`graphpass.ir.validate`), external
  data confined to the model's folder (:mod:`graphpass.ir.external`), sparse initializers made
  dense, models older than :data:`MIN_OPSET` converted, shape inference
  (:mod:`graphpass.ir.inference`);
* model-level data gs does not carry (kept on the :class:`Model`), graphpass annotations (see
  :mod:`graphpass.ir.annotations`), non-tensor value types and TYPE_PROTO attributes;
* export that never changes the graph it reads (:func:`to_proto`, :func:`save`,
  :func:`snapshot`: the graph is sorted for export and its node order put back), and saving
  through the one atomic writer (:func:`graphpass.ir.files.atomic_output`), external data
  automatically past 2 GB.

IR versions below 4 list every initializer as a graph input; gs imports such initializers as
constants (which is how onnxruntime treats them for IR < 4), so a saved model is raised to IR 4,
which does not change the meaning of any opset-9+ op. A model that carries local functions is
raised to IR 8 (the first IR with functions); the opset is never changed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
import onnx.version_converter
import onnx_graphsurgeon as gs

from graphpass.errors import BadModelError, ResourceLimitError, UsageError
from graphpass.ir import annotations, external, fast_export, fast_import, limits, profiling
from graphpass.ir import device_ops_attention as _attention
from graphpass.ir.external import (
    ExternalValues,
    _as_proto,
    _header,
    _is_on_disk,
    _load_external_data,
    _nbytes,
    _payload_bytes,
    _read_on_disk,
)
from graphpass.ir.files import atomic_output, check_output_path, read_regular_file
from graphpass.ir.graph import graph_attributes, graph_protos, has_subgraph, iter_graphs, subgraph_pairs, toposort
from graphpass.ir.inference import _apply_input_shapes, _copy_output_types, _copy_value_info, infer_shapes_listed
from graphpass.ir.shapes import record_given
from graphpass.ir.model import DEFAULT_EMIT, EMIT_FORMS, Model, model_of
from graphpass.ir.validate import GraphList, _validate_at, parse, validate, validated_graphs  # noqa: F401 - validate: re-exported

__all__ = [
    "MIN_OPSET",
    "ModelSource",
    "from_proto",
    "gc_batched",
    "gc_frozen",
    "gc_paused",
    "load",
    "load_proto",
    "read_as_stored",
    "restore",
    "save",
    "save_proto",
    "snapshot",
    "to_proto",
]

log = logging.getLogger(__name__)

gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR


ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]


#: The oldest default-domain opset the passes work in. An older model is converted to it with
#: onnx's version converter on load (logged); one the converter cannot convert is refused.
MIN_OPSET = 7


class gc_paused:
    """Pause Python's cyclic GC while building or exporting a big graph.

    gs creates several objects per node; with the collector on, each generation-2 sweep walks
    the whole (growing) heap, which made importing a 100k-node model about 50% slower.
    """

    def __init__(self, settle: bool = False):
        self.settle = settle

    def __enter__(self):
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.settle and gc.get_freeze_count() == 0:
            # everything made in the block moves to the oldest generation (freeze then unfreeze
            # splices the lists: no sweep): the first young collection after a load walked every
            # object of the graph just built (a 100k-node CNN: ~1 s) to find them all alive. Not
            # when anything is frozen (a pipeline's gc_frozen, a caller's own): unfreeze would
            # release it too
            gc.freeze()
            gc.unfreeze()
        if self.was_enabled:
            gc.enable()
        return False


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). After a load the parsed ModelProto is freed, but the allocator keeps its pages,
    and Python's own objects come from separate mmap'ed arenas that never reuse them: without
    this the process's peak RSS counted the whole parse again (issue 22)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: musl, macOS, Windows
        return None


class gc_frozen:
    """Move every object alive now out of the collector's sight for the duration (gc.freeze).

    After a big model is loaded, each generation-2 sweep during the passes would walk all of
    its gs objects again; freezing them cut the cleanup pipeline on a 100k-node graph from
    7.3 s to 4.9 s. Objects created inside the block are still collected. Nested blocks (an
    estimate inside the pass manager's run) freeze what was made since, and only the outermost
    block unfreezes, and only when nothing was frozen before it (a caller's own ``gc.freeze``
    is left alone): an inner block that unfroze on exit put the whole graph back in sight of
    every sweep for the rest of the pipeline (a 100k-node run took ~1.8x as long, issue 22).
    """

    _depth = 0  # blocks open now (process-wide: the collector is too)
    _unfreeze = False  # the outermost block found nothing frozen: it freezes, and unfreezes on exit

    def __enter__(self):
        cls = gc_frozen
        if cls._depth == 0:
            cls._unfreeze = gc.get_freeze_count() == 0
        cls._depth += 1
        if cls._unfreeze:
            gc.freeze()
        # else the caller froze objects of its own (a pre-fork server's start-up): gc.unfreeze
        # cannot tell theirs from ours, so freezing the graph would keep it (and every cycle
        # the run drops) out of the collector for the rest of the process: no freeze at all

    def __exit__(self, *exc):
        cls = gc_frozen
        cls._depth -= 1
        if cls._depth == 0 and cls._unfreeze:
            gc.unfreeze()
        return False


class gc_batched:
    """Inside a pipeline run: the graph frozen (:class:`gc_frozen`), and the young generation
    collected every ``young`` allocations instead of every 700 (the passes and estimates make
    and drop many small objects: a 100k-node CNN pipeline spent ~20% of its time in those
    sweeps). On exit one full collection frees what the run removed from the graph (gs's nodes
    and tensors hold each other in cycles; frozen, they wait for it) before the caller exports
    (without it the export of a 100k-node CNN raised the peak by 80 MB). That collection walks
    the caller's whole heap, so it runs only for a graph of at least ``collect_nodes`` nodes
    (``nodes``, given by the caller): a small graph's garbage is small, and a process that runs
    thousands of small pipelines (the test suite, a zoo worker) paid a full sweep of its heap each.
    """

    def __init__(self, young: int = 100_000, nodes: int = 0, collect_nodes: int = 20_000):
        self.young = young
        self.collect = nodes >= collect_nodes

    def __enter__(self):
        self.threshold = gc.get_threshold()
        if self.threshold[0]:  # 0: the caller turned automatic collection off; leave it off
            gc.set_threshold(max(self.threshold[0], self.young), *self.threshold[1:])
        self.frozen = gc_frozen()
        self.frozen.__enter__()

    def __exit__(self, *exc):
        self.frozen.__exit__(*exc)
        gc.set_threshold(*self.threshold)
        if self.collect and gc_frozen._depth == 0 and gc.isenabled():
            gc.collect()
        return False


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


#: what :func:`_load_proto` found of the model's graphs (``list(graph_protos(model.graph))``), or None
_Graphs = "list[onnx.GraphProto] | None"


@profiling.timed("read and validate")
def _load_proto(source: ModelSource, lazy_external: bool, limit: int
                ) -> tuple[onnx.ModelProto, int, int, _Graphs, "list[onnx.TensorProto] | None"]:
    """:func:`load_proto`, the bytes graphpass will hold for it (model + external data, sparse
    tensors made dense), the bytes of the source itself (model + external data), its graphs
    in :func:`graph_protos`' order when validation's walk listed them (else None), and its
    tensors in external data (``list(external._external_tensors(model))``; None when the
    opset conversion made a new model)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)  # never mutate the caller's proto
        base_dir = None
        held = model.ByteSize()
    elif isinstance(source, (bytes, bytearray)):
        model = parse(bytes(source), "<bytes>")
        base_dir = None
        held = len(source)
    else:
        path = Path(source)
        data = read_regular_file(path, limit, "model")
        held = len(data)
        model = parse(data, str(path))
        del data
        base_dir = path.resolve().parent
    where = str(source) if not isinstance(source, (bytes, bytearray, onnx.ModelProto)) else "<model>"
    graphs = validated_graphs(model, where)
    # validation's walk met every tensor of the graphs (not the functions'): none external, none to list
    skip = graphs is not None and not graphs.external and not len(model.functions)
    on_disk = [] if skip else list(external._external_tensors(model))
    held += _load_external_data(model, base_dir, where, lazy=lazy_external, limit=limit - held, tensors=on_disk)
    limits.Budget(limit).require(held, f"{where}: the model and its external data")
    source_bytes = held
    held += _densify_sparse(model, where, limit - held, graphs)
    upgraded = _upgrade_old_opset(model)
    if upgraded is not model:
        return upgraded, held, source_bytes, None, None
    return model, held, source_bytes, graphs, on_disk


def _densify_sparse(model: onnx.ModelProto, where: str, room: int, graphs: _Graphs = None) -> int:
    """Replace every sparse initializer by the dense initializer of the same name, dtype and
    values (onnx-graphsurgeon has no sparse tensors). Returns the bytes added; the dense size
    is computed from the dims first and refused above ``room``. ``graphs``: the model's graphs
    when the caller has them."""
    added = 0
    for g in graphs if graphs is not None else graph_protos(model.graph):
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
                raise limits.over_memory(
                    f"{where}: sparse initializer '{name}' would take {nbytes} bytes dense, over the memory limit")
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
        model = parse(bytes(source), where or "<bytes>")
        _load_external_data(model, None, where or "<bytes>", lazy=True)
        _validate_at(model, where or "<bytes>")
        return model
    path = Path(source)
    where = where or str(path)
    data = read_regular_file(path, limits.resolve_max_memory(None), "model")
    model = parse(data, where)
    del data
    _load_external_data(model, path.resolve().parent, where, lazy=True)
    _validate_at(model, where)
    return model


@profiling.timed("import")
def from_proto(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
    freeze_initializer_inputs: bool = False,
    dims: Mapping[str, int] | None = None,
    graphs: _Graphs = None,
    *,
    lean: bool = False,
) -> gs.Graph:
    """Import a validated ModelProto into a gs.Graph with annotations and model data attached.

    ``model`` is changed in place (inferred value_info, initializers moved aside). ``graphs``:
    ``list(graph_protos(model.graph))`` when the caller has it (the loader, from validation).
    ``lean``: the caller discards ``model`` after (the loader): a model without bodies or
    value_info of its own may then not get the inferred value_info; the import reads it from
    inference's list (:func:`~graphpass.ir.inference.infer_shapes_listed`), the same graph.

    An initializer that is also a main-graph input (IR >= 4) stays a graph input (a gs.Variable)
    unless ``freeze_initializer_inputs``; its initializer is kept aside and written back by the
    exporter while the input exists (see :func:`_finish`).

    Functions the model defines itself in graphpass's reserved ``graphpass.ascend`` domain, with
    bodies graphpass does not write, move to their own domain first (calls too): graphpass's
    device ops are never confused with them.
    """
    from graphpass.ir.device_ops import DOMAIN, free_reserved_domain

    # what validation's walk saw of the nodes (the loader's graphs): without a function, a node
    # in graphpass's domain or a TYPE_PROTO attribute, the walks looking for them find nothing
    seen = graphs if isinstance(graphs, GraphList) else None
    outputs = seen.outputs if seen is not None else None  # the main graph's node outputs, validated
    if seen is None or len(model.functions) or DOMAIN in seen.node_domains:
        free_reserved_domain(model)
        outputs = None
    raw_attrs = seen is None or not seen.attr_types.isdisjoint(_RAW_ATTR_TYPES)
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
    if graphs is None:
        graphs = list(graph_protos(model.graph))  # nothing below adds or removes a body
    declared = {vi.name for g in graphs for vi in g.value_info}
    if input_shapes or dims:
        model2 = onnx.ModelProto()
        model2.CopyFrom(model)
        model = model2
        graphs = list(graph_protos(model.graph))
        given = _apply_input_shapes(model, input_shapes, dims)
    value_infos = None
    if shape_inference:
        bodies = len(graphs) > 1
        listed = lean and not bodies and not len(model.graph.value_info)
        inferred, value_infos = infer_shapes_listed(model, bodies=bodies, outputs=outputs, listed=listed)
        if inferred is not model:
            if value_infos is not None:  # the import reads them from the list: only the outputs' types
                _copy_output_types(inferred.graph, model.graph)
            else:
                _copy_value_info(inferred.graph, model.graph, bodies=bodies)
        del inferred  # a whole second copy of the graph: not kept through the import (issue 22)
    with gc_paused():  # the whole build: its objects are all alive, a sweep would find nothing
        return _build(model, defaults, declared, given if (input_shapes or dims) else None, graphs, raw_attrs,
                      value_infos)


def _build(model: onnx.ModelProto, defaults: dict, declared: set[str], given, graphs: list | None = None,
           raw_attrs: bool = True, value_infos: "list[tuple] | None" = None) -> gs.Graph:
    made = fast_import.Made()
    try:
        graph = fast_import.import_onnx(model, made, value_infos)
    except Exception as e:
        raise BadModelError(f"cannot import the model: {type(e).__name__}: {e}") from e
    if not isinstance(graphs, GraphList) or graphs.metadata:  # else validation's walk saw no metadata_props
        annotations.read_from_proto(model.graph, graph)
    if given is not None:
        record_given(graph, *given)
    # the import looked at every value info's type: without one other than a tensor's, none to keep
    kept_types = _remember_types(model.graph, graph, graphs) if not made.complete or made.other_types else False
    if raw_attrs:  # else no node has a TYPE_PROTO(S) attribute (validation's walk saw every one)
        _remember_raw_attrs(model.graph, graph)
    Model(
        graph,
        opset_imports={o.domain: o.version for o in model.opset_import},
        metadata_props={p.key: p.value for p in model.metadata_props},
        doc_string=model.doc_string,
        domain=model.domain,
        model_version=model.model_version,
        input_defaults=defaults,
        meta={DECLARED_VALUE_INFO: declared},
    )  # attaches itself to the graph (the back-reference, see graphpass.ir.model)
    _release_proto(graph, kept_types, made if not raw_attrs else None, graphs is None or len(graphs) > 1)
    # a graph without bodies whose every reader came after its tensor's writer is sorted already
    if made.unsorted or not made.complete or graphs is None or len(graphs) > 1:
        toposort(graph)
    return graph


def _own(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _release_proto(graph: gs.Graph, kept_types: bool = True, made: "fast_import.Made | None" = None,
                   bodies: bool = True) -> None:
    """Give the imported graph its own copies of the protobuf parts it keeps (weights' headers
    and embedded bytes, opset imports, kept types and attributes): a part of the parsed
    ModelProto keeps the whole parse alive (protobuf allocates a message's parts in one arena),
    nodes and value_info included: about 0.6 KB per node that nothing reads after the import
    (issue 22). ``kept_types=False``: :func:`_remember_types` kept none (no tensor is looked at
    for one). ``made``: what the import made (:class:`~graphpass.ir.fast_import.Made`), given
    when no node keeps raw attributes: when it lists every Constant and no type was kept, the
    weights are found in it, not by a walk of every node's tensors. ``bodies=False``: the
    caller knows no node holds a graph."""
    model = model_of(graph, attach=False)
    holder = onnx.GraphProto()  # the weights' copies, in one arena (one per copy costs ~0.5 KB)
    if made is not None and made.complete and not kept_types:
        _release_made(graph, made, holder, bodies)
    else:
        _release_walk(graph, kept_types, holder)
    if model is not None and model.input_defaults:
        model.input_defaults = {k: _own(v) for k, v in model.input_defaults.items()}


def _release_made(graph: gs.Graph, made: "fast_import.Made", holder: onnx.GraphProto, bodies: bool) -> None:
    """:func:`_release_walk` for an import that listed its Constants: the same copies. The walk
    meets a Constant a node reads, one a graph outputs, or one a node holds as an attribute;
    one the model has but nothing reads (an unused initializer) is left to go with the parse."""
    graphs = list(iter_graphs(graph)) if bodies else [graph]
    outputs = {id(t) for g in graphs for t in g.outputs}
    in_attrs = made.attributes
    for g in graphs:
        if g.import_domains is not None:
            g.import_domains = [_own(o) for o in g.import_domains]
    add = holder.initializer.add
    for c in made:
        if c.outputs or id(c) in outputs or id(c) in in_attrs:
            v = c._values
            own = add()
            own.CopyFrom(v.tensor)
            v.tensor = own
            v.shape = own.dims


def _release_walk(graph: gs.Graph, kept_types: bool, holder: onnx.GraphProto) -> None:
    lazy, tensor_proto = gs.ir.tensor.LazyValues, onnx.TensorProto
    roots = [graph, *(graph.functions or ())]
    done: set[int] = set()
    for root in roots:
        for g in iter_graphs(root):
            if g.import_domains is not None:
                g.import_domains = [_own(o) for o in g.import_domains]
            tensors = list(g.inputs) + list(g.outputs)
            for n in g.nodes:
                tensors.extend(n.inputs)
                tensors.extend(n.outputs)
                attrs = n.attrs
                if attrs:
                    for v in attrs.values():
                        if isinstance(v, gs.Constant):
                            tensors.append(v)
                raw = n.__dict__.get(_RAW_ATTRS_KEY)
                if raw:
                    n.__dict__[_RAW_ATTRS_KEY] = [_own(a) for a in raw]
            for t in tensors:
                d = t.__dict__
                v = d.get("_values")
                if v is not None and isinstance(v, lazy) and id(v) not in done:
                    done.add(id(v))
                    if isinstance(v.tensor, tensor_proto):
                        own = holder.initializer.add()
                        own.CopyFrom(v.tensor)
                    else:  # a SparseTensorProto
                        own = _own(v.tensor)
                    v.tensor = own
                    v.shape = own.dims
                if kept_types:
                    kept = d.get(_TYPE_KEY)
                    if kept is not None:
                        d[_TYPE_KEY] = _own(kept)


_TYPE_KEY = "_gp_type"

#: ``Model.meta`` key: the :class:`~graphpass.ir.external.ExternalLayout` of the loaded model's
#: external data; :func:`save` writes the weights the same way (one file or one per tensor,
#: the same size threshold) beside the output, never into the input's data files.
EXTERNAL_LAYOUT = "graphpass.external_layout"
#: Model.meta key: bytes of the model as loaded (the file or bytes, plus its external data);
#: fold_constants keeps the saved model within it (graphpass.ir.size)
SOURCE_BYTES = "graphpass.source_bytes"

#: ``Model.meta`` key: the names the loaded model declared ``value_info`` for. :func:`save`
#: writes value_info for those (with the shapes graphpass knows now) and for annotated tensors,
#: not for every tensor inference reached: a file with no value_info does not gain any.
DECLARED_VALUE_INFO = "graphpass.declared_value_info"


def _prune_value_info(model: onnx.ModelProto, declared: set[str] | None, graphs: _Graphs = None) -> None:
    if declared is None:
        return
    for g in graphs if graphs is not None else graph_protos(model.graph):
        keep = [vi for vi in g.value_info if vi.name in declared or len(vi.metadata_props)]
        if len(keep) != len(g.value_info):
            del g.value_info[:]
            g.value_info.extend(keep)


def _remember_types(graph_proto: onnx.GraphProto, graph: gs.Graph, graphs: list | None = None) -> bool:
    """Keep the TypeProto of every non-tensor value (sequence, optional, map, ...) on its gs tensor.

    gs cannot export optional/map/opaque types and flattens nested sequence types; the
    exporter puts these types back from what is kept here (see :func:`_restore_types`).
    ``graphs``: ``list(graph_protos(graph_proto))`` when the caller has it. Returns whether a
    value has such a type.
    """
    types: dict[str, onnx.TypeProto] = {}
    for g in graphs if graphs is not None else graph_protos(graph_proto):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value") not in (None, "tensor_type"):
                types[vi.name] = vi.type
    if not types:
        return False
    for g in iter_graphs(graph):
        tensors = list(g.inputs) + list(g.outputs) + [t for n in g.nodes for t in list(n.inputs) + list(n.outputs)]
        for t in tensors:
            if t.name in types:
                t.__dict__[_TYPE_KEY] = types[t.name]
    return True


_RAW_ATTRS_KEY = "_gp_raw_attrs"


_RAW_ATTR_TYPES = (onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS)


def _node_pairs(graph_proto: onnx.GraphProto, graph: gs.Graph):
    """(NodeProto, gs.Node) pairs of a graph and its subgraphs (gs keeps node order)."""
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        yield proto_node, node
        for gp, g in subgraph_pairs(proto_node, node):
            yield from _node_pairs(gp, g)


def _remember_raw_attrs(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    """Keep attributes gs cannot represent (TYPE_PROTO, e.g. Optional's ``type``) on the node.
    (:func:`_node_pairs`' walk, written out: a node without attributes holds neither such an
    attribute nor a body, and is passed over.)"""
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        attrs = proto_node.attribute
        if not len(attrs):
            continue
        raw = [a for a in attrs if a.type in _RAW_ATTR_TYPES]
        if raw:
            node.__dict__[_RAW_ATTRS_KEY] = raw
        for gp, g in subgraph_pairs(proto_node, node):
            _remember_raw_attrs(gp, g)


def _restore_raw_attrs(graph_proto: onnx.GraphProto, graph: gs.Graph) -> None:
    """Put the kept attributes back on the exported nodes (:func:`_node_pairs`' walk, written
    out: only the nodes that kept some or hold a body are looked up in the proto)."""
    protos = graph_proto.node
    count = len(protos)
    for i, node in enumerate(graph.nodes):
        raw = node.__dict__.get(_RAW_ATTRS_KEY)
        body = bool(node.attrs) and has_subgraph(node)
        if not raw and not body:
            continue
        if i >= count:  # the pairs end with the shorter list
            break
        proto_node = protos[i]
        if raw:
            have = {a.name for a in proto_node.attribute}
            proto_node.attribute.extend(a for a in raw if a.name not in have)
        if body:
            for gp, g in subgraph_pairs(proto_node, node):
                _restore_raw_attrs(gp, g)


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


def load(
    source: ModelSource,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shape_inference: bool = True,
    *,
    max_memory: int | str | None = None,
    freeze_initializer_inputs: bool = False,
    dims: Mapping[str, int] | None = None,
) -> gs.Graph:
    """Load a model into the graphpass IR; returns the main gs.Graph of a new
    :class:`~graphpass.ir.model.Model` (``model_of(graph)``). ``graphpass.load`` returns the Model.

    Args:
        source: a path, the serialized bytes, or a ModelProto.
        input_shapes: fixes graph input dims before shape inference (static-shape specialization);
            -1 keeps a dim dynamic.
        dims: symbolic dim name -> value, fixed on every input (and tensor) that names it.
        shape_inference: run onnx shape inference so passes see tensor shapes and dtypes.
        max_memory: bytes (or "8G") graphpass may hold for this model: the file, its external
            data and every tensor a pass folds (see :mod:`graphpass.ir.limits`).
        freeze_initializer_inputs: an initializer that is also a graph input (IR >= 4) is a
            default the caller may override; by default it stays an input. True treats it as a
            constant (and drops the input), so passes can fold it.
    """
    with gc_paused(settle=True):  # the parse's messages, inference's and the import's objects: all alive
        graph = _load(source, input_shapes, shape_inference, max_memory, freeze_initializer_inputs, dims)
    release_free_memory()
    return graph


def _load(source, input_shapes, shape_inference, max_memory, freeze_initializer_inputs, dims) -> gs.Graph:
    limit = limits.resolve_max_memory(max_memory)
    model, held, source_bytes, graphs, on_disk = _load_proto(source, True, limit)
    layout = external.layout_of(model, on_disk)
    graph = from_proto(model, input_shapes=input_shapes, shape_inference=shape_inference,
                       freeze_initializer_inputs=freeze_initializer_inputs, dims=dims, graphs=graphs, lean=True)
    model_of(graph).budget = limits.Budget(limit, held)
    model_of(graph).meta[SOURCE_BYTES] = source_bytes
    if layout is not None:  # else no tensor of the model is on disk: no walk for one
        model_of(graph).meta[EXTERNAL_LAYOUT] = layout
        for g in iter_graphs(graph):
            for node in g.nodes:
                for t in node.inputs:
                    v = t.__dict__.get("_values") if isinstance(t, gs.Constant) else None
                    if type(v) is gs.ir.tensor.LazyValues and _is_on_disk(v.tensor):
                        t._values = ExternalValues(v.tensor)
    del model  # the parse is garbage now (see _release_proto): its pages go back (load's trim)
    return graph


def constant_proto(c: gs.Constant) -> onnx.TensorProto:
    """``c`` as one TensorProto, written as the export writes it: gs's conversion, but values read
    into an array numpy has no native type for (int4/uint4, bfloat16, float8, strings: gs writes
    the unpacked array's bytes, 'expected 2 bytes, got 4') go through onnx's, which packs them."""
    values = c._values
    if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
        try:
            return onnx.numpy_helper.from_array(values, c.name)
        except Exception as e:  # noqa: BLE001 - let gs's exporter say what it cannot do
            log.debug("cannot convert '%s' (%s): %s", c.name, values.dtype, e)
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    return OnnxExporter.export_tensor_proto(c)


def _export_weightless(graph: gs.Graph, value_infos: set[str] | None = None, maps: dict | None = None
                       ) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """Export with every weight over 1 KiB as a data-less header.

    gs's exporter copies every initializer twice (make_graph, then make_model); for a model of
    a gigabyte that was most of the save time. Instead the exporter sees header-only protos
    (swapped in and back, no bytes copied); the caller puts the real tensors in. Returns the
    model and, by name, the original TensorProto (or, for a weight a pass computed, the numpy
    array) of each weight left out. Weights still on disk (:class:`ExternalValues`) are exported
    as their external reference; :func:`to_proto` reads them in, :func:`save` copies them over.
    ``maps``: filled with the export's maps of each graph's tensors (see
    :func:`graphpass.ir.fast_export.export_onnx`).
    """
    originals: dict[str, onnx.TensorProto | np.ndarray] = {}
    swapped: list[tuple[gs.ir.tensor.LazyValues, onnx.TensorProto]] = []
    arrays: list[tuple[gs.Constant, np.ndarray]] = []
    seen: set[int] = set()
    graphs_of: dict[int, set[int]] = {}  # Constant -> the graphs that read it (outer weights in bodies)
    by_name: dict[str, set[int]] = {}
    graphs = list(iter_graphs(graph))
    nested = len(graphs) > 1  # one graph: no weight is read by two (graphs_of and by_name unused)
    constant = gs.Constant
    for g in graphs:
        for node in g.nodes:
            for t in node.attrs.values() if node.attrs else ():
                # a Constant node's value (or any tensor attribute) whose values were read: gs
                # would write the unpacked bytes and the numpy dtype's ONNX type (an int4 value
                # 'expected 2 bytes, got 4'; a FLOAT8E4M3FNUZ one as FLOAT8E4M3FN)
                if isinstance(t, gs.Constant) and isinstance(t._values, np.ndarray) and t._values.dtype.kind not in "biuf":
                    try:
                        proto = onnx.numpy_helper.from_array(t._values, t.name)
                    except Exception as e:  # noqa: BLE001 - let gs's exporter say what it cannot do
                        log.debug("cannot convert attribute '%s' (%s): %s", t.name, t._values.dtype, e)
                    else:
                        arrays.append((t, t._values))
                        t._values = gs.ir.tensor.LazyValues(proto)
            for t in node.inputs:
                if not isinstance(t, constant):
                    continue
                if nested:
                    graphs_of.setdefault(id(t), set()).add(id(g))
                    by_name.setdefault(t.name, set()).add(id(t))
                if id(t) in seen:
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
                    t._values = fast_import.lazy_values(header)
                    continue
                if isinstance(values, gs.ir.tensor.LazyValues) and values.nbytes > 1024:
                    original = values.tensor
                    if original.HasField("data_location") and original.data_location == onnx.TensorProto.EXTERNAL:
                        continue
                    swapped.append((values, original))
                    originals[t.name] = original
                    values.tensor = _header(original)
                    values.tensor.name = t.name  # a renamed weight (concat's prefix) keeps its new name
    try:
        with _types_hidden(graph) as types:
            model = fast_export.export_onnx(graph, value_infos, maps)
        _restore_types(model, types)
        _restore_raw_attrs(model.graph, graph)
    finally:
        for values, original in swapped:
            values.tensor = original
        for t, arr in arrays:
            t._values = arr
    shared = {name for name, ids in by_name.items() if len(ids) == 1 and len(graphs_of[next(iter(ids))]) > 1}
    return model, originals, shared


def _hoist_shared_initializers(model: onnx.ModelProto, shared: set[str]) -> None:
    """One copy of each weight that several graphs read, in the main graph.

    gs writes a Constant into the initializers of every graph that reads it, so a weight of the
    main graph read inside an If body was stored twice (once per branch, and the body's copy
    of a weight over 1 KiB left as a header: an invalid model). Outer-scope names are visible
    in every nested body, so the main graph's copy serves all of them.
    """
    if not shared:
        return
    main = model.graph
    have = {t.name for t in main.initializer}
    for g in list(graph_protos(main))[1:]:
        if not any(t.name in shared for t in g.initializer):
            continue
        keep = []
        for t in g.initializer:
            if t.name not in shared:
                keep.append(t)
            elif t.name not in have:
                main.initializer.add().CopyFrom(t)
                have.add(t.name)
        del g.initializer[:]
        g.initializer.extend(keep)


def _finish(graph: gs.Graph, model: onnx.ModelProto, originals: dict | None = None,
            maps: dict | None = None) -> onnx.ModelProto:
    facts = model_of(graph, attach=False)  # exporting never changes the graph
    annotations.write_to_proto(graph, model.graph, maps)
    for k, v in facts.metadata_props.items():
        model.metadata_props.add(key=k, value=v)
    model.doc_string = facts.doc_string or ""
    model.domain = facts.domain or ""
    model.model_version = facts.model_version or 0
    for field in ("doc_string", "domain", "model_version", "producer_name", "producer_version"):
        if not getattr(model, field):
            model.ClearField(field)  # an empty field set is still written (proto2): bytes for nothing
    _merge_opsets(model, list(facts.opset_imports.items()))
    defaults = facts.input_defaults
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


@contextlib.contextmanager
def _sorted_for_export(graph: gs.Graph):
    """``graph`` (and every subgraph) topologically sorted for the block, its node order put
    back after: exporting reads the graph, it never reorders the caller's nodes."""
    saved = [(g, g.nodes, list(g.nodes)) for g in iter_graphs(graph)]
    try:
        toposort(graph)
        yield
    finally:
        for g, nodes, order in saved:
            nodes[:] = order
            g.nodes = nodes


@profiling.timed("export")
def _export(graph: gs.Graph, emit: str, value_infos: set[str] | None = None
            ) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """The export of :func:`to_proto`, :func:`save` and :func:`snapshot`. ``value_infos``: see
    :func:`graphpass.ir.fast_export.export_onnx`."""
    if emit not in EMIT_FORMS:
        raise UsageError(f"emit must be 'portable' or 'device', got '{emit}'")
    with gc_paused():  # see gc_paused: every sweep walked the whole graph (100k nodes: ~40% of the export)
        return _export_paused(graph, emit, value_infos)


def _export_paused(graph: gs.Graph, emit: str, value_infos: set[str] | None = None
                   ) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    from graphpass.ir.device_ops import transdata_bypassed

    with _sorted_for_export(graph):  # _finish pairs proto nodes with gs nodes by position: inside
        # portable: the TransData calls to_portable drops are left out of the export itself
        with transdata_bypassed(graph) if emit == "portable" else contextlib.nullcontext():
            try:
                maps: dict = {}  # the export's maps of each graph's tensors, for the annotations
                model, originals, shared = _export_weightless(graph, value_infos, maps)
            except Exception as e:
                raise BadModelError(f"cannot export the graph: {type(e).__name__}: {e}") from e
            model = _finish(graph, model, originals, maps)
            del maps
    _hoist_shared_initializers(model, shared)
    if emit == "portable":
        from graphpass.ir.device_ops import to_portable

        model = to_portable(model)
    return model, originals


def to_proto(graph: "gs.Graph | Model", emit: str = DEFAULT_EMIT) -> onnx.ModelProto:
    """Export the IR as a complete ModelProto with annotations and model-level data restored.
    ``graph`` is not changed (not even its node order).

    Args:
        graph: a Model or its main gs.Graph.
        emit: ``"portable"`` (the default, as for :func:`save`) inlines ``graphpass.ascend``
            device ops into standard ONNX (see ``device_ops``); ``"device"`` keeps them as nodes
            (with their function bodies).
    """
    graph = _graph_of(graph)
    model, originals = _export(graph, emit)
    for g in graph_protos(model.graph):
        for init in g.initializer:
            original = originals.get(init.name)
            if original is not None:
                init.CopyFrom(_as_proto(init.name, original, init))
            elif _is_on_disk(init):
                init.CopyFrom(_read_on_disk(init))
    return model


def snapshot(graph: "gs.Graph | Model") -> tuple[onnx.ModelProto, dict]:
    """A copy of ``graph`` to roll back to, without copying its weights: the structure as a
    weightless proto, the weights by reference. Passes replace a Constant rather than change
    its array in place, so the referenced weights are still the old ones at restore time.
    ``graph`` is not changed."""
    return _export(_graph_of(graph), "device")


def restore(snap: tuple[onnx.ModelProto, dict]) -> gs.Graph:
    """The graph :func:`snapshot` saw (a new graph with its own :class:`Model`; the snapshot's
    proto is used up)."""
    model, originals = snap
    graph = from_proto(model, shape_inference=False)
    defaults = model_of(graph).input_defaults
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
                    t._values = fast_import.lazy_values(original)
                elif type(t._values) is gs.ir.tensor.LazyValues and _is_on_disk(t._values.tensor):
                    t._values = ExternalValues(t._values.tensor)
    return graph


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


def save_proto(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool | None = None) -> Path:
    """Write ``model`` atomically; external data next to it when asked or when past 2 GB.

    The external data file is ``<name>.data`` in the same folder (a relative location).
    """
    out = check_output_path(path)
    if external_data is None:
        external_data = _payload_bytes(model) > external.EXTERNAL_DATA_THRESHOLD
    with atomic_output(out) as tmpdir:
        tmp_model = tmpdir / out.name
        if external_data:
            # onnx.save_model moves the weights out of the proto it is given: save a copy
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            onnx.save_model(
                copy,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=out.name + ".data",
                size_threshold=1024,
                convert_attribute=False,
            )
        else:
            with open(tmp_model, "wb") as f:
                f.write(model.SerializeToString())
    return out


def save(graph: "gs.Graph | Model", path: str | os.PathLike, external_data: bool | None = None,
         emit: str = DEFAULT_EMIT) -> Path:
    """Export ``graph`` (a Model or its main gs.Graph) and write it atomically, without
    assembling the weights in memory twice. ``graph`` is not changed.

    ``emit="portable"`` (the default, as for :func:`to_proto`: the next step is ATC or another
    runtime) inlines the ``graphpass.ascend`` device ops into standard ONNX; ``emit="device"``
    keeps them.

    The weightless model is serialized first; each main-graph weight is then appended as its
    own ``graph.initializer`` record (protobuf merges repeated embedded-message fields, so the
    file parses as one model). Past 2 GB, when ``external_data`` is True, or (``external_data``
    None) when the model was loaded with external data, the weights go to external data beside
    the model instead: in the loaded model's layout (``<name>.data``, or ``<name>.<tensor>.data``
    per tensor, tensors of at least its smallest external tensor's size), else ``<name>.data``
    for tensors of 1 KiB or more. ``external_data=False`` writes everything into the model.
    """
    out = check_output_path(path)
    graph = _graph_of(graph)
    with gc_paused():  # the export's and the writer's messages are all alive until written
        _save(graph, out, external_data, emit)
    return out


def _save(graph: gs.Graph, out: Path, external_data: bool | None, emit: str) -> None:
    declared = model_of(graph, attach=False).meta.get(DECLARED_VALUE_INFO)
    # the value_info the pruning below keeps is all the export writes, unless the portable form
    # reads the rest first: an attention call's expansion reads the declared shapes
    # (device_ops_attention._static_shapes); the other device ops' inlining and the TransData
    # bypass only drop entries, which the pruning drops anyway
    written = declared if declared is not None and (emit == "device" or not _holds_device_ops(
        graph, _SHAPE_READING_DEVICE_OPS)) else None
    model, originals = _export(graph, emit, written)
    graphs = list(graph_protos(model.graph))
    _prune_value_info(model, declared, graphs)
    main_inits = {init.name for init in model.graph.initializer}
    for g in graphs[1:]:  # weights inside subgraphs: put back in place
        for init in g.initializer:
            if init.name in originals and init.name not in main_inits:
                init.CopyFrom(_as_proto(init.name, originals.pop(init.name), init))
            elif _is_on_disk(init):
                init.CopyFrom(_read_on_disk(init))
    on_disk = sum(int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
                  for t in model.graph.initializer if _is_on_disk(t))
    payload = sum(_nbytes(t) for t in originals.values()) + _payload_bytes(model) + on_disk
    layout = model_of(graph, attach=False).meta.get(EXTERNAL_LAYOUT)
    if external_data is None:
        external_data = payload > external.EXTERNAL_DATA_THRESHOLD or layout is not None
    with atomic_output(out) as tmpdir:
        if external_data:
            external._write_external(model, originals, tmpdir, out.name, layout or external.DEFAULT_LAYOUT,
                                     _data_files_read(model, out))
        else:
            external._write_streaming(model, originals, tmpdir / out.name)


def _holds_device_ops(graph: gs.Graph, ops: "frozenset[str] | None" = None) -> bool:
    """Some node of ``graph`` or of a graph in any node's attributes is in graphpass's device
    domain (every attribute looked at: not only where :func:`iter_graphs` looks); with ``ops``,
    one of those op types."""
    from graphpass.ir.device_ops import DOMAIN

    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g.nodes:
            if n.domain == DOMAIN and (ops is None or n.op in ops):
                return True
            if n.attrs:
                stack.extend(graph_attributes(n))
    return False


#: The device ops whose portable form reads the declared value_info (their shapes).
_SHAPE_READING_DEVICE_OPS = frozenset(_attention.OPS.values())


def _data_files_read(model: onnx.ModelProto, out: Path) -> frozenset[str]:
    """Names of the files in ``out``'s folder that ``model`` still reads weights from (lazily
    loaded external data): the output's data must not overwrite them. When ``out`` is in a
    hidden staging folder (``graphpass optimize`` stages its outputs), its parent counts."""
    folder = (out.parent if str(out.parent) else Path(".")).resolve()
    folders = {folder, folder.parent} if folder.name.startswith(".") else {folder}  # a staging folder
    names = set()
    for g in graph_protos(model.graph):
        for t in g.initializer:
            if _is_on_disk(t):
                loc = Path(next(e.value for e in t.external_data if e.key == "location"))
                if loc.parent in folders:
                    names.add(loc.name)
    return frozenset(names)


def _graph_of(graph: "gs.Graph | Model") -> gs.Graph:
    if isinstance(graph, Model):
        return graph.graph
    if isinstance(graph, gs.Graph):
        return graph
    raise TypeError(f"expected a graphpass.Model or a gs.Graph, got {type(graph).__name__}")

