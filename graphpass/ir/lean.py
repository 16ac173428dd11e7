"""A leaner gs IR for large graphs: the per-node lists without an instance dict each.

onnx-graphsurgeon gives every node two ``SynchronizedList``s (its inputs and outputs) and every
tensor two (its producers and readers): four lists per node and tensor, each a ``list``
subclass that carries its owner and field name in an instance ``__dict__`` (~160 bytes apiece,
1.6 KB per node on a CNN: the largest single item of the IR's Python heap). :class:`SyncList`
is the same list, method for method, with ``__slots__``; :func:`install` makes gs build it
(gs looks ``misc.SynchronizedList`` up at every construction). It is installed when
:mod:`graphpass.ir` is imported, before any graph is built, and only over the gs class it was
written against (the methods below); any other gs keeps its own.
"""

from __future__ import annotations

import logging

from onnx_graphsurgeon.util import misc

__all__ = ["SyncList", "install", "installed", "members", "release"]

log = logging.getLogger(__name__)


class SyncList(list):
    """gs's SynchronizedList with ``__slots__``: a list of the owner's inputs (or outputs) that
    keeps the other side's list (``field_name`` of each element) in step."""

    __slots__ = ("parent_obj", "field_name")

    def __init__(self, parent_obj, field_name, initial):
        self.parent_obj = parent_obj
        self.field_name = field_name
        self.extend(initial)

    def _add_to_elem(self, elem):
        list.append(getattr(elem, self.field_name), self.parent_obj)

    def _remove_from_elem(self, elem):
        # by identity: list.remove compares with == until it meets the owner, and gs's Node.__eq__
        # compares structure (op, attributes, every input and output): a tensor read by hundreds
        # of nodes (a shared constant after CSE) made each edit cost hundreds of structural
        # comparisons (issue 22: 277,202 of them, 2.3 s, on a 10k-node transformer), and an
        # equal but other node earlier in the list would be the one removed
        # (past its first places, a long list such as a shared constant's readers is searched
        # by id in C: ids of live objects are unique, so the first equal id is the owner's place)
        others = getattr(elem, self.field_name)
        owner = self.parent_obj
        for i, x in enumerate(others):
            if x is owner:
                list.__delitem__(others, i)
                return
            if i == 8:
                try:
                    list.__delitem__(others, 9 + list(map(id, others[9:])).index(id(owner)))
                    return
                except ValueError:
                    break
        list.remove(others, owner)  # not there: gs's ValueError

    def __delitem__(self, index):
        self._remove_from_elem(self[index])
        list.__delitem__(self, index)

    # (_add_to_elem spelled out in the hot methods below, and the short search of
    # _remove_from_elem in clear: a rewrite makes several such edits per node it builds or drops)

    def __setitem__(self, index, elem):
        self._remove_from_elem(self[index])
        list.__setitem__(self, index, elem)
        list.append(getattr(elem, self.field_name), self.parent_obj)

    def append(self, x):
        list.append(self, x)
        list.append(getattr(x, self.field_name), self.parent_obj)

    def extend(self, iterable):
        list.extend(self, iterable)
        field, owner = self.field_name, self.parent_obj
        for elem in iterable:
            list.append(getattr(elem, field), owner)

    def insert(self, i, x):
        list.insert(self, i, x)
        self._add_to_elem(x)

    def remove(self, x):
        list.remove(self, x)
        self._remove_from_elem(x)

    def pop(self, i=-1):
        elem = list.pop(self, i)
        self._remove_from_elem(elem)
        return elem

    def clear(self):
        field, owner = self.field_name, self.parent_obj
        for elem in self:
            others = getattr(elem, field)
            for i, x in enumerate(others):
                if x is owner:
                    list.__delitem__(others, i)
                    break
                if i == 8:  # a long list: _remove_from_elem searches its rest by id
                    self._remove_from_elem(elem)
                    break
            else:
                list.remove(others, owner)  # not there: gs's ValueError
        list.clear(self)

    def __add__(self, other_list):
        return list(self) + list(other_list)

    def __iadd__(self, other_list):
        self.extend(other_list)
        return self

    def __copy__(self):
        return list(self)

    def __deepcopy__(self, memo):
        return list(self)


#: The methods of the gs class SyncList mirrors (onnx-graphsurgeon 0.3 to 0.5).
_MIRRORED = frozenset({"__init__", "_add_to_elem", "_remove_from_elem", "__delitem__", "__setitem__", "append",
                       "extend", "insert", "remove", "pop", "clear", "__add__", "__iadd__", "__copy__",
                       "__deepcopy__"})
_ORIGINAL = misc.SynchronizedList


def installed() -> bool:
    return misc.SynchronizedList is SyncList


def install() -> bool:
    """Make gs build :class:`SyncList`; False (gs left alone) when gs's class is not the one
    it mirrors."""
    if installed():
        return True
    own = {k for k, v in vars(_ORIGINAL).items() if callable(v)}
    if own != _MIRRORED or _ORIGINAL.__bases__ != (list,):
        log.debug("onnx-graphsurgeon's SynchronizedList has other methods (%s): kept", sorted(own ^ _MIRRORED))
        return False
    misc.SynchronizedList = SyncList
    return True


install()


def members(graphs) -> tuple[list, list]:
    """The nodes of ``graphs`` and the tensors they read and write, with the graphs' inputs and
    outputs (a tensor may be listed more than once)."""
    nodes = [n for g in graphs for n in g.nodes]
    tensors = [t for n in nodes for t in n.inputs]
    tensors += [t for n in nodes for t in n.outputs]
    tensors += [t for g in graphs for t in (*g.inputs, *g.outputs)]
    return nodes, tensors


def release(before: tuple[list, list], graphs) -> int:
    """Hand the objects of ``before`` (:func:`members` of the graphs earlier) that are no longer in
    ``graphs`` and are connected to nothing (no producer, reader, input or output) back to
    reference counting: each gets plain empty lists in place of its two SyncLists, which hold
    their owner (a node or tensor is a cycle with its own lists, so a removed one waited for a
    full collection of the whole heap: ~1-2 s after a 100k-node pipeline). Returns how many."""
    nodes, tensors = members(graphs)
    live = set(map(id, nodes))
    live.update(map(id, tensors))
    del nodes, tensors
    released = 0
    for objs in before:
        for o in objs:  # (all alive while ``before`` holds them: their ids stay their own)
            if id(o) in live:
                continue
            live.add(id(o))  # (listed more than once)
            d = o.__dict__
            ins, outs = d.get("inputs"), d.get("outputs")
            if type(ins) is SyncList and type(outs) is SyncList and not ins and not outs:
                d["inputs"] = []
                d["outputs"] = []
                released += 1
    return released
