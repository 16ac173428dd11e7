"""A small graph builder for the example architectures (onnx.helper with seeded weights).

Weights are seeded random (He-initialized convolutions, BatchNorm with non-trivial statistics),
so a wrong channel permutation or a wrong fold changes the outputs: unlike the model-zoo
"light" models, whose weights are all 0.02.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, opset: int = 13, seed: int = 0):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, value, prefix: str = "const", dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(arr, n))
        return n

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None, domain: str | None = None,
           **attrs) -> str | list[str]:
        node_name = name or self.name(op_type.lower())
        outs = [f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, domain=domain, **attrs))
        return outs if n_out > 1 else outs[0]

    # -- layers ----------------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0, groups: int = 1,
             bias: bool = False, name: str | None = None, dilation: int = 1) -> str:
        fan_in = cin // groups * k * k
        w = (self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        inputs = [x, self.const(w, f"{name or 'conv'}_w")]
        if bias:
            inputs.append(self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name or 'conv'}_b"))
        return self.op("Conv", inputs, name=name, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=groups, dilations=[dilation, dilation])

    def bn(self, x: str, c: int, name: str | None = None) -> str:
        r = self.rng
        p = name or "bn"
        return self.op(
            "BatchNormalization",
            [x,
             self.const(r.uniform(0.5, 1.5, c).astype(np.float32), f"{p}_scale"),
             self.const((r.standard_normal(c) * 0.1).astype(np.float32), f"{p}_bias"),
             self.const((r.standard_normal(c) * 0.1).astype(np.float32), f"{p}_mean"),
             self.const(r.uniform(0.5, 1.5, c).astype(np.float32), f"{p}_var")],
            name=name, epsilon=1e-5,
        )

    def conv_bn(self, x, cin, cout, k, stride=1, pad=0, groups=1, relu=True, name="cbr") -> str:
        y = self.bn(self.conv(x, cin, cout, k, stride, pad, groups, name=f"{name}/conv"), cout, name=f"{name}/bn")
        return self.op("Relu", [y], name=f"{name}/relu") if relu else y

    def gemm(self, x: str, cin: int, cout: int, name: str = "fc") -> str:
        w = (self.rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.01).astype(np.float32)
        return self.op("Gemm", [x, self.const(w, f"{name}_w"), self.const(b, f"{name}_b")], name=name, transB=1)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        extra = [helper.make_opsetid(d, v) for d, v in getattr(self, "opset_extra", {}).items()]
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)] + extra,
                              producer_name="graphpass-examples", ir_version=8)
        if not getattr(self, "opset_extra", None):  # custom-domain ops have no schema to check against
            onnx.checker.check_model(m, full_check=True)
        return m


def float_input(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
