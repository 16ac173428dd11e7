"""A user's own Ascend knowledge, written outside graphpass with its rewrite API and loaded with
``--plugin`` (the worked example of issue 25):

    graphpass optimize model.onnx -o out.onnx --plugin examples/ascend_knowledge_hardswish.py
    graphpass evaluate models/ --plugin examples/ascend_knowledge_hardswish.py   # where it would fire

Keras/TF and Paddle exports (and hand-written MobileNetV3s) spell h-swish as
``Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))``. On Ascend that is two kernels and a tensor
written to and read back from global memory; CANN has one HardSwish kernel (the cost model's op
table, cost_model/data/op_info.toml, has both), and HardSwish after a Conv UB-fuses as the
``fuse_conv_activation`` pass then forms ``FusedConvHardSwish``. So this knowledge runs before
the fusions.

Exact: the ONNX spec defines HardSwish(x) as ``x * max(0, min(1, alpha * x + beta))`` with
alpha = 1/6 and beta = 0.5, the very arithmetic of the pair (checked bitwise in onnxruntime on
all 65,536 float16 values and on NaN, +-inf, -0.0, subnormals and the float32 extremes:
tests/cli/test_plugins.py). The rule refuses every near miss: another alpha or beta (as float32,
HardSigmoid's attribute type), a Mul of HardSigmoid(x) by a tensor other than x, a HardSigmoid
read elsewhere (the rewrite API's default ``exclusive`` matching), a dtype other than float16 and
float32 (onnxruntime has no double HardSigmoid), and an opset below 14 (HardSwish is new in 14).
"""

import numpy as np

from graphpass.passes.framework.pass_base import EXACT, PassKind
from graphpass.passes.framework.rewrite import MatchResult, Rule, rule_pass

_SIXTH, _HALF = np.float32(1 / 6), np.float32(0.5)


class HardSigmoidMulToHardSwish(Rule):
    """Mul(x, HardSigmoid(x)) or Mul(HardSigmoid(x), x) with HardSwish's constants -> HardSwish(x)."""

    name = "hardsigmoid_mul"
    pattern = ("HardSigmoid", "Mul")
    follow = (None,)  # the HardSigmoid may be either factor of the Mul

    def check(self, m, ctx) -> MatchResult:
        hs, mul = m.nodes
        x = hs.inputs[0]
        others = [t for t in mul.inputs if t is not hs.outputs[0]]
        if len(others) != 1 or others[0] is not x:
            return MatchResult.fail("the Mul's other factor is not the HardSigmoid's input")
        alpha = np.float32(hs.attrs.get("alpha", 0.2))
        beta = np.float32(hs.attrs.get("beta", 0.5))
        if alpha != _SIXTH or beta != _HALF:
            return MatchResult.fail(f"HardSigmoid(alpha={alpha}, beta={beta}) is not HardSwish's (1/6, 0.5)")
        if x.dtype not in (np.float32, np.float16):
            return MatchResult.fail(f"dtype {x.dtype}: only float32 and float16 are rewritten")
        opset = m.graph.opset if getattr(m.graph, "opset", None) else 0
        if opset < 14:
            return MatchResult.fail(f"opset {opset}: HardSwish needs opset 14")
        return MatchResult.success()

    def rewrite(self, m, ctx):
        return m.op("HardSwish", [m.nodes[0].inputs[0]])


HardSwishKnowledge = rule_pass(
    "ascend_hardswish",
    [HardSigmoidMulToHardSwish()],
    summary="Mul(x, HardSigmoid(x, 1/6, 0.5)) => HardSwish(x), one AI Core kernel "
            "(an example Ascend knowledge: examples/ascend_knowledge_hardswish.py)",
    kind=PassKind.FUSION,
    promise=EXACT,
    runs_before=("fuse_conv_activation",),
    register=True,
    module=__name__,
)
