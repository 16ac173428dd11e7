"""The check layer: run models in onnxruntime and judge their outputs (verify, fp16 emulation,
precision analysis). Sits above the IR and the cost model, below the passes."""

#: The conversion :func:`graphpass.check.precision.analyze` checks its findings on by default:
#: ``convert(model, mode, keep_fp32) -> ModelProto`` (see ``precision.register_converter``).
#: ``graphpass.api``, above the passes, sets the mixed_precision pass's here without importing
#: the analysis (``graphpass optimize`` never runs it: the import is left to its users).
converter = None
