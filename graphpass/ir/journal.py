"""The IR journal: an undo log of the edits a pass makes to a graph, without a copy of the graph.

While a :class:`Journal` is active (``with Journal(graph) as j: ...``), every edit made through
onnx-graphsurgeon's mutation points is seen by a hook that saves the edited object's state the
first time it is touched (copy on first write):

- a node: its ``__dict__`` (op, name, domain, the attrs dict object, ...), the contents of its
  ``inputs``/``outputs`` lists and of its attrs dict (shallow), its annotations;
- a tensor: its class (``to_constant``/``to_variable`` change it), its ``__dict__`` (name,
  dtype, shape, the values reference, ...), the contents of its ``inputs``/``outputs`` lists and
  of a list shape, its annotations;
- a graph (the main graph, every subgraph and every local function, saved when the journal
  starts, since a pass edits ``graph.nodes``/``inputs``/``outputs`` as plain lists): its
  ``__dict__``, the contents of those lists and of the shared functions list, its annotations.
  Finding the subgraphs walks every node; a caller that already has the list
  (:func:`all_graphs`, for the graph as it is) gives it with :class:`known_graphs`: the pass
  manager computes it once per version of the graph, not once per application (and again when
  :func:`graphs_made` says a body or function was made under a journal since: an application
  that reported no change may have made one);
- the model (:class:`graphpass.ir.model.Model`, saved when the journal starts): its
  ``__dict__`` and the contents of its dicts (opset imports, metadata, input defaults, meta).

The hooks: ``__setattr__`` and ``__delattr__`` of ``gs.Node``, ``gs.Tensor`` and ``gs.Graph`` (so ``node.op = ``,
``tensor.shape = ``, ``graph.nodes = ``, ``to_constant`` ...), every mutator of gs's
``SynchronizedList`` (``node.inputs[i] = t``, ``t.outputs.clear()``, ``append``, ...: the list's
owner and the elements whose mirror list changes are touched), the constructors (an object made
while the journal is active needs no undo; gs's own Node, Variable and Constant are then built
with their attributes written straight into the new object, not through the setattr hooks), :func:`graphpass.ir.annotations.meta` (annotation
edits) and ``gs.Constant.values`` (its getter loading a lazy weight is a read: the lazy form is
put back on a rollback, nothing else is saved). The hooks are installed on the classes only
while some journal is active: with none, graphsurgeon runs its own methods, at no cost.

What no hook can see: an in-place edit of a plain container of an object not touched before
(``node.attrs[k] = v`` on a node whose inputs, outputs or attributes the pass did not set
first; an in-place write into a numpy array). The passes of graphpass replace a Constant's
array rather than write into it, and edit a node's attrs dict only after rewiring it; the
suite's rollback check (``GRAPHPASS_CHECK_ROLLBACK``, on in the tests) compares the exported
model before a vetoed pass and after its rollback byte for byte.

:meth:`Journal.rollback` writes every saved state back (the undo log replayed backwards: each
object gets the state it had before its first edit). :meth:`Journal.touched_nodes` is the set
of nodes a pass created, removed, changed, or whose input tensors changed shape, dtype or values.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from operator import is_
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.util import misc
from onnx_graphsurgeon.util.misc import SynchronizedList

from graphpass.ir import graph as _graph_mod
from graphpass.ir.graph import iter_graphs, load_lazy
from graphpass.ir.lean import SyncList

__all__ = ["Journal", "active", "touch", "all_graphs", "known_graphs", "graphs_made", "flat_graph"]

_META = "_gp_meta"
_BACKREF = "_gp_model"

#: the journals now recording (nested: a pass may run a manager of its own on a copy)
_ACTIVE: list["Journal"] = []


#: gs.Graph objects (bodies, local functions) constructed while some journal recorded: a caller
#: that keeps an :func:`all_graphs` list checks it did not change (a pass that reported no
#: change may still have made a body; its list would miss it)
_GRAPHS_MADE = 0


def graphs_made() -> int:
    """How many gs.Graph objects were constructed while a journal recorded (see ``_GRAPHS_MADE``)."""
    return _GRAPHS_MADE


_graph_mod._graphs_made = graphs_made


class flat_graph:
    """``with flat_graph(graph):`` (the pass manager, around one application on a graph it found to
    hold no subgraph) lets :func:`graphpass.ir.graph.iter_graphs` yield ``graph`` alone without
    walking its nodes, for as long as no gs.Graph is made under an undo log (a body a pass builds
    is counted: :func:`graphs_made`). Only while a journal records: without one nothing counts
    the graphs made, and the block does nothing.

    The claim is a contract, not a hook: a body that appears without a gs.Graph constructed
    under the log (a template built before the run, a ``copy.deepcopy``/``copy.copy``/pickle of a
    graph or of a node holding one, a graph attribute set in place, a node moved out of a local
    function) is not seen. The manager uses the block for graphpass's own passes only; with
    ``check`` (default: ``GRAPHPASS_CHECK_ROLLBACK`` set, as in the tests) the block's end walks
    the graph and raises when a subgraph appeared uncounted."""

    def __init__(self, graph: gs.Graph, check: bool | None = None, off: bool = False):
        self.graph = graph
        self._outer: Any = None
        self._set = False
        self._check = check
        self._made = -1
        self._off = off  # the walk trusted nowhere in the block (a nested manager's untrusted pass)

    def __enter__(self) -> "flat_graph":
        if self._off:
            self._outer = _graph_mod._FLAT.pop(id(self.graph), None)
        elif _ACTIVE:
            self._outer = _graph_mod._FLAT.get(id(self.graph))
            self._made = _GRAPHS_MADE
            _graph_mod._FLAT[id(self.graph)] = (self.graph, _GRAPHS_MADE)
            self._set = True
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._off:
            if self._outer is not None:
                _graph_mod._FLAT[id(self.graph)] = self._outer
        elif self._set:
            if self._outer is not None:
                _graph_mod._FLAT[id(self.graph)] = self._outer
            else:
                _graph_mod._FLAT.pop(id(self.graph), None)
            check = self._check
            if check is None:
                check = os.environ.get("GRAPHPASS_CHECK_ROLLBACK", "") not in ("", "0")
            if check and exc_type is None and _GRAPHS_MADE == self._made and len(list(iter_graphs(self.graph))) > 1:
                raise AssertionError(f"graph '{self.graph.name}': a subgraph appeared under flat_graph without a "
                                     "gs.Graph constructed under the undo log (iter_graphs did not see it)")


def active() -> bool:
    """Whether some journal is recording."""
    return bool(_ACTIVE)


def touch(obj: Any) -> None:
    """Tell the active journals that ``obj`` (a gs Node, Tensor or Graph) is about to change
    in a way no hook sees (e.g. its annotation dict); no-op when none is active."""
    for j in _ACTIVE:
        j._touch(obj)


# -- saved states -------------------------------------------------------------------------

def _copy_meta(obj: Any) -> dict | None:
    d = obj.__dict__.get(_META)
    return dict(d) if d is not None else None


def _put_meta(obj: Any, saved: dict | None) -> None:
    if saved is not None:
        d = obj.__dict__[_META]  # the original dict object (the saved __dict__ holds it)
        d.clear()
        d.update(saved)


def _set_list(lst: list, items: list) -> None:
    list.clear(lst)  # the plain list methods: the mirror lists are restored on their own objects
    list.extend(lst, items)


class _NodeState:
    __slots__ = ("obj", "cls", "dict", "inputs", "outputs", "attrs", "meta")

    def __init__(self, node: gs.Node):
        d = node.__dict__
        self.obj = node
        self.cls = type(node)
        self.dict = d.copy()
        self.inputs = list(d.get("inputs", ()))
        self.outputs = list(d.get("outputs", ()))
        attrs = d.get("attrs")
        self.attrs = dict(attrs) if isinstance(attrs, dict) else None
        meta = d.get(_META)
        self.meta = dict(meta) if meta is not None else None

    def restore(self) -> None:
        node = self.obj
        if type(node) is not self.cls:
            object.__setattr__(node, "__class__", self.cls)
        node.__dict__.clear()
        node.__dict__.update(self.dict)
        if "inputs" in self.dict:
            _set_list(self.dict["inputs"], self.inputs)
        if "outputs" in self.dict:
            _set_list(self.dict["outputs"], self.outputs)
        if self.attrs is not None:
            attrs = self.dict["attrs"]
            attrs.clear()
            attrs.update(self.attrs)
        _put_meta(node, self.meta)

    def same_but_inputs_and_meta(self) -> bool:
        """The node as saved but for its inputs and annotations: class, attributes set on it,
        outputs, the attrs dict's entries."""
        node = self.obj
        d = node.__dict__
        saved = self.dict
        if type(node) is not self.cls:
            return False
        if d.keys() != saved.keys() and d.keys() - {_META} != saved.keys() - {_META}:  # (sets only then)
            return False
        if not (list(d) == list(saved) and all(map(is_, d.values(), saved.values()))):  # (keys in one order: C loops)
            for k, v in saved.items():  # (in another order, or the annotations dict replaced)
                if k != _META and d[k] is not v:
                    return False
        return _same(d.get("outputs", ()), self.outputs) and (self.attrs is None or _same_dict(d["attrs"], self.attrs))

    def changed(self) -> bool:
        node = self.obj
        d = node.__dict__
        return (type(node) is not self.cls or d.keys() != self.dict.keys()
                or any(d[k] is not v for k, v in self.dict.items())
                or not _same(d.get("inputs", ()), self.inputs) or not _same(d.get("outputs", ()), self.outputs)
                or (self.attrs is not None and not _same_dict(d["attrs"], self.attrs))
                or d.get(_META) != self.meta)


class _TensorState:
    __slots__ = ("obj", "cls", "dict", "inputs", "outputs", "shape", "meta", "loaded")

    def __init__(self, t: gs.Tensor):
        d = t.__dict__
        self.obj = t
        self.cls = type(t)
        self.dict = d.copy()
        self.inputs = list(d.get("inputs", ()))
        self.outputs = list(d.get("outputs", ()))
        shape = d.get("shape")
        self.shape = list(shape) if isinstance(shape, list) else None
        meta = d.get(_META)
        self.meta = dict(meta) if meta is not None else None
        self.loaded = None  # the array gs's ``values`` getter loaded from the saved lazy weight

    def restore(self) -> None:
        t = self.obj
        if type(t) is not self.cls:
            object.__setattr__(t, "__class__", self.cls)
        t.__dict__.clear()
        t.__dict__.update(self.dict)
        if "inputs" in self.dict:
            _set_list(self.dict["inputs"], self.inputs)
        if "outputs" in self.dict:
            _set_list(self.dict["outputs"], self.outputs)
        if self.shape is not None:
            self.dict["shape"][:] = self.shape
        _put_meta(t, self.meta)

    def value_changed(self) -> bool:
        """Whether what a reader of the tensor sees changed: class, name, shape, dtype, values."""
        t = self.obj
        if type(t) is not self.cls:
            return True
        d = t.__dict__
        for key in ("name", "dtype", "_export_dtype", "data_location"):
            if d.get(key) is not self.dict.get(key) and d.get(key) != self.dict.get(key):
                return True
        shape = d.get("shape")
        if shape is not self.dict.get("shape") or (self.shape is not None and list(shape) != self.shape):
            old = self.shape if self.shape is not None else self.dict.get("shape")
            if _plain(shape) != _plain(old):
                return True
        old_v, new_v = self.dict.get("_values"), d.get("_values")
        if old_v is not new_v:
            # a lazy weight loaded on read (gs's ``values`` getter) is the same value; an array
            # the pass assigned (``t.values = a``) is not, whatever its shape
            if not (self.loaded is not None and new_v is self.loaded):
                return True
        return False


def _plain(shape: Any) -> Any:
    return list(shape) if isinstance(shape, (list, tuple)) else shape


class _GraphState:
    __slots__ = ("obj", "dict", "nodes", "inputs", "outputs", "functions", "meta")

    def __init__(self, g: gs.Graph):
        self.obj = g
        d = g.__dict__
        self.dict = dict(d)
        self.nodes = list(d.get("nodes", ()))
        self.inputs = list(d.get("inputs", ()))
        self.outputs = list(d.get("outputs", ()))
        fns = d.get("_functions")
        self.functions = list(fns) if fns is not None else None
        self.meta = _copy_meta(g)

    def restore(self) -> None:
        g = self.obj
        g.__dict__.clear()
        g.__dict__.update(self.dict)
        for key in ("nodes", "inputs", "outputs"):
            if key in self.dict:
                self.dict[key][:] = getattr(self, key)
        if self.functions is not None:
            self.dict["_functions"][:] = self.functions
        _put_meta(g, self.meta)


class _ModelState:
    __slots__ = ("obj", "dict", "dicts")

    def __init__(self, model: Any):
        self.obj = model
        self.dict = dict(model.__dict__)
        self.dicts = {k: dict(v) for k, v in self.dict.items() if type(v) is dict}

    def restore(self) -> None:
        m = self.obj
        m.__dict__.clear()
        m.__dict__.update(self.dict)
        for k, saved in self.dicts.items():
            d = self.dict[k]
            d.clear()
            d.update(saved)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(map(is_, a, b))


def _same_dict(a: dict, b: dict) -> bool:
    if list(a) == list(b) and all(map(is_, a.values(), b.values())):  # (keys in one order: C loops)
        return True
    return a.keys() == b.keys() and all(a[k] is v for k, v in b.items())


def all_graphs(graph: gs.Graph) -> list[gs.Graph]:
    """``graph``, its subgraphs and the local functions with theirs (each once, outermost first):
    the graphs a journal on ``graph`` saves when it starts."""
    seen: set[int] = set()
    out: list[gs.Graph] = []
    for root in (graph, *getattr(graph, "functions", ())):
        for g in iter_graphs(root):  # walks every node of every graph
            if id(g) not in seen:
                seen.add(id(g))
                out.append(g)
    return out


_NODE = gs.Node

#: id(graph) -> (graph, its all_graphs list), while a caller that knows them says so
_KNOWN: dict[int, tuple[gs.Graph, list[gs.Graph]]] = {}


class known_graphs:
    """``with known_graphs(graph, graphs):`` a journal on ``graph`` started inside the block saves
    ``graphs`` (``all_graphs(graph)`` as the caller computed it, for a graph unchanged since)
    instead of walking every node again to find them. The pass manager computes the list once
    per version of the graph (with its op types) and gives it to every application's journal:
    at 100k nodes a walk is ~15 ms, and it ran once per application."""

    def __init__(self, graph: gs.Graph, graphs: list[gs.Graph]):
        self.graph, self.graphs = graph, graphs
        self._outer: tuple[gs.Graph, list[gs.Graph]] | None = None

    def __enter__(self) -> "known_graphs":
        self._outer = _KNOWN.get(id(self.graph))
        _KNOWN[id(self.graph)] = (self.graph, self.graphs)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._outer is not None:
            _KNOWN[id(self.graph)] = self._outer
        else:
            _KNOWN.pop(id(self.graph), None)


# -- the journal --------------------------------------------------------------------------

class Journal:
    """The undo log of one pass application on ``graph`` (see the module docstring).

    ``with Journal(graph) as j:`` records until the block ends; then ``j.rollback()`` puts the
    graph back as it was when the journal started, and ``j.touched_nodes()`` says what the
    edits reached. A journal records once: entering it again is an error.
    """

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self._nodes: dict[int, _NodeState] = {}
        self._tensors: dict[int, _TensorState] = {}
        self._graphs: dict[int, _GraphState] = {}
        self._loads: dict[int, tuple[gs.Tensor, Any]] = {}  # lazy weights loaded (not edited)
        self._created: dict[int, Any] = {}  # id -> object (kept alive: ids stay unique)
        # id -> state or created object: the one lookup a hook makes (most touches are of an
        # object already saved, or made during the pass: its constructor's own attribute sets)
        self._seen: dict[int, Any] = {}
        self._model: _ModelState | None = None
        self._used = False
        self.recording = False

    # -- recording ------------------------------------------------------------------------

    def __enter__(self) -> "Journal":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self._used:
            raise RuntimeError("a Journal records once")
        self._used = True
        known = _KNOWN.get(id(self.graph))
        for g in known[1] if known is not None and known[0] is self.graph else all_graphs(self.graph):
            self._seen[id(g)] = self._graphs[id(g)] = _GraphState(g)
        model = self.graph.__dict__.get(_BACKREF)
        if model is not None:
            self._model = _ModelState(model)
        if not _ACTIVE:
            _install()
        _ACTIVE.append(self)
        self.recording = True

    def stop(self) -> None:
        if not self.recording:
            return
        self.recording = False
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _uninstall()

    def _created_obj(self, obj: Any) -> None:
        key = id(obj)
        self._created[key] = obj
        if key not in self._seen:
            self._seen[key] = obj

    def _touch(self, obj: Any) -> None:
        if id(obj) not in self._seen:
            self._save(obj)

    def _save(self, obj: Any) -> None:
        """Save ``obj``'s state (the first touch of an object neither saved nor created)."""
        key = id(obj)
        if type(obj) is _NODE:  # (gs's own Node told by identity: isinstance walks a Tensor's classes first)
            self._seen[key] = self._nodes[key] = _NodeState(obj)
        elif isinstance(obj, gs.Tensor):  # (the most saved: a node's edit touches its tensors)
            self._seen[key] = self._tensors[key] = _TensorState(obj)
        elif isinstance(obj, gs.Node):
            self._seen[key] = self._nodes[key] = _NodeState(obj)
        elif isinstance(obj, gs.Graph):
            self._seen[key] = self._graphs[key] = _GraphState(obj)

    def _loaded(self, t: gs.Tensor, lazy: Any, array: Any) -> None:
        """gs's ``values`` getter replaced a lazy weight by its array: not an edit, but the
        lazy form is put back on a rollback (the export writes it as it was read). A tensor
        saved before keeps the array, to tell it from one the pass assigns."""
        key = id(t)
        if key in self._created or key in self._loads:
            return
        st = self._tensors.get(key)
        if st is not None:
            if st.dict.get("_values") is not lazy:
                return  # the pass assigned this lazy form: restored with the rest
            st.loaded = array
        self._loads[key] = (t, lazy)

    # -- reading --------------------------------------------------------------------------

    @property
    def edits(self) -> int:
        """How many objects the journal saved (graphs and the model, saved at the start, aside)."""
        return len(self._nodes) + len(self._tensors)

    def touched_nodes(self) -> list[gs.Node]:
        """The nodes the pass created (and kept in a graph), removed from a graph, changed, or
        whose input tensors changed class, name, shape, dtype or values; each once."""
        out: dict[int, gs.Node] = {}
        for key, st in self._nodes.items():
            if st.changed():
                out[key] = st.obj
        for obj in self._created.values():
            if isinstance(obj, gs.Node):
                out[id(obj)] = obj
        for st in self._graphs.values():
            now = st.obj.__dict__.get("nodes")
            if now is not None and not _same(now, st.nodes):
                new = {id(n) for n in now}
                for n in st.nodes:
                    if id(n) not in new:
                        out[id(n)] = n
                old = {id(n) for n in st.nodes}
                for n in now:
                    if id(n) not in old:
                        out[id(n)] = n
        for st in self._tensors.values():
            if st.value_changed():
                for n in st.obj.__dict__.get("outputs", ()):
                    out[id(n)] = n
                for n in st.outputs:
                    out[id(n)] = n
        return list(out.values())

    def touched_tensors(self) -> list[gs.Tensor]:
        return [st.obj for st in self._tensors.values()]

    def _only_nodes_and_readers_changed(self) -> bool:
        """Nothing created and kept, no graph's lists or attributes, not the model, and of the
        tensors only their lists of readers (what rewiring a node's inputs changes)."""
        if self._created:
            return False
        # the graphs and the model first: a pass that added or removed nodes is told at once,
        # before the walk over every tensor it touched
        for st in self._graphs.values():
            d = st.obj.__dict__
            if (d.keys() != st.dict.keys() or any(d[k] is not v for k, v in st.dict.items())
                    or not _same(d.get("nodes", ()), st.nodes) or not _same(d.get("inputs", ()), st.inputs)
                    or not _same(d.get("outputs", ()), st.outputs) or d.get(_META) != st.meta
                    or (st.functions is not None and not _same(d.get("_functions", ()), st.functions))):
                return False
        model = self._model
        if model is not None and (model.obj.__dict__.keys() != model.dict.keys()
                                  or any(model.obj.__dict__[k] is not v for k, v in model.dict.items())
                                  or any(model.dict[k] != saved for k, saved in model.dicts.items())):
            return False
        for st in self._tensors.values():
            t = st.obj
            if (st.value_changed() or (t.__dict__.get(_META) or {}) != (st.meta or {})
                    or not _same(t.__dict__.get("inputs", ()), st.inputs)):
                return False
        return True

    def constant_swaps(self) -> list[tuple[gs.Node, int, gs.Constant, gs.Constant]] | None:
        """When the pass changed nothing but which Constant some node inputs read (a Constant
        replaced by another one, as common-subexpression elimination merges equal weights):
        ``(node, input index, the Constant before, the Constant now)`` of each such input. None
        when it changed anything else (see :meth:`annotation_edits`) or no input."""
        if not self._only_nodes_and_readers_changed():
            return None
        out = []
        for st in self._nodes.values():
            node = st.obj
            if not st.same_but_inputs_and_meta() or (node.__dict__.get(_META) or {}) != (st.meta or {}):
                return None
            now = node.__dict__.get("inputs", ())
            if len(now) != len(st.inputs):
                return None
            for i, (old, new) in enumerate(zip(st.inputs, now)):
                if old is not new:
                    if not (isinstance(old, gs.Constant) and isinstance(new, gs.Constant)):
                        return None
                    out.append((node, i, old, new))
        return out or None

    def annotation_edits(self) -> list[tuple[gs.Node, dict | None, dict | None]] | None:
        """When the pass changed nothing but node annotations: ``(node, annotations before,
        annotations now)`` of each node whose annotations changed. None when it changed anything
        else (a node's op, attributes, wiring or class; a tensor; a graph's lists; the model;
        an object it created and kept) or edited no node."""
        if not self._only_nodes_and_readers_changed() or any(
                not _same(st.obj.__dict__.get("outputs", ()), st.outputs) for st in self._tensors.values()):
            return None
        out = []
        for st in self._nodes.values():
            node = st.obj
            if not st.same_but_inputs_and_meta() or not _same(node.__dict__.get("inputs", ()), st.inputs):
                return None
            now = node.__dict__.get(_META)
            if (now or {}) != (st.meta or {}):  # (an empty annotation dict made by a read is none)
                out.append((node, st.meta, _copy_meta(node)))
        return out or None

    def changed_tensors(self) -> list[gs.Tensor]:
        """The tensors (not created by the pass) whose class, name, shape, dtype, values or
        annotations changed; a tensor only rewired (its producer or readers) is not listed."""
        return [st.obj for st in self._tensors.values()
                if st.value_changed() or st.obj.__dict__.get(_META) != st.meta]

    # -- undo -----------------------------------------------------------------------------

    def rollback(self) -> None:
        """Put every object the journal saved back in the state it had before its first edit
        (the journal stops recording first)."""
        self.stop()
        for st in reversed(list(self._tensors.values())):
            st.restore()
        for st in reversed(list(self._nodes.values())):
            st.restore()
        for st in reversed(list(self._graphs.values())):
            st.restore()
        for t, lazy in self._loads.values():
            t.__dict__["_values"] = lazy
        if self._model is not None:
            self._model.restore()


# -- the hooks ----------------------------------------------------------------------------

_OWN: dict[tuple[type, str], Any] = {}  # (class, name) -> the class's own attribute (None: inherited)
_BASE: dict[tuple[type, str], Any] = {}  # (class, name) -> the method the hook calls


def _touch_many(owner: Any, items: Any) -> None:
    for j in _ACTIVE:
        seen = j._seen
        if id(owner) not in seen:
            j._save(owner)
        for o in items:
            if id(o) not in seen:
                j._save(o)


def _wrap_setattr(orig):
    def __setattr__(self, name, value):
        key = id(self)
        for j in _ACTIVE:
            if key not in j._seen:
                j._save(self)
        orig(self, name, value)
    return __setattr__


def _values_property(orig: property) -> property:
    """gs's ``Constant.values``, whose getter replaces a lazy weight by its array: that read is
    not an edit (no state saved, not a touched value); the lazy form is put back on a rollback."""
    LazyValues = gs.ir.tensor.LazyValues

    def fget(self):
        lazy = self.__dict__.get("_values")
        if isinstance(lazy, LazyValues):
            array = load_lazy(lazy)
            for j in _ACTIVE:
                j._loaded(self, lazy, array)
            object.__setattr__(self, "_values", array)  # gs's own assignment, without the hook
            return array
        return orig.fget(self)

    return property(fget, orig.fset, orig.fdel, orig.__doc__)


def _wrap_delattr(orig):
    def __delattr__(self, name):
        for j in _ACTIVE:
            j._touch(self)
        orig(self, name)
    return __delattr__


def _wrap_init(orig):
    fast = _FAST_INITS.get(orig)

    def __init__(self, *args, **kwargs):
        global _GRAPHS_MADE
        for j in _ACTIVE:
            j._created_obj(self)
        if _ACTIVE and isinstance(self, gs.Graph):
            _GRAPHS_MADE += 1
        if fast is not None and type(self) in _FAST_CLASSES and fast(self, *args, **kwargs):
            return
        orig(self, *args, **kwargs)
    return __init__


# -- constructors without the setattr hooks ---------------------------------------------------
# An object made while a journal records needs no undo, but gs's constructors set each attribute
# through ``__setattr__`` (hooked: ~12 hooked calls per node and its output tensor; fold_batchnorm
# makes five objects per fold). These write the same attributes, in gs's order, into the new
# object's ``__dict__``; the lists are built by gs's list class (its hooked ``extend`` saves the
# state of a tensor a new node reads or writes). Used for gs's own Node, Variable and Constant
# only, and only when gs's constructor is the one they mirror (its parameters and the names it
# uses); a constructor returns False to hand a call it does not mirror to gs's.

def _sync_list(owner, field_name, initial):
    """``misc.SynchronizedList(owner, field_name=field_name, initial=initial)``; an empty one of
    graphpass's lean class made without its hooked ``extend`` (nothing to touch: its owner is new)."""
    cls = misc.SynchronizedList
    if initial or cls is not SyncList:
        return cls(owner, field_name=field_name, initial=initial if initial is not None else [])
    lst = list.__new__(SyncList)
    lst.parent_obj = owner
    lst.field_name = field_name
    return lst


def _node_init(self, op, name=None, attrs=None, inputs=None, outputs=None, domain=None) -> bool:
    d = self.__dict__
    d["op"] = op
    d["name"] = name if name is not None else ""
    d["attrs"] = attrs if attrs is not None else OrderedDict()
    d["inputs"] = _sync_list(self, "outputs", inputs)
    d["outputs"] = _sync_list(self, "inputs", outputs)
    d["domain"] = domain
    return True


def _tensor_dict(self, name) -> dict:
    """A new tensor's name and its empty lists of producers and readers, as gs's Tensor makes them."""
    d = self.__dict__
    d["name"] = name
    d["inputs"] = _sync_list(self, "outputs", None)
    d["outputs"] = _sync_list(self, "inputs", None)
    return d


def _variable_init(self, name, dtype=None, shape=None, type="tensor_type") -> bool:  # noqa: A002 - gs's name
    d = _tensor_dict(self, name)
    d["dtype"] = dtype
    d["shape"] = shape
    d["type"] = type
    return True


def _constant_init(self, name, values, data_location=None, export_dtype=None) -> bool:
    if not isinstance(values, (np.ndarray, gs.ir.tensor.LazyValues)):
        return False  # gs's own check and message
    d = _tensor_dict(self, name)
    d["_values"] = values
    d["data_location"] = data_location
    d["_export_dtype"] = export_dtype
    return True


#: (parameters, names used) of the gs constructors the fast ones mirror (onnx-graphsurgeon 0.5 / 0.6)
_MIRRORS = {
    "Node": (("self", "op", "name", "attrs", "inputs", "outputs", "domain"),
             ("op", "misc", "default_value", "name", "OrderedDict", "attrs", "SynchronizedList", "inputs", "outputs",
              "domain"), _node_init),
    "Variable": (("self", "name", "dtype", "shape", "type"),
                 ("name", "misc", "SynchronizedList", "inputs", "outputs", "dtype", "default_value", "shape", "type"),
                 _variable_init),
    "Constant": (("self", "name", "values", "data_location", "export_dtype"),
                 ("name", "misc", "SynchronizedList", "inputs", "outputs", "isinstance", "np", "ndarray", "LazyValues",
                  "SparseValues", "G_LOGGER", "critical", "format", "_values", "data_location", "_export_dtype"),
                 _constant_init),
}


def _fast_inits() -> dict[Any, Any]:
    out = {}
    for cls in (gs.Node, gs.Variable, gs.Constant):
        params, names, fast = _MIRRORS[cls.__name__]
        init = cls.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None and code.co_varnames[:code.co_argcount] == params and code.co_names == names:
            out[init] = fast
    return out


_FAST_INITS = _fast_inits()
#: exact classes only: a subclass may set its attributes its own way
_FAST_CLASSES = frozenset({gs.Node, gs.Variable, gs.Constant})


def _items_at(lst: list, index: Any) -> list:
    if isinstance(index, slice):
        return list.__getitem__(lst, index)
    try:
        return [list.__getitem__(lst, index)]
    except (IndexError, TypeError):
        return []


def _touch_seq(items: Any) -> None:
    """Save the state of each of ``items`` not saved (nor created) yet, in every active journal."""
    for j in _ACTIVE:
        seen = j._seen
        for o in items:
            if id(o) not in seen:
                j._save(o)


def _list_hooks() -> dict[str, Any]:
    """name -> (gs's method -> the hooked method): the list's owner, then the elements whose
    mirror list changes, are touched before gs's method runs (the hot ones spelled out: a
    rewrite makes several such edits per node it removes or builds)."""

    def delitem(base):
        def __delitem__(self, index):
            _touch_many(self.parent_obj, _items_at(self, index))
            return base(self, index)
        return __delitem__

    def setitem(base):
        def __setitem__(self, index, elem):
            if type(index) is int:
                try:
                    was = list.__getitem__(self, index)
                except IndexError:
                    _touch_seq((self.parent_obj, elem))
                    return base(self, index, elem)
                owner = self.parent_obj
                for j in _ACTIVE:  # (_touch_seq spelled out: the most frequent edit, node.inputs[i] = t)
                    seen = j._seen
                    if id(owner) not in seen:
                        j._save(owner)
                    if id(was) not in seen:
                        j._save(was)
                    if id(elem) not in seen:
                        j._save(elem)
                return base(self, index, elem)
            else:
                new = list(elem) if isinstance(index, slice) else [elem]
                items = [self.parent_obj, *_items_at(self, index), *new]
            _touch_seq(items)
            return base(self, index, elem)
        return __setitem__

    def append(base):
        def append(self, x):
            _touch_seq((self.parent_obj, x))
            return base(self, x)
        return append

    def extend(base):
        def extend(self, iterable):
            items = list(iterable)
            _touch_many(self.parent_obj, items)
            return base(self, items)
        return extend

    def insert(base):
        def insert(self, i, x):
            _touch_seq((self.parent_obj, x))
            return base(self, i, x)
        return insert

    def remove(base):
        def remove(self, x):
            _touch_seq((self.parent_obj, x))
            return base(self, x)
        return remove

    def pop(base):
        def pop(self, i=-1):
            _touch_many(self.parent_obj, _items_at(self, i))
            return base(self, i)
        return pop

    def clear(base):
        def clear(self):
            owner = self.parent_obj
            if len(_ACTIVE) == 1 and base is _LEAN_CLEAR:
                # one journal and graphpass's lean list: each element saved and left (the owner
                # removed from its mirror list, as SyncList.clear does) in one loop, the owner first
                j = _ACTIVE[0]
                seen = j._seen
                if id(owner) not in seen:
                    j._save(owner)
                field = self.field_name
                for o in list.__iter__(self):
                    if id(o) not in seen:
                        j._save(o)  # (before its list changes; another element's change never touches it)
                    others = getattr(o, field)
                    for i, x in enumerate(others):
                        if x is owner:
                            list.__delitem__(others, i)
                            break
                        if i == 8:  # a long list: searched by id (SyncList._remove_from_elem)
                            self._remove_from_elem(o)
                            break
                    else:
                        list.remove(others, owner)  # not there: gs's ValueError
                list.clear(self)
                return None
            for j in _ACTIVE:
                seen = j._seen
                if id(owner) not in seen:
                    j._save(owner)
                for o in list.__iter__(self):
                    if id(o) not in seen:
                        j._save(o)
            return base(self)
        return clear

    def sort(base):
        def sort(self, *args, **kwargs):
            _touch_seq((self.parent_obj,))
            return base(self, *args, **kwargs)
        return sort

    def reverse(base):
        def reverse(self):
            _touch_seq((self.parent_obj,))
            return base(self)
        return reverse

    return {"__delitem__": delitem, "__setitem__": setitem, "append": append, "extend": extend,
            "insert": insert, "remove": remove, "pop": pop, "clear": clear, "sort": sort, "reverse": reverse}


#: (class, name) -> (gs's method, its hook): the hooks made once, installed again by every journal
#: that starts with none recording (~40 per pipeline run)
_MADE: dict[tuple[type, str], tuple[Any, Any]] = {}


_LIST_HOOKS = _list_hooks()
_LEAN_CLEAR = SyncList.clear  # (the method the fused clear hook above does the work of)


def _patch(cls: type, name: str, make: Any) -> None:
    base = next(k.__dict__[name] for k in cls.__mro__ if name in k.__dict__)
    _OWN[(cls, name)] = cls.__dict__.get(name)
    _BASE[(cls, name)] = base
    made = _MADE.get((cls, name))
    if made is None or made[0] is not base:
        made = _MADE[(cls, name)] = (base, make(base))
    setattr(cls, name, made[1])


def _install() -> None:
    for cls in (gs.Node, gs.Tensor, gs.Graph):
        _patch(cls, "__setattr__", _wrap_setattr)
        _patch(cls, "__delattr__", _wrap_delattr)  # Variable.to_constant deletes dtype and shape
    for cls in (gs.Node, gs.Variable, gs.Constant, gs.Graph):
        _patch(cls, "__init__", _wrap_init)
    _patch(gs.Constant, "values", _values_property)
    for name, make in _LIST_HOOKS.items():
        _patch(SynchronizedList, name, make)


def _uninstall() -> None:
    for (cls, name), own in _OWN.items():
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)
    _OWN.clear()
    _BASE.clear()
