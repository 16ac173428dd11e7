"""ONNX -> onnx-graphsurgeon import without gs's per-object overhead (issue 22).

gs's importer builds every tensor and node through ``__init__`` and ``__setattr__`` hooks and
converts each tensor's dtype through ``onnx.helper.get_all_tensor_dtypes()`` (a fresh list per
call): about 30 us per tensor, half the load of a large model. :func:`import_onnx` builds the
same objects (the same classes, fields, field order and values, the same sharing of tensors
between a graph and its bodies) directly, converts each distinct ONNX dtype once, with gs's
own functions, and reads each distinct value type (a serialized TypeProto) once. One difference: a node's attributes are a plain ``dict`` (ordered too), not an
``OrderedDict`` (224 bytes less per node; gs compares attributes with ``==`` and iterates
them, nothing else). What it does not build itself (sparse initializers, non-tensor value types,
unknown dtypes, attributes gs skips or turns into references, local functions) it hands to gs's
importer, so those keep gs's exact behaviour, warnings included.

tests/ir/test_fast_import.py compares it with gs's importer object by object on every model of
onnx's backend test data, the exporter corpus and the suite's own files.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers import onnx_importer as gi
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.util import misc

from graphpass.ir.lean import SyncList

__all__ = ["Made", "import_onnx", "lazy_values"]

_Importer = gi.OnnxImporter
_TensorProto = onnx.TensorProto
_A = onnx.AttributeProto
#: attribute types built here (the rest, and any reference, go to gs's import_attributes)
_SIMPLE = frozenset({_A.FLOAT, _A.INT, _A.STRING, _A.TENSOR, _A.GRAPH, _A.FLOATS, _A.INTS, _A.STRINGS})

_Variable = gs.Variable
_Node = gs.Node
_new_object = object.__new__
_new_list = list.__new__
_list_extend = list.extend
_list_append = list.append
_dtypes: dict[int, Any] = {}  # ONNX elem type -> gs's dtype (a numpy type) when numpy has one
_itemsizes: dict[int, tuple[Any, int]] = {}
#: a serialized tensor TypeProto -> (gs's dtype, its shape as a tuple) for the ones built here
_types: dict[bytes, tuple[Any, tuple | None]] = {}
_TYPES_KEPT = 4096  # initializer data type -> (gs's dtype, itemsize)


class Made(list):
    """What an import made, for the loader (:mod:`graphpass.ir.serialize`): the Constants with
    lazy values it built itself, in the order built, each once, and, in ``attributes``, the ids
    of those it built for a node's attribute (always in the graph). ``complete`` is False once
    any part was handed to gs's importer (a function, a sparse initializer, a node's
    attributes): gs's Constants are not listed, gs's value types not looked at.
    ``other_types``: some value info of a graph it imported (input, output or value_info, read
    or not) has a type other than a tensor type (or one it does not tell: an empty oneof with
    other fields). ``unsorted``: some node (of any graph it imported) writes a tensor an earlier
    node, or the node itself, already reads: without it every graph's nodes are in topological
    order (what ``graph._is_sorted`` finds: a reader met before its producer marks it)."""

    __slots__ = ("attributes", "complete", "other_types", "unsorted")

    def __init__(self):
        super().__init__()
        self.attributes: set[int] = set()
        self.complete = True
        self.other_types = False
        self.unsorted = False


def _note_type(vi: onnx.ValueInfoProto, made: "Made | None") -> None:
    """For a value info the import passes over: whether its type is another than a tensor's."""
    if made is not None and vi.type.WhichOneof("value") not in (None, "tensor_type"):
        made.other_types = True


def _empty_list(owner: Any, field_name: str) -> list:
    """``misc.SynchronizedList(owner, field_name=field_name, initial=[])``; for graphpass's lean
    list (:mod:`graphpass.ir.lean`, what gs builds once graphpass.ir is imported) its two slots
    are set directly (no ``__init__`` and ``extend([])`` frames: ~1/3 of the cost, four lists a
    node and tensor)."""
    cls = misc.SynchronizedList
    if cls is not SyncList:
        return cls(owner, field_name=field_name, initial=[])
    lst = _new_list(SyncList)
    lst.parent_obj = owner
    lst.field_name = field_name
    return lst


def _filled_list(owner: Any, field_name: str, items: list) -> list:
    """``misc.SynchronizedList(owner, field_name=field_name, initial=items)``: for the lean list,
    the items in, and ``owner`` appended to each item's ``field_name`` list (SyncList.extend's
    wiring, written inline)."""
    cls = misc.SynchronizedList
    if cls is not SyncList:
        return cls(owner, field_name=field_name, initial=items)
    lst = _new_list(SyncList)
    lst.parent_obj = owner
    lst.field_name = field_name
    _list_extend(lst, items)
    for elem in items:
        _list_append(getattr(elem, field_name), owner)
    return lst


def _variable(name: str, dtype: Any = None, shape: Any = None, type_: str | None = "tensor_type") -> gs.Variable:
    """``gs.Variable(name, dtype, shape, type_)`` without its ``__setattr__`` hooks."""
    t = _new_object(_Variable)
    d = t.__dict__
    d["name"] = name
    if misc.SynchronizedList is SyncList:  # _empty_list's lean case, written inline
        lst = _new_list(SyncList)
        lst.parent_obj = t
        lst.field_name = "outputs"
        d["inputs"] = lst
        lst = _new_list(SyncList)
        lst.parent_obj = t
        lst.field_name = "inputs"
        d["outputs"] = lst
    else:
        d["inputs"] = _empty_list(t, "outputs")
        d["outputs"] = _empty_list(t, "inputs")
    d["dtype"] = dtype
    d["shape"] = shape
    d["type"] = type_
    return t


def _elem_dtype(elem: int) -> Any:
    dtype = _dtypes.get(elem)
    if dtype is None:
        dtype = gi.get_numpy_type(elem)
        if dtype is None:
            return None
        _dtypes[elem] = dtype
    return dtype


def _value_info(vi: onnx.ValueInfoProto, made: "Made | None" = None) -> gs.Tensor:
    """gs's ``import_tensor`` of a ValueInfoProto (a type other than a tensor's noted in ``made``)."""
    ty = vi.type
    key = ty.SerializeToString()  # most values share a few types: each read once
    known = _types.get(key)
    if known is not None:
        dtype, shape = known
        return _variable(vi.name, dtype, None if shape is None else list(shape))
    if ty.HasField("tensor_type"):
        typed = tensor_type(ty)
        if typed is not None:
            if len(_types) >= _TYPES_KEPT:
                _types.clear()
            _types[key] = typed
            dtype, shape = typed
            return _variable(vi.name, dtype, None if shape is None else list(shape))
    elif ty.ByteSize() == 0:
        return _variable(vi.name)
    elif made is not None:  # (a oneof left empty beside other fields counts too: the loader then looks)
        made.other_types = True
    return _Importer.import_tensor(vi)  # other value types, unknown dtypes: gs, warning included


def tensor_type(ty: onnx.TypeProto) -> "tuple[Any, tuple | None] | None":
    """``(gs's dtype, shape as a tuple or None)`` of a tensor type as the import reads it (a dim
    is its number, its name or None), or None for any other type (another value type, a tensor
    of a dtype numpy does not have, an empty type: the import hands those to gs or notes them)."""
    if not ty.HasField("tensor_type"):
        return None
    tt = ty.tensor_type
    dtype = _dtypes.get(tt.elem_type) or _elem_dtype(tt.elem_type)
    if dtype is None:
        return None
    if not tt.HasField("shape"):
        return dtype, None
    shape = []
    for dim in tt.shape.dim:
        which = dim.WhichOneof("value")  # dim_value and dim_param are a oneof
        if which == "dim_param":
            shape.append(dim.dim_param)
        elif which == "dim_value":
            shape.append(dim.dim_value)
        else:
            shape.append(None)
    return dtype, tuple(shape)


def lazy_values(tp: onnx.TensorProto) -> LazyValues:
    """``LazyValues(tp)`` without its per-call imports and dtype conversion (the same fields)."""
    known = _itemsizes.get(tp.data_type)
    if known is None:
        dtype = gi.get_onnx_tensor_dtype(tp)
        known = _itemsizes[tp.data_type] = (dtype, gi.get_itemsize(dtype))
    lazy = object.__new__(LazyValues)
    d = lazy.__dict__
    d["tensor"] = tp
    d["shape"] = tp.dims
    d["dtype"] = known[0]
    d["nbytes"] = misc.volume(tp.dims) * known[1]
    return lazy


def _constant(tp: onnx.TensorProto, made: "Made | None" = None) -> gs.Constant:
    """gs's ``import_tensor`` of a TensorProto: a Constant with lazy values (listed in ``made``)."""
    lazy = lazy_values(tp)
    c = object.__new__(gs.Constant)
    d = c.__dict__
    d["name"] = tp.name
    d["inputs"] = _empty_list(c, "outputs")
    d["outputs"] = _empty_list(c, "inputs")
    d["_values"] = lazy
    d["data_location"] = int(tp.data_location) if tp.HasField("data_location") else None
    d["_export_dtype"] = None
    if made is not None:
        made.append(c)
    return c


def _attributes(node: onnx.NodeProto, outer: dict, local: dict, opset, domains, made: "Made | None" = None) -> dict:
    attrs: dict = {}
    for a in node.attribute:
        t = a.type
        if t not in _SIMPLE or a.ref_attr_name:
            if made is not None:
                made.complete = False
            return _Importer.import_attributes(node.attribute, outer, local, opset, domains)
        if t == _A.INT:
            attrs[a.name] = a.i
        elif t == _A.FLOAT:
            attrs[a.name] = a.f
        elif t == _A.INTS:
            attrs[a.name] = list(a.ints)
        elif t == _A.FLOATS:
            attrs[a.name] = list(a.floats)
        elif t == _A.STRING:
            attrs[a.name] = a.s.decode()
        elif t == _A.STRINGS:
            attrs[a.name] = [p.decode() for p in a.strings]
        elif t == _A.TENSOR:
            c = attrs[a.name] = _constant(a.t, made)
            if made is not None:
                made.attributes.add(id(c))
        else:  # GRAPH
            attrs[a.name] = import_graph(a.g, misc.combine_dicts(outer, local), opset=opset, import_domains=domains,
                                         made=made)
    return attrs


def _node(proto: onnx.NodeProto, outer: dict, local: dict, opset, domains, made: "Made | None" = None) -> gs.Node:
    """gs's ``import_node``: the attributes first (a body sees the tensors imported before the
    node), then the inputs and outputs. For the lean list (:mod:`graphpass.ir.lean`) the
    node's two lists are filled as the tensors are found, each tensor's own list wired on the
    way (_filled_list's work without the lists in between: the same lists, in the same order)."""
    attrs = _attributes(proto, outer, local, opset, domains, made) if len(proto.attribute) else {}
    if misc.SynchronizedList is not SyncList:
        if made is not None:
            made.unsorted = True  # (not looked for there)
        return _node_generic(proto, outer, local, attrs)
    n = _new_object(_Node)
    append = _list_append
    inputs = _new_list(SyncList)
    inputs.parent_obj = n
    inputs.field_name = "outputs"
    for name in proto.input:
        t = local.get(name)
        if t is None:
            t = outer.get(name)
            if t is None:
                if name:
                    t = local[name] = _variable(name)
                else:
                    t = _variable("")
        append(inputs, t)
        append(t.outputs, n)
    outputs = _new_list(SyncList)
    outputs.parent_obj = n
    outputs.field_name = "inputs"
    for name in proto.output:
        t = local.get(name)
        if t is None:
            if name:
                t = local[name] = _variable(name)
            else:
                t = _variable("")
        elif t.outputs and made is not None:  # read before it is written (or by this node)
            made.unsorted = True
        append(outputs, t)
        append(t.inputs, n)
    d = n.__dict__
    d["op"] = proto.op_type
    d["name"] = proto.name
    d["attrs"] = attrs
    d["inputs"] = inputs
    d["outputs"] = outputs
    d["domain"] = proto.domain if proto.HasField("domain") else None
    return n


def _node_generic(proto: onnx.NodeProto, outer: dict, local: dict, attrs: dict) -> gs.Node:
    """:func:`_node` after the attributes, for any SynchronizedList."""
    inputs = []
    for name in proto.input:
        t = local.get(name)
        if t is None:
            t = outer.get(name)
            if t is None:
                if name:
                    t = local[name] = _variable(name)
                else:
                    t = _variable("")
        inputs.append(t)
    outputs = []
    for name in proto.output:
        t = local.get(name)
        if t is None:
            if name:
                t = local[name] = _variable(name)
            else:
                t = _variable("")
        outputs.append(t)
    n = _new_object(_Node)
    d = n.__dict__
    d["op"] = proto.op_type
    d["name"] = proto.name
    d["attrs"] = attrs
    d["inputs"] = _filled_list(n, "outputs", inputs)
    d["outputs"] = _filled_list(n, "inputs", outputs)
    d["domain"] = proto.domain if proto.HasField("domain") else None
    return n


def import_graph(graph: onnx.GraphProto, tensor_map: dict | None = None, opset=None, import_domains=None,
                 producer_name: str | None = None, producer_version: str | None = None,
                 functions: list | None = None, ir_version: int | None = None, made: "Made | None" = None,
                 value_infos: "list[tuple] | None" = None) -> gs.Graph:
    """gs's ``OnnxImporter.import_graph``; ``made``: see :class:`Made`. ``value_infos``: the
    graph's value infos as ``(name, dtype, shape)`` (:func:`tensor_type` of each, every one a
    tensor type it reads, no name twice), read in place of ``graph.value_info`` (the loader's,
    from shape inference: graphpass.ir.inference.infer_shapes_listed)."""
    outer = dict(tensor_map) if tensor_map else {}
    local: dict[str, gs.Tensor] = {}
    for tp in graph.initializer:
        if tp.name not in local and tp.name not in outer:
            local[tp.name] = _constant(tp, made)
    for sp in graph.sparse_initializer:
        name = sp.values.name
        if name not in local and name not in outer:
            if made is not None:
                made.complete = False
            local[name] = _Importer.import_tensor(sp)
    for name, dtype, shape in value_infos if value_infos is not None else ():  # the loop below's, for these
        have = local.get(name)
        if have is None:
            if name not in outer:
                local[name] = _variable(name, dtype, None if shape is None else list(shape))
        elif isinstance(have, gs.Variable):
            have.dtype = have.dtype or dtype
            have.shape = have.shape or (None if shape is None else list(shape))
    for vi in graph.value_info if value_infos is None else ():
        have = local.get(vi.name)
        if have is None:
            if vi.name not in outer:
                local[vi.name] = _value_info(vi, made)
            else:
                _note_type(vi, made)
        elif isinstance(have, gs.Variable):  # gs's overwrite: keep what is known, fill what is not
            new = _value_info(vi, made)
            have.dtype = have.dtype or new.dtype
            have.shape = have.shape or new.shape
        else:
            _note_type(vi, made)
    initializers = {t.name for t in graph.initializer}
    initializers.update(t.values.name for t in graph.sparse_initializer)
    inputs = []
    for vi in graph.input:
        if vi.name not in initializers:
            t = local.get(vi.name)
            if t is None:
                t = local[vi.name] = _value_info(vi, made)
            else:
                _note_type(vi, made)
            inputs.append(t)
        else:
            _note_type(vi, made)
    outputs = []
    for vi in graph.output:
        t = local.get(vi.name)
        if t is None:
            t = local[vi.name] = _value_info(vi, made)
        else:
            _note_type(vi, made)
        outputs.append(t)
    nodes = [_node(n, outer, local, opset, import_domains, made) for n in graph.node]
    return _graph(nodes, inputs=inputs, outputs=outputs, name=graph.name, doc_string=graph.doc_string,
                  producer_name=producer_name, producer_version=producer_version, opset=opset,
                  import_domains=import_domains, functions=functions or [], ir_version=ir_version)


def _graph(nodes: list, **fields) -> gs.Graph:
    """``gs.Graph(nodes=nodes, **fields)``. gs's ``__init__`` gives every body in the graph the
    graph's list of functions (``_merge_subgraph_functions``) through a generator per node; here
    the graph is made without nodes and the bodies, found on the few nodes that hold one, get
    the list after: the same when no body has functions of its own (a body imported here has
    none; else gs's ``__init__`` does it all)."""
    holders = [n for n in nodes if n.attrs and any(isinstance(v, gs.Graph) for v in n.attrs.values())]
    if any(sub.functions for n in holders for sub in n.subgraphs(recursive=True)):
        return gs.Graph(nodes=nodes, **fields)
    graph = gs.Graph(nodes=[], **fields)
    graph.nodes = nodes
    shared = graph.functions
    for n in holders:
        for sub in n.subgraphs(recursive=True):
            sub._functions = shared
    return graph


def import_onnx(model: onnx.ModelProto, made: "Made | None" = None, value_infos: "list[tuple] | None" = None
                ) -> gs.Graph:
    """``gs.import_onnx(model)``, faster (see the module docstring); ``made``: see :class:`Made`;
    ``value_infos``: the main graph's, see :func:`import_graph`."""
    if made is not None and len(model.functions):
        made.complete = False
    opset = _Importer.get_opset(model)
    domains = _Importer.get_import_domains(model)
    functions = [_Importer.import_function(f, model_opset=opset, model_import_domains=domains)
                 for f in model.functions]
    return import_graph(model.graph, opset=opset, import_domains=domains, producer_name=model.producer_name,
                        producer_version=model.producer_version, functions=functions, ir_version=model.ir_version,
                        made=made, value_infos=value_infos)
