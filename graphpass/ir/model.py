"""The model value: :class:`Model`, and :func:`as_model`, the one place any model form becomes one.

A :class:`Model` is the graph (an onnx-graphsurgeon ``gs.Graph``, which passes rewrite) plus
what belongs to the model rather than the graph:

* ``opset_imports`` (every domain the model imported, used or not), ``metadata_props``,
  ``doc_string``, ``domain``, ``model_version``; ``ir_version``, ``producer_name``,
  ``producer_version`` and ``functions`` are read from (and written to) the graph, which gs
  already carries;
* ``input_defaults``: initializers that are also graph inputs (IR >= 4), written back on export
  while the input exists;
* ``budget``: the memory budget (:class:`graphpass.ir.limits.Budget`) of the model: bytes held
  for it, against ``--max-memory``; passes that fold tensors draw from it;
* ``meta``: an in-memory dict for callers and passes; never saved.

``model.to_proto()`` and ``model.save(path)`` share one default, :data:`DEFAULT_EMIT`
(``"portable"``: device ops inlined into standard ONNX); ``emit="device"`` keeps them.

**The back-reference.** The main ``gs.Graph`` of a Model holds one reference back to it, in
``graph.__dict__["_gp_model"]`` (:func:`model_of`): code that is handed only the graph (a pass,
:func:`opset_of`, :func:`budget`) reaches the model facts through it. It is the only graph-level
stash; subgraphs have none. Per-object IR metadata stays on the gs objects themselves:
annotations (``_gp_meta``, see :mod:`graphpass.ir.annotations`), the TypeProto of a non-tensor
value (``_gp_type`` on a tensor) and attributes gs cannot hold (``_gp_raw_attrs`` on a node),
see :mod:`graphpass.ir.serialize`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import onnx
import onnx_graphsurgeon as gs

from graphpass.ir import limits

if TYPE_CHECKING:
    from graphpass.ir.serialize import ModelSource

__all__ = ["DEFAULT_EMIT", "EMIT_FORMS", "Model", "ModelLike", "as_model", "as_proto", "budget", "model_info", "model_of",
           "opset_of"]

#: The output form of :meth:`Model.to_proto` and :meth:`Model.save` unless ``emit`` says otherwise.
DEFAULT_EMIT = "portable"
EMIT_FORMS = ("portable", "device")

_BACKREF = "_gp_model"


class Model:
    """One ONNX model in graphpass: a graph to rewrite plus its model-level facts.

    Build one with :func:`graphpass.load` / :func:`as_model` (from a path, bytes or a
    ModelProto), or ``Model(graph, ...)`` around a ``gs.Graph`` with the facts given (defaults:
    what gs knows, the default memory budget); the new Model becomes the graph's back-reference
    (:func:`model_of` finds the one a graph already has). See the module docstring for what it
    holds.
    """

    def __init__(
        self,
        graph: gs.Graph,
        *,
        opset_imports: dict[str, int] | None = None,
        metadata_props: dict[str, str] | None = None,
        doc_string: str = "",
        domain: str = "",
        model_version: int = 0,
        input_defaults: dict[str, onnx.TensorProto] | None = None,
        budget: limits.Budget | None = None,
        meta: dict[str, Any] | None = None,
    ):
        if not isinstance(graph, gs.Graph):
            raise TypeError(f"Model(graph): a gs.Graph is needed, got {type(graph).__name__}")
        if opset_imports is None:  # a graph built without graphpass: what gs knows
            opset_imports = {"": int(graph.opset)} if graph.opset is not None else {}
            for o in graph.import_domains or []:
                opset_imports.setdefault(o.domain or "", int(o.version))
        self.opset_imports: dict[str, int] = dict(opset_imports)
        self.metadata_props: dict[str, str] = dict(metadata_props or {})
        self.doc_string = doc_string
        self.domain = domain
        self.model_version = int(model_version)
        self.input_defaults: dict[str, onnx.TensorProto] = dict(input_defaults or {})
        self.budget = budget if budget is not None else limits.Budget(limits.default_max_memory())
        self.meta: dict[str, Any] = dict(meta or {})
        self._graph = None
        self.graph = graph

    # -- the graph and the facts gs keeps on it ------------------------------------------------

    @property
    def graph(self) -> gs.Graph:
        """The main graph (passes rewrite it in place)."""
        return self._graph

    @graph.setter
    def graph(self, graph: gs.Graph) -> None:
        if self._graph is not None and self._graph.__dict__.get(_BACKREF) is self:
            del self._graph.__dict__[_BACKREF]
        self._graph = graph
        graph.__dict__[_BACKREF] = self

    @property
    def functions(self) -> list:
        """The model's local functions (gs ``Function`` objects, kept on the graph)."""
        return self._graph.functions

    @property
    def ir_version(self) -> int | None:
        return self._graph.ir_version

    @ir_version.setter
    def ir_version(self, value: int | None) -> None:
        self._graph.ir_version = value

    @property
    def producer_name(self) -> str | None:
        return self._graph.producer_name

    @producer_name.setter
    def producer_name(self, value: str | None) -> None:
        self._graph.producer_name = value

    @property
    def producer_version(self) -> str | None:
        return self._graph.producer_version

    @producer_version.setter
    def producer_version(self, value: str | None) -> None:
        self._graph.producer_version = value

    def opset(self, domain: str = "") -> int | None:
        """The opset version the model imports for ``domain`` ("" and "ai.onnx" are one domain)."""
        for d, v in self.opset_imports.items():
            if (d or "") == domain or (domain == "" and d == "ai.onnx"):
                return v
        return None

    # -- conversions --------------------------------------------------------------------------

    @classmethod
    def load(cls, source: "ModelSource", **load_options) -> "Model":
        """Read ``source`` (a path, bytes or ModelProto) into a new Model; see :func:`as_model`."""
        from graphpass.ir.serialize import load as load_graph

        return model_of(load_graph(source, **load_options))

    def to_proto(self, emit: str = DEFAULT_EMIT) -> onnx.ModelProto:
        """The model as a complete ModelProto (weights included). The model is not changed.

        Args:
            emit: ``"portable"`` (default) inlines ``graphpass.ascend`` device ops into standard
                ONNX; ``"device"`` keeps them as nodes with their function bodies.
        """
        from graphpass.ir.serialize import to_proto

        return to_proto(self._graph, emit=emit)

    def save(self, path: str | os.PathLike, *, emit: str = DEFAULT_EMIT, external_data: bool | None = None) -> Path:
        """Write the model to ``path`` atomically (external data ``<name>.data`` when asked or
        past 2 GB). Same ``emit`` default as :meth:`to_proto`. The model is not changed."""
        from graphpass.ir.serialize import save

        return save(self._graph, path, external_data=external_data, emit=emit)

    def copy(self) -> "Model":
        """An independent copy: a new graph (weights shared by reference: passes replace a
        Constant's values, never change them in place), the facts copied, ``meta`` shallow-copied,
        a budget with the same limit and held bytes."""
        from graphpass.ir.serialize import restore, snapshot

        graph = restore(snapshot(self._graph))
        new = model_of(graph)
        new.opset_imports = dict(self.opset_imports)
        new.metadata_props = dict(self.metadata_props)
        new.doc_string, new.domain, new.model_version = self.doc_string, self.domain, self.model_version
        new.input_defaults = dict(self.input_defaults)
        new.budget = limits.Budget(self.budget.limit, self.budget.held)
        new.meta = dict(self.meta)
        return new

    def __repr__(self) -> str:
        from graphpass.ir.graph import count_nodes

        return (f"<graphpass.Model '{self._graph.name}': {count_nodes(self._graph)} nodes, "
                f"opset {self.opset('')}, IR {self.ir_version}>")


#: Anything :func:`as_model` accepts.
ModelLike = Union[str, os.PathLike, bytes, bytearray, onnx.ModelProto, Model, gs.Graph]


def model_of(graph: gs.Graph, attach: bool = True) -> Model:
    """The Model a main graph belongs to (its back-reference). A bare gs.Graph built without
    graphpass gets a Model with default facts (its opset from gs, the default memory budget),
    attached to it unless ``attach`` is False (then the graph is left as it is)."""
    model = graph.__dict__.get(_BACKREF)
    if model is not None and model.graph is graph:
        return model
    stale = model
    model = Model(graph)
    if stale is not None:  # a back-reference copied from another graph: keep its facts
        model.opset_imports = dict(stale.opset_imports)
        model.metadata_props = dict(stale.metadata_props)
        model.doc_string, model.domain, model.model_version = stale.doc_string, stale.domain, stale.model_version
        model.input_defaults = dict(stale.input_defaults)
        model.budget = stale.budget
    if not attach:
        del graph.__dict__[_BACKREF]
        if stale is not None:
            graph.__dict__[_BACKREF] = stale
    return model


#: The load options and their defaults (see :func:`graphpass.ir.serialize.load`).
_LOAD_DEFAULTS = {"input_shapes": None, "shape_inference": True, "max_memory": None, "freeze_initializer_inputs": False,
                  "dims": None}


def as_model(source: ModelLike, **load_options) -> Model:
    """The one coercion point of the public API: any model form to a :class:`Model`.

    A path, bytes or ModelProto is read with :func:`graphpass.ir.serialize.load` (validated,
    external data checked; a ModelProto is copied, never changed); ``load_options`` are its
    keyword arguments (``input_shapes``, ``shape_inference``, ``max_memory``,
    ``freeze_initializer_inputs``, ``dims``). A Model is returned as it is, and a ``gs.Graph`` (accepted
    for compatibility) as its Model (:func:`model_of`); a load option other than its default
    cannot apply to them and is a UsageError, never silently ignored.

    Raises:
        TypeError: ``source`` is none of those forms.
        UsageError: load options given with a Model or gs.Graph.
        BadModelError: ``source`` is not a valid model (one line saying why).
    """
    if isinstance(source, (Model, gs.Graph)):
        given = sorted(k for k, v in load_options.items() if v != _LOAD_DEFAULTS.get(k, None))
        if given:
            from graphpass.errors import UsageError

            raise UsageError(f"{', '.join(given)}: load options apply when a model is read (a path, bytes or a "
                             "ModelProto), not to a model already loaded")
        return source if isinstance(source, Model) else model_of(source)
    if isinstance(source, (str, os.PathLike, bytes, bytearray, onnx.ModelProto)):
        return Model.load(source, **load_options)
    raise TypeError(
        f"expected a model: a path, bytes, an onnx.ModelProto or a graphpass.Model, got {type(source).__name__}"
    )


def as_proto(source: ModelLike, *, emit: str = DEFAULT_EMIT, stored: bool = False, where: str | None = None,
             max_memory: int | str | None = None) -> onnx.ModelProto:
    """The coercion point for readers that run or compare protos (verify, precision, diff, bisect).

    A path, bytes or ModelProto is read and validated exactly as :func:`as_model` does it (the
    same :func:`~graphpass.ir.validate.validate`); a ModelProto is never changed (returned as it
    is when loading would not change it, else a changed copy: the callers only read it). With
    ``stored`` the model is taken as stored (no opset upgrade, external data left on disk:
    :func:`~graphpass.ir.serialize.read_as_stored`, for ``diff``); ``where`` names it in errors.
    A Model (or gs.Graph) is exported with ``emit`` (default: portable, what ``save`` writes);
    it is not changed.

    Raises:
        TypeError: ``source`` is none of those forms.
        BadModelError: ``source`` is not a valid model (one line saying why).
    """
    from graphpass.ir import serialize

    if isinstance(source, (Model, gs.Graph)):
        return serialize.to_proto(source.graph if isinstance(source, Model) else source, emit=emit)
    if isinstance(source, (str, os.PathLike, bytes, bytearray, onnx.ModelProto)):
        if stored:
            if isinstance(source, onnx.ModelProto):
                copy = onnx.ModelProto()
                copy.CopyFrom(source)
                source = copy
            return serialize.read_as_stored(source, where=where)
        if isinstance(source, onnx.ModelProto) and _ready(source):
            from graphpass.ir.validate import validate

            validate(source, "<model>")  # the checks load_proto runs, without copying the proto
            return source
        return serialize.load_proto(source, max_memory=max_memory)
    raise TypeError(
        f"expected a model: a path, bytes, an onnx.ModelProto or a graphpass.Model, got {type(source).__name__}"
    )


def _ready(proto: onnx.ModelProto) -> bool:
    """Whether :func:`~graphpass.ir.serialize.load_proto` would return ``proto`` as it is, once
    validated: no external data, no sparse initializers, an opset it does not convert. Readers
    of such a proto (verify, precision) then read it without a copy: they never change it."""
    from graphpass.ir.graph import graph_protos
    from graphpass.ir.serialize import MIN_OPSET

    version = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is not None and version < MIN_OPSET:
        return False
    from graphpass.ir.external import _external_tensors

    if any(len(g.sparse_initializer) for g in graph_protos(proto.graph)):
        return False
    return next(_external_tensors(proto), None) is None


def model_info(graph: gs.Graph) -> dict:
    """The model facts of ``graph`` as a dict (the old ``graph.__dict__`` stash's shape):
    ``metadata_props``, ``doc_string``, ``domain``, ``model_version``, ``opset_import`` (a list of
    (domain, version)), ``input_defaults``. Empty for a graph that belongs to no Model."""
    model = graph.__dict__.get(_BACKREF)
    if model is None:
        return {}
    return {
        "metadata_props": model.metadata_props,
        "doc_string": model.doc_string,
        "domain": model.domain,
        "model_version": model.model_version,
        "opset_import": list(model.opset_imports.items()),
        "input_defaults": model.input_defaults,
    }


def opset_of(graph: gs.Graph, domain: str = "") -> int | None:
    """The opset ``graph``'s model imports for ``domain`` (gs's ``graph.opset`` for a graph
    without a Model)."""
    model = graph.__dict__.get(_BACKREF)
    if model is not None:
        v = model.opset(domain)
        if v is not None:
            return v
    return graph.opset if domain == "" else None


def budget(graph: gs.Graph) -> limits.Budget:
    """The memory budget of ``graph``'s model (model + external data held; passes add what they
    fold). A graph built another way gets a Model with the default limit, nothing counted yet."""
    return model_of(graph).budget
