"""graphpass: graph-level compiler passes for ONNX models headed for Huawei Ascend NPUs.

    import graphpass as gp
    graph = gp.load("model.onnx", input_shapes={"x": [1, 3, 640, 640]})
    result = gp.optimize(graph)
    gp.save(result.graph, "model.opt.onnx")
    print(result.report.to_markdown())
"""

from graphpass.api import OptimizeResult, optimize
from graphpass.errors import (
    BadModelError,
    GraphpassError,
    PassError,
    UnsupportedError,
    UsageError,
    VerificationError,
)
from graphpass.passes.framework import Pass, PassContext, PassKind, PassManager, PassResult, all_passes, get_pass, register
from graphpass.ir import load, save, to_proto

__version__ = "0.1.0"

__all__ = [
    "OptimizeResult",
    "optimize",
    "BadModelError",
    "GraphpassError",
    "PassError",
    "UnsupportedError",
    "UsageError",
    "VerificationError",
    "Pass",
    "PassContext",
    "PassKind",
    "PassManager",
    "PassResult",
    "all_passes",
    "get_pass",
    "register",
    "load",
    "save",
    "to_proto",
    "__version__",
]
