"""graphpass: graph-level compiler passes for ONNX models headed for Huawei Ascend NPUs.

    import graphpass as gp
    model = gp.load("model.onnx", input_shapes={"x": [1, 3, 640, 640]})   # a graphpass.Model
    result = gp.optimize(model)          # optimized in place; result.model is model
    model.save("model.opt.onnx")         # or gp.save(model, ...); portable ONNX by default
    print(result.report.to_markdown())
    print(gp.estimate(model, target="ascend910b2").to_table())

Every entry point (``load``, ``optimize``, ``save``, ``to_proto``, ``estimate``,
``graphpass.verify.verify_models``, ``graphpass.diff.diff_models``,
``graphpass.precision.analyze``, ``graphpass.bisect.bisect``) takes a model as a path, bytes,
an ``onnx.ModelProto`` or a :class:`Model`, coerced by :func:`as_model`; the ones that only
read a model never change it.
"""

import gc as _gc

# Importing graphpass (onnx, numpy, the passes, the cost model) makes ~65k objects that all stay
# alive: with the collector on, ~90 young collections walked them to find nothing (~15 ms of a
# run's start). Paused for the import; what it made then goes to the oldest generation without a
# sweep (freeze then unfreeze, as serialize.gc_paused does after a load), unless anything is
# frozen (a caller's own freeze: unfreeze would release it).
_collecting = _gc.isenabled()
_gc.disable()
try:
    from graphpass import _compat

    _compat.install()  # old import paths (graphpass.infra, graphpass.verify, ...) keep working

    from graphpass.api import OptimizeResult, estimate, load, optimize, save, to_proto
    from graphpass.cost_model.target import Target
    from graphpass.errors import (
        BadModelError,
        GraphpassError,
        PassError,
        UnsupportedError,
        UsageError,
        VerificationError,
    )
    from graphpass.passes.framework import (Pass, PassContext, PassKind, PassManager, PassResult, all_passes, get_pass,
                                            register)
    from graphpass.ir.model import Model, as_model
finally:
    if _gc.get_freeze_count() == 0:
        _gc.freeze()
        _gc.unfreeze()
    if _collecting:
        _gc.enable()
del _gc, _collecting

__version__ = "0.1.0"

__all__ = [
    "Model",
    "OptimizeResult",
    "as_model",
    "estimate",
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
    "Target",
    "__version__",
]


def __getattr__(name: str):
    """``graphpass.infra``, ``graphpass.verify``, ... as attributes (old paths, one release)."""
    if f"graphpass.{name}" in _compat.MOVED:
        import importlib

        return importlib.import_module(f"graphpass.{name}")
    raise AttributeError(f"module 'graphpass' has no attribute '{name}'")
