"""Helpers for testing passes: build tiny models, run them in onnxruntime, compare.

Used by graphpass's own tests and available to anyone writing a pass:

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})
    graph = graphpass.load(model)
    result = my_pass(graph)
    assert_equivalent(model, graphpass.to_proto(graph))
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from graphpass.check import verify as _verify

__all__ = ["make_model", "ort_run", "assert_equivalent", "ops", "check_full"]

IR_VERSION = 10


def _vi(name: str, spec) -> onnx.ValueInfoProto:
    if isinstance(spec, tuple):
        elem, shape = spec
    else:
        elem, shape = TensorProto.FLOAT, spec
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, object],
    outputs: Mapping[str, object],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
    functions: Sequence[onnx.FunctionProto] = (),
    extra_opsets: Mapping[str, int] | None = None,
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    """A checked model; a shape spec is a list (float32) or ``(TensorProto.X, shape)``."""
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(
        list(nodes), "test", [_vi(k, v) for k, v in inputs.items()], [_vi(k, v) for k, v in outputs.items()],
        initializer=inits, value_info=list(value_info),
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    model.ir_version = IR_VERSION
    return model


def ort_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``model`` in onnxruntime with ORT_DISABLE_ALL."""
    return _verify.run(_verify.session(model), feeds)


def check_full(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)


def assert_equivalent(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    seed: int = 0,
    exact: bool = False,
) -> dict[str, np.ndarray]:
    """Both models give the same outputs; ``after`` passes the full checker.

    Judged by :func:`graphpass.verify.compare_arrays`, the rule of ``graphpass verify``: ints,
    bools and strings exactly, floats elementwise ``|a-b| <= atol + rtol*|b|`` with NaN/inf
    positions and signs exact, dtypes and shapes equal; ``exact``: bitwise, the sign of zero too.
    """
    check_full(after)
    sb = _verify.session(before)
    if feeds is None:
        feeds = _verify.random_inputs(sb, seed=seed)
    ref = _verify.run(sb, feeds)
    got = _verify.run(_verify.session(after), feeds)
    assert set(ref) == set(got), f"outputs differ: {sorted(ref)} vs {sorted(got)}"
    bad = [c for c in _verify.compare(ref, got, 0.0 if exact else rtol, 0.0 if exact else atol) if not c.ok]
    assert not bad, "; ".join(_verify.describe(c) for c in bad)
    return ref


def ops(model_or_graph) -> list[str]:
    """Op types of the main graph, in order."""
    if isinstance(model_or_graph, onnx.ModelProto):
        return [n.op_type for n in model_or_graph.graph.node]
    return [n.op for n in model_or_graph.nodes]
