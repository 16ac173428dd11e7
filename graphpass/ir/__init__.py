"""The graphpass IR layer: onnx-graphsurgeon graphs plus what gs lacks (ARCHITECTURE.md, "Layers").

:mod:`~graphpass.ir.model` (the :class:`Model` value), :mod:`~graphpass.ir.serialize` (proto
<-> IR), :mod:`~graphpass.ir.external` (external data), :mod:`~graphpass.ir.validate`,
:mod:`~graphpass.ir.inference` (shape inference), :mod:`~graphpass.ir.files` (file reading and
the atomic writer); :mod:`~graphpass.ir.graph` holds the graph helpers. ``load`` here returns
the main gs.Graph (its Model via :func:`model_of`); ``graphpass.load`` returns the Model.
"""

from graphpass.ir import lean  # noqa: F401 - first: gs builds its lists lean from here on
from graphpass.ir import annotations
from graphpass.ir.graph import (
    NameGen,
    captured_tensors,
    constant_array,
    count_nodes,
    fingerprint,
    has_subgraph,
    is_graph_output,
    iter_graphs,
    op_histogram,
    producer,
    remove_nodes,
    replace_uses,
    replace_uses_many,
    subgraphs_of,
    toposort,
)
from graphpass.ir.files import check_output_path
from graphpass.ir.inference import infer_shapes
from graphpass.ir.model import Model, as_model, model_info, model_of, opset_of
from graphpass.ir.serialize import from_proto, load, load_proto, save, save_proto, to_proto

__all__ = [
    "annotations",
    "Model",
    "as_model",
    "model_of",
    "NameGen",
    "captured_tensors",
    "constant_array",
    "count_nodes",
    "fingerprint",
    "has_subgraph",
    "is_graph_output",
    "iter_graphs",
    "op_histogram",
    "producer",
    "remove_nodes",
    "replace_uses",
    "replace_uses_many",
    "subgraphs_of",
    "toposort",
    "check_output_path",
    "from_proto",
    "infer_shapes",
    "load",
    "load_proto",
    "model_info",
    "opset_of",
    "save",
    "save_proto",
    "to_proto",
]
