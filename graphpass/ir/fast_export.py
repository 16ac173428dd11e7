"""onnx-graphsurgeon -> ONNX export that builds the model in place (issue 22).

gs's exporter makes every node a standalone ``NodeProto``, keeps them all in a list, copies
the list into a ``GraphProto`` (``make_graph``) and copies that graph into a ``ModelProto``
(``make_model``): three copies of the graph's structure alive at once. On a 100k-node model the
export raised the process's peak by ~430 MB for a 34 MB model. :func:`export_onnx` writes each
node straight into ``model.graph`` (and each body straight into its attribute), one node's
attributes at a time. Value infos and plain attribute values (a Python int, float, str, or a
list of only ints or only floats) are written in place, as gs's functions would write them;
everything else (other attribute values, initializers, local functions, opset imports) goes
through gs's own functions, so the result is the same message:
tests/ir/test_fast_export.py compares the serialized bytes with gs's exporter on every model of
onnx's backend test data, the exporter corpus and the suite's own files.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters import onnx_exporter
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter
from onnx_graphsurgeon.ir.tensor import SparseValues

from graphpass.ir import annotations

__all__ = ["export_onnx"]

_GRAPH = onnx.AttributeProto.GRAPH
_ANNOTATIONS = annotations._KEY
_dtype_to_onnx = onnx_exporter.dtype_to_onnx
_elem_types: dict = {}  # (type of the dtype, dtype) -> what gs's dtype_to_onnx returns for it


_A = onnx.AttributeProto
_INT, _FLOAT, _STRING, _INTS, _FLOATS = _A.INT, _A.FLOAT, _A.STRING, _A.INTS, _A.FLOATS


def _add_plain_attribute(field, key: str, val) -> bool:
    """What gs's ``export_attributes({key: val})`` (onnx's ``make_attribute``) adds to ``field``,
    written in place for the plain values most attributes hold: a Python int, float or str, or
    a non-empty list of only ints or only floats (exact types: a bool, a numpy scalar, a mixed
    or empty list ... go through gs, which decides). False: nothing added."""
    t = type(val)
    if t is int:
        a = field.add()
        a.name = key
        a.i = val
        a.type = _INT
    elif t is float:
        a = field.add()
        a.name = key
        a.f = val
        a.type = _FLOAT
    elif t is str:
        a = field.add()
        a.name = key
        a.s = val.encode("utf-8")
        a.type = _STRING
    elif t is list and val:
        first = type(val[0])
        if first is not int and first is not float:
            return False
        for v in val:
            if type(v) is not first:
                return False
        a = field.add()
        a.name = key
        if first is int:
            a.ints.extend(val)
            a.type = _INTS
        else:
            a.floats.extend(val)
            a.type = _FLOATS
    else:
        return False
    return True


_tensor_types: dict = {}  # (elem type, *dims) -> the TypeProto written for it


def _tensor_type(elem: int, shape: list) -> onnx.TypeProto:
    """The TypeProto :func:`_add_value_info` writes for a tensor of ``elem`` and ``shape`` (a
    list of ints, strs and Nones)."""
    ty = onnx.TypeProto()
    tt = ty.tensor_type
    tt.elem_type = elem
    tt.shape.SetInParent()
    dims = tt.shape.dim
    for d in shape:
        if d is None:
            dims.add()
        elif type(d) is int:
            dims.add().dim_value = d
        else:
            dims.add().dim_param = d
    return ty


def _add_value_info(field, tensor: gs.Tensor) -> None:
    """``field.append(OnnxExporter.export_value_info_proto(tensor, False))``, written in place:
    gs's ``make_tensor_value_info`` builds a TypeProto, copies it in, and converts the dtype
    through a dict it builds per call (~16 us a tensor). A tensor type gs would refuse or build
    otherwise (a shape item neither int nor str nor None, a sequence or sparse type, an
    unhashable dtype) goes through gs's function."""
    dtype = tensor.dtype
    if dtype is None:
        field.add().name = tensor.name
        return
    if isinstance(tensor, gs.Constant) or tensor.type == "tensor_type":
        try:
            key = (type(dtype), dtype)
            elem = _elem_types.get(key)
        except TypeError:
            key = elem = None
        if elem is None and key is not None:
            elem = _dtype_to_onnx(dtype)
            if type(elem) is int:
                _elem_types[key] = elem
            else:
                elem = None
        if elem is not None:
            shape = tensor.shape
            if type(shape) is list:
                for d in shape:
                    t = type(d)
                    if t is not int and t is not str and d is not None:
                        break
                else:  # a type met before: copied whole (most tensors of a graph share a few)
                    key = (elem, *shape)
                    known = _tensor_types.get(key)
                    if known is None:
                        if len(_tensor_types) >= 4096:
                            _tensor_types.clear()
                        known = _tensor_types[key] = _tensor_type(elem, shape)
                    vi = field.add()
                    vi.name = tensor.name
                    vi.type.CopyFrom(known)
                    return
            vi = field.add()
            vi.name = tensor.name
            tt = vi.type.tensor_type
            tt.elem_type = elem
            if shape is None:
                return
            dims = tt.shape.dim
            tt.shape.SetInParent()  # an empty shape is written (a scalar), as gs writes it
            for d in shape:
                if d is None:
                    dims.add()
                elif type(d) is int:
                    dims.add().dim_value = d
                elif type(d) is str:
                    dims.add().dim_param = d
                else:  # an int or str subclass, or what gs refuses: gs decides
                    del field[-1]
                    break
            else:
                return
    field.append(OnnxExporter.export_value_info_proto(tensor, False))


def export_onnx(graph: gs.Graph, value_infos: "set[str] | None" = None, maps: "dict | None" = None
                ) -> onnx.ModelProto:
    """What ``gs.export_onnx(graph, do_type_check=False)`` returns, built without the copies.

    Args:
        value_infos: when given, ``value_info`` is written only for the tensors named in it and
            for annotated tensors (:mod:`graphpass.ir.annotations`), in every graph whose tensors
            have distinct names (the rest as gs writes it): what a caller that prunes value_info
            to those (serialize's save) would keep, without making the others first.
        maps: when given, each exported graph whose named tensors have distinct names gets an
            entry ``id(graph) -> (graph, {name: tensor})``: its named tensors (inputs, each node's
            inputs and outputs, outputs) by first appearance, the map annotations.write_to_proto
            makes (it reads it instead of walking the nodes again).
    """
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION  # as make_model: stored even when the graph sets its own
    _fill_graph(model.graph, graph, value_infos, maps)
    functions = [OnnxExporter.export_function(f) for f in graph.functions]
    model.opset_import.extend(_update_import_domains(graph))
    model.functions.extend(functions)
    model.producer_name = graph.producer_name
    model.producer_version = graph.producer_version
    if graph.ir_version is not None:
        model.ir_version = graph.ir_version
    return model


def _update_import_domains(graph: gs.Graph) -> list:
    """gs's ``update_import_domains(graph)`` (the graph's opset imports, the domains its nodes and
    bodies use added, on the graph too): the same set, the bodies looked for only on the nodes
    that hold one (gs makes a generator for every node); the new domains added in sorted order
    (gs's set order followed the process's string hash seed: two new domains came out in either order)."""
    if graph.import_domains is None:
        graph.import_domains = [onnx.helper.make_opsetid("", graph.opset)]
    nodes = graph.nodes
    all_used_domains = {node.domain for node in nodes}
    for node in nodes:
        attrs = node.attrs
        if attrs and any(isinstance(v, gs.Graph) for v in attrs.values()):
            for subgraph in node.subgraphs(recursive=True):
                all_used_domains |= {n.domain for n in subgraph.nodes}
    all_used_domains.discard(None)
    current_domains = {opsetid.domain for opsetid in graph.import_domains}
    for used_domain in sorted(all_used_domains):
        if used_domain not in current_domains:
            graph.import_domains.append(onnx.helper.make_opsetid(used_domain, 1))  # gs's custom opset version
            current_domains.add(used_domain)
    return graph.import_domains


def _tensor_map(graph: gs.Graph) -> tuple[dict, bool]:
    """``graph.tensors()`` (gs's map of the named tensors: inputs, each node's inputs and outputs,
    outputs; a later tensor of a name takes the earlier one's place) in one loop, and whether
    two distinct tensors share a name. For those gs formats a warning; then its own map is made
    (the warning is its to give)."""
    tensors: dict = {}
    get = tensors.get
    clash = False
    for group in (graph.inputs, *(t for n in graph.nodes for t in (n.inputs, n.outputs)), graph.outputs):
        for t in group:
            name = t.name
            if name != "":
                have = get(name)
                if have is not None and have is not t:
                    clash = True
                tensors[name] = t
    if clash:
        return graph.tensors(), True
    return tensors, False


def _fill_graph(out: onnx.GraphProto, graph: gs.Graph, value_infos: "set[str] | None" = None,
                maps: "dict | None" = None) -> None:
    """``OnnxExporter.export_graph(graph, do_type_check=False)``, written into ``out`` (with
    ``value_infos`` and ``maps``: see :func:`export_onnx`)."""
    export_attributes = OnnxExporter.export_attributes
    for node in graph.nodes:
        n = out.node.add()
        n.op_type = node.op
        n.input.extend([t.name for t in node.inputs])
        n.output.extend([t.name for t in node.outputs])
        if node.name:
            n.name = node.name
        if node.domain is not None:
            n.domain = node.domain
        attrs = node.attrs
        if attrs:
            for key, val in attrs.items():
                if isinstance(val, gs.Graph):  # a body: written into its attribute, not copied in
                    a = n.attribute.add()
                    a.name = key
                    _fill_graph(a.g, val, value_infos, maps)
                    a.type = _GRAPH
                elif not _add_plain_attribute(n.attribute, key, val):
                    n.attribute.extend(export_attributes({key: val}))
    out.name = graph.name
    for t in graph.inputs:
        _add_value_info(out.input, t)
    for t in graph.outputs:
        _add_value_info(out.output, t)
    tensor_map, clash = _tensor_map(graph)
    if maps is not None and not clash:
        maps[id(graph)] = (graph, dict(tensor_map))
    for t in tensor_map.values():
        if isinstance(t, gs.Constant) and not isinstance(t._values, SparseValues):
            out.initializer.append(OnnxExporter.export_tensor_proto(t))
    for t in tensor_map.values():
        if isinstance(t, gs.Constant) and isinstance(t._values, SparseValues):
            out.sparse_initializer.append(OnnxExporter.export_sparse_tensor_proto(t))
    for t in graph.inputs + graph.outputs:
        tensor_map.pop(t.name, None)
    if value_infos is None or clash:
        for t in tensor_map.values():
            if isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None):
                _add_value_info(out.value_info, t)
    else:
        for name, t in tensor_map.items():
            if (isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None)
                    and (name in value_infos or t.__dict__.get(_ANNOTATIONS) is not None)):
                _add_value_info(out.value_info, t)
    if graph.doc_string:
        out.doc_string = graph.doc_string
