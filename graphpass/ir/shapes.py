"""Shape and dtype information for passes: re-running onnx shape inference on the IR.

Shapes come from onnx's shape inference (with data propagation). Symbolic dims keep their names
(gs stores them as strings); unknown dims are None. ``refresh_shapes`` exports the graph once,
infers, and writes the inferred shapes back onto the gs tensors: linear in the graph size.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.ir import inference, serialize
from graphpass.ir.graph import subgraph_pairs

__all__ = ["refresh_shapes", "static_shape", "numel", "tensor_elem_type", "ONNX_TO_NP"]

ONNX_TO_NP = {
    onnx.TensorProto.FLOAT: np.dtype("float32"),
    onnx.TensorProto.DOUBLE: np.dtype("float64"),
    onnx.TensorProto.FLOAT16: np.dtype("float16"),
    onnx.TensorProto.INT8: np.dtype("int8"),
    onnx.TensorProto.INT16: np.dtype("int16"),
    onnx.TensorProto.INT32: np.dtype("int32"),
    onnx.TensorProto.INT64: np.dtype("int64"),
    onnx.TensorProto.UINT8: np.dtype("uint8"),
    onnx.TensorProto.UINT16: np.dtype("uint16"),
    onnx.TensorProto.UINT32: np.dtype("uint32"),
    onnx.TensorProto.UINT64: np.dtype("uint64"),
    onnx.TensorProto.BOOL: np.dtype("bool"),
}


def tensor_elem_type(tensor: gs.Tensor) -> int | None:
    """The ONNX element type (TensorProto.*) of a gs tensor, or None when unknown."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return None


def static_shape(tensor: gs.Tensor) -> list[int] | None:
    """The shape as a list of non-negative ints, or None if any dim is unknown or symbolic."""
    if isinstance(tensor, gs.Constant):
        return list(tensor.shape)
    shape = tensor.shape
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, (int, np.integer)) and d >= 0:
            out.append(int(d))
        else:
            return None
    return out


def numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dims(vi: onnx.ValueInfoProto):
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def _apply(graph_proto: onnx.GraphProto, graph: gs.Graph) -> int:
    infos = {}
    for vi in list(graph_proto.value_info) + list(graph_proto.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            infos[vi.name] = vi
    updated = 0
    for node in graph.nodes:
        for t in node.outputs:
            vi = infos.get(t.name)
            if vi is None or not isinstance(t, gs.Variable):
                continue
            dims = _dims(vi)
            dtype = ONNX_TO_NP.get(vi.type.tensor_type.elem_type)
            if dims is not None and dims != t.shape:
                t.shape = dims
                updated += 1
            if dtype is not None and t.dtype is None:
                t.dtype = dtype
    for proto_node, node in zip(graph_proto.node, graph.nodes):
        for gp, g in subgraph_pairs(proto_node, node):
            updated += _apply(gp, g)
    return updated


def refresh_shapes(graph: gs.Graph) -> int:
    """Re-run shape inference on ``graph`` and update its tensors; returns how many changed."""
    model = serialize.snapshot(graph)[0]  # weightless: inference needs dims and dtypes, not bytes
    inferred = inference.infer_shapes(model)
    if inferred is model:
        return 0
    return _apply(inferred.graph, graph)
