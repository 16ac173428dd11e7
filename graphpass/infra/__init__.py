"""Pass infrastructure: the Pass contract, the registry, the context and the pass manager."""

from graphpass.infra.context import Explanation, PassContext
from graphpass.infra.manager import PassManager, PassRecord
from graphpass.infra.pass_base import MatchResult, Pass, PassContractError, PassKind, PassResult
from graphpass.infra.registry import all_passes, get_pass, register, resolve

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
