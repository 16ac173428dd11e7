"""Facts about standard ONNX ops that passes and checks both read (the ground floor: ONNX only).

``FLOAT_OPS`` and :func:`schema_data_slots` say which ops mixed precision converts to float16 and
which of their inputs and outputs carry the converted data; ``passes/precision/mixed_precision``
converts by them and ``graphpass.precision`` predicts by them which tensors an fp16 op would read.
"""

from __future__ import annotations

import onnx

__all__ = ["FLOAT_OPS", "schema_data_slots"]

#: Ops that compute on floats and run in fp16 when mixed precision converts them (anything else
#: is left as it is); a superset of the precision modes' white and black lists.
FLOAT_OPS = frozenset({
    "Abs", "Add", "AveragePool", "BatchNormalization", "Ceil", "Clip", "Concat", "Conv", "ConvTranspose",
    "CumSum", "DepthToSpace", "Div", "Elu", "Erf", "Exp", "Expand", "Flatten", "Floor", "GRU", "Gather",
    "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity",
    "InstanceNormalization", "LRN", "LSTM", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "MatMul",
    "Max", "MaxPool", "Mean", "Min", "Mish", "Mul", "Neg", "PRelu", "Pad", "Pow", "RNN", "Reciprocal",
    "ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round", "Selu", "Sigmoid", "Slice", "Softmax", "Softplus",
    "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "TopK", "Transpose", "Unsqueeze",
    "Where",
})


def schema_data_slots(op: str, n_inputs: int, n_outputs: int, opset: int) -> tuple[set[int], set[int]] | None:
    """Input and output positions that carry the op's float data type, from its ONNX schema.

    The data type is a type parameter (``T``) that an output carries, that some input binds and
    that admits float16; an input typed by another parameter (Resize's ``roi``: T2, its
    ``scales``: tensor(float), LayerNormalization's Mean: U) or a fixed type keeps its dtype.
    None when the op has no schema at this opset.
    """
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def formal(params, i):
        if i < len(params):
            return params[i].type_str
        if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return params[-1].type_str
        return None

    in_types = [formal(schema.inputs, i) for i in range(n_inputs)]
    out_types = [formal(schema.outputs, k) for k in range(n_outputs)]
    data = {t for t in out_types if t in allowed and {"tensor(float16)", "tensor(float)"} <= allowed[t] and t in in_types}
    return ({i for i, t in enumerate(in_types) if t in data}, {k for k, t in enumerate(out_types) if t in data})
