"""Old import path of the IR's model layer, kept for one release: re-exports only.

The code now lives in modules split by concern:

* :mod:`graphpass.ir.model` - :class:`Model`, :func:`as_model`, model facts (``opset_of``,
  ``budget``, ``model_info``);
* :mod:`graphpass.ir.serialize` - loading, ``from_proto`` / ``to_proto`` / ``save`` /
  ``snapshot`` / ``restore``;
* :mod:`graphpass.ir.external` - external data: checking, lazy values, writing;
* :mod:`graphpass.ir.validate` - validation and the ONNX checker on written models;
* :mod:`graphpass.ir.inference` - shape inference on load;
* :mod:`graphpass.ir.files` - regular-file reading, ``.npz`` inputs, output paths, the atomic writer.

Patch the defining module, not this one, to change a behaviour (e.g.
``graphpass.ir.external.EXTERNAL_DATA_THRESHOLD``).
"""

from __future__ import annotations

from graphpass.ir.external import (  # noqa: F401
    EXTERNAL_DATA_THRESHOLD,
    _GRAPH_FIELD,
    _INITIALIZER_FIELD,
    _MAX_LOCATION,
    ExternalValues,
    _as_proto,
    _external_info,
    _external_tensors,
    _header,
    _is_on_disk,
    _len_field,
    _load_external_data,
    _nbytes,
    _payload_bytes,
    _read_on_disk,
    _varint,
    _write_external,
    _write_streaming,
    iter_external_bytes,
)
from graphpass.ir.files import check_output_path, read_npz  # noqa: F401
from graphpass.ir.files import read_regular_file as _read_regular_file  # noqa: F401
from graphpass.ir.files import read_regular_file_check as _read_regular_file_check  # noqa: F401
from graphpass.ir.inference import (  # noqa: F401
    _DATA_PROP_MAX_ELEMS,
    _DATA_PROP_MAX_TOTAL,
    _apply_input_shapes,
    _copy_value_info,
    _data_prop_safe,
    _dims_text,
    _drop_inferable_value_info,
    _has_unknown_shapes,
    _light_copy,
    _merge_value_info,
    infer_shapes,
)
from graphpass.ir.model import Model, as_model, budget, model_info, opset_of  # noqa: F401
from graphpass.ir.serialize import (  # noqa: F401
    _RAW_ATTR_TYPES,
    _RAW_ATTRS_KEY,
    _TYPE_KEY,
    MIN_OPSET,
    ModelSource,
    _densify_sparse,
    _export,
    _export_weightless,
    _finish,
    _load_proto,
    _merge_opsets,
    _node_pairs,
    _remember_raw_attrs,
    _remember_types,
    _restore_raw_attrs,
    _restore_types,
    _types_hidden,
    _upgrade_old_opset,
    from_proto,
    gc_batched,
    gc_frozen,
    gc_paused,
    load,
    load_proto,
    read_as_stored,
    restore,
    save,
    save_proto,
    snapshot,
    to_proto,
)
from graphpass.ir.validate import (  # noqa: F401
    _TYPED_FIELDS,
    _VALUE_ATTRS,
    InvalidOutputError,
    _check_content,
    _check_graph,
    _check_names,
    _check_tensor,
    _checker_problem,
    _expected_bytes,
    _graphs_with_paths,
    _has_typed_data,
    _itemsize,
    _numel,
    _validate_at,
    check_written,
    validate,
)
from graphpass.ir.validate import parse as _parse  # noqa: F401

__all__ = [
    "MIN_OPSET",
    "Model",
    "ModelSource",
    "as_model",
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
