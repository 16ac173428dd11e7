"""Pass infrastructure: the Pass contract, the registry, the context and the pass manager."""

from graphpass.passes.framework.context import Explanation, PassContext
from graphpass.passes.framework.manager import PassManager, PassRecord
from graphpass.passes.framework.pass_base import MatchResult, Pass, PassContractError, PassKind, PassResult
from graphpass.passes.framework.registry import all_passes, get_pass, register, resolve

__all__ = [
    "Explanation",
    "PassContext",
    "PassManager",
    "PassRecord",
    "MatchResult",
    "Pass",
    "PassContractError",
    "PassKind",
    "PassResult",
    "all_passes",
    "get_pass",
    "register",
    "resolve",
]
