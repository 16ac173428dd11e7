"""Pass infrastructure: the Pass contract, the registry, the context, the pass manager and its
instruments."""

from graphpass.passes.framework.context import Explanation, PassContext
from graphpass.passes.framework.instruments import (
    ApplicationLimit,
    ContractCheck,
    CostVeto,
    DumpIR,
    PassInstrument,
    PassTiming,
    Progress,
    VerifyEach,
    standard_instruments,
)
from graphpass.passes.framework.manager import ManagerResult, PassManager, PassRecord
from graphpass.passes.framework.pass_base import (
    Pass,
    PassContractError,
    PassKind,
    PassPostconditionError,
    PassPreconditionError,
    PassResult,
)
from graphpass.passes.framework.registry import all_passes, get_pass, register, resolve
from graphpass.passes.framework.rewrite import MatchResult

__all__ = [
    "Explanation",
    "PassContext",
    "PassManager",
    "ManagerResult",
    "PassRecord",
    "PassInstrument",
    "CostVeto",
    "VerifyEach",
    "DumpIR",
    "PassTiming",
    "Progress",
    "ApplicationLimit",
    "ContractCheck",
    "standard_instruments",
    "MatchResult",
    "Pass",
    "PassContractError",
    "PassPreconditionError",
    "PassPostconditionError",
    "PassKind",
    "PassResult",
    "all_passes",
    "get_pass",
    "register",
    "resolve",
]
