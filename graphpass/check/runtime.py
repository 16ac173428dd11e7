"""One place where graphpass creates onnxruntime sessions, so their logging is decided once.

onnxruntime prints its own log lines (``[E:onnxruntime:...]``, ``[W:onnxruntime:...]``) on
stderr, for example when it cannot load a model, on top of the exception graphpass turns into
one line. Every session graphpass creates goes through :func:`session`, with the session's log
severity (and the process-wide default logger's) at 4 (fatal only) unless the CLI ran with
``-v`` (:func:`set_verbosity`).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["session", "set_verbosity", "log_severity"]

#: onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
_severity = 4


def set_verbosity(verbose: int) -> None:
    """0: onnxruntime quiet (fatal only); 1 (``-v``): its warnings and errors; 2+ (``-vv``): info."""
    global _severity
    _severity = 4 if verbose <= 0 else 2 if verbose == 1 else 1
    # session() sets the default logger's severity before each session: onnxruntime is imported
    # (~25 ms) only by a run that builds one
    ort = sys.modules.get("onnxruntime")
    if ort is not None:
        ort.set_default_logger_severity(_severity)


def log_severity() -> int:
    return _severity


def session(model: Any, optimize: bool = False, providers: list[str] | None = None, **options: Any):
    """An onnxruntime InferenceSession of ``model`` (serialized bytes or a path).

    Args:
        model: the serialized model or a path.
        optimize: keep onnxruntime's own graph optimizations (default: ORT_DISABLE_ALL, so the
            runtime does not redo graphpass's work).
        providers: execution providers (default: CPU).
        options: further ``SessionOptions`` attributes (``intra_op_num_threads=1``, ...).
    """
    import onnxruntime as ort

    ort.set_default_logger_severity(_severity)
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = _severity
    for k, v in options.items():
        setattr(opts, k, v)
    return ort.InferenceSession(model, opts, providers=providers or ["CPUExecutionProvider"])
