"""The exceptions graphpass raises.

The CLI turns ``BadModelError`` and ``UsageError`` into one line on stderr and exit code 2,
``VerificationError`` into exit code 1. Anything else is a bug in graphpass.
"""

from __future__ import annotations

__all__ = [
    "GraphpassError",
    "BadModelError",
    "UsageError",
    "ResourceLimitError",
    "UnsupportedError",
    "VerificationError",
    "PassError",
    "write_error",
]


class GraphpassError(Exception):
    """Base class of every error graphpass raises on purpose.

    Library code states the problem in API terms: an error whose fix is a keyword argument names
    it (``input_shapes``, ``max_memory``, ``feeds``) and says so in ``option``; the CLI names
    the flag that sets it instead (``graphpass.cli.error_text``). No library message names a flag.
    """

    exit_code = 2
    #: the API argument this error names as the problem or the fix (None: none)
    option: str | None = None

    def __init__(self, *args, option: str | None = None):
        super().__init__(*args)
        if option is not None:
            self.option = option


class BadModelError(GraphpassError):
    """The input model is unreadable, malformed or uses something graphpass cannot handle."""


class ResourceLimitError(BadModelError):
    """The input would make graphpass hold more memory than its limit allows (``max_memory``,
    a tensor over 2^31 in one dimension, a file that is not a regular file of a sane size)."""


class UsageError(GraphpassError):
    """The caller asked for something that does not exist or does not fit (unknown pass, bad shape)."""


class UnsupportedError(GraphpassError):
    """A pass needs the semantics of something graphpass does not know."""


class VerificationError(GraphpassError):
    """The optimized model does not compute the same thing as the original."""

    exit_code = 1


class PassError(GraphpassError):
    """A pass raised; names the pass and the passes that ran before it."""

    exit_code = 3

    def __init__(self, pass_name: str, history: list[str], cause: BaseException):
        self.pass_name = pass_name
        self.history = list(history)
        before = ", ".join(history[-8:]) if history else "none"
        if len(history) > 8:
            before = f"... {before}"
        super().__init__(
            f"pass '{pass_name}' failed: {type(cause).__name__}: {cause} "
            f"(passes run before it: {before})"
        )


def write_error(path, e: OSError) -> "UsageError":
    """An OSError while writing ``path`` as the one-line exit-2 error the CLI prints."""
    return UsageError(f"cannot write '{path}': {e.strerror or type(e).__name__}")
