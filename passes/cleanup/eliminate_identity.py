"""Identity elimination.

    x -> Identity -> y -> consumers              =>  x -> consumers
    producer -> x -> Identity -> y (graph output) =>  producer -> y         (x renamed away)
    x -> Dropout(inference, mask unused) -> y    =>  as Identity
    x * 1, 1 * x, x / 1                          =>  as Identity (neutral elements)
    x + (-0.0), (-0.0) + x, x - (+0.0)           =>  as Identity (floats)
    x + 0, 0 + x, x - 0                          =>  as Identity (integers)

Kept when ``y`` is a graph output and ``x`` cannot take its name: ``x`` is a graph input, another
graph output, a constant, or comes from an enclosing scope. Also kept when ``x`` is a constant that
a reader of ``y`` takes computed but not as an initializer: a Range bound of shape [1] (onnxruntime
refuses it at load), an LSTM/GRU weight W or R (onnxruntime prepacks it and rounds otherwise).
A Dropout is an identity only in
inference: no ``training_mode`` input, or a constant false one, and no consumer of its mask.
A neutral element goes only when the constant does not broadcast ``x`` to a bigger shape and the
result has ``x``'s dtype (both known). For floats the sign of a zero decides: ``-0.0 + (+0.0)`` is
``+0.0``, so ``x + 0`` and ``x - (-0.0)`` are not identities (kept), while ``x + (-0.0)`` and
``x - (+0.0)`` are, for every x (-0.0, NaN, inf included); ``x * 1`` and ``x / 1`` are (a NaN stays
a NaN). For integers all four are. So every removal is bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.framework import PassKind, register
from graphpass.passes.framework.pass_base import EXACT, MERGE_EQUAL_CONSTANTS, PassResult
from graphpass.ir.graph import peek_values, read_values
from graphpass.passes.cleanup._common import prepacked_operand
from graphpass.passes.cleanup._fold_bounds import constant_source, judges_operand, valid_shape_operand
from graphpass.passes.framework.rewrite import Match, MatchResult, Rule, RuleCounts, RulePass, Scope

__all__ = ["EliminateIdentity"]


#: op -> (neutral value, commutes, for floats: the sign bit the zero must have (None: any))
_NEUTRAL = {"Mul": (1.0, True, None), "Div": (1.0, False, None), "Add": (0.0, True, True), "Sub": (0.0, False, False),
            "And": (True, True, None), "Or": (False, True, None)}


def _is_neutral(values: np.ndarray, unit: float, negative_zero: bool | None) -> bool:
    if values.size and values.item(0) != unit:  # (the first value tells most constants apart: a scale, an eps)
        return False
    if not np.all(values == unit):
        return False
    if negative_zero is None or not np.issubdtype(values.dtype, np.floating):
        return True
    return bool(np.all(np.signbit(values) == negative_zero))


def _neutral_operand(node: gs.Node) -> gs.Tensor | None:
    """For ``x op c`` where c is the op's neutral element and changes nothing, ``x``."""
    unit, commutes, negative_zero = _NEUTRAL[node.op]
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    if not (isinstance(node.inputs[1], gs.Constant) or (commutes and isinstance(node.inputs[0], gs.Constant))):
        return None  # no constant operand (a residual Add: ~1,300 per call on a 10k CNN), told before the pairs
    y = node.outputs[0]
    pairs = [(node.inputs[0], node.inputs[1])] + ([(node.inputs[1], node.inputs[0])] if commutes else [])
    for x, c in pairs:
        if not isinstance(c, gs.Constant) or isinstance(x, gs.Constant):
            continue
        if x.dtype is None or y.dtype is None:
            continue
        try:
            x_dtype, y_dtype = np.dtype(x.dtype), np.dtype(y.dtype)
        except TypeError:  # a type numpy lacks (bfloat16 as graphsurgeon holds it) or unknown
            continue
        cshape = tuple(c.shape)  # the header first: a weight is not decoded to be refused by its size
        if math.prod(cshape) > 4096 or x.shape is None or len(cshape) > len(x.shape):
            continue
        values = np.asarray(read_values(c))  # only compared: a weight's stored bytes, not a copy
        if not _is_neutral(values, unit, negative_zero):
            continue
        # the constant must not broadcast x: all its dims 1 (x's own dims may then be anything,
        # symbolic or 0), or x static and the output's shape x's
        ones = all(d == 1 for d in values.shape)
        same = (y.shape is not None and list(x.shape) == list(y.shape)
                and all(isinstance(d, (int, np.integer)) for d in x.shape))
        if not (ones or same):
            continue
        if x_dtype != y_dtype or values.dtype != x_dtype:
            continue
        return x
    return None


def _dropout_is_identity(node: gs.Node, graph_outputs: set[int]) -> bool:
    if len(node.inputs) >= 3 and node.inputs[2].name:
        mode = node.inputs[2]
        if not isinstance(mode, gs.Constant) or bool(np.asarray(mode.values)):
            return False
    if node.attrs.get("is_test", 1) == 0:  # opset < 7 training flag
        return False
    for mask in node.outputs[1:]:
        if mask.name and (len(mask.outputs) or id(mask) in graph_outputs):
            return False
    return True


def _constant_accepted(x: gs.Tensor, y: gs.Tensor) -> MatchResult:
    """Readers of ``y`` that take ``x`` when it is computed but refuse it as an initializer (a
    Range bound of shape [1]) or compute otherwise with it (LSTM's R, prepacked) keep the Identity."""
    x = constant_source(x)  # a Constant node's value too: onnxruntime makes it an initializer
    if x is None:
        return MatchResult.success()
    for c in y.outputs:
        for k, t in enumerate(c.inputs):
            if t is y and prepacked_operand(c, k):
                return MatchResult.fail(f"{c.op} '{c.name}' computes with other rounding when its input {k} is "
                                        f"a constant (onnxruntime prepacks it)")
            if t is y and judges_operand(c.op, k) and not valid_shape_operand(c.op, k, np.asarray(peek_values(x))):
                return MatchResult.fail(f"{c.op} '{c.name}' would read the constant '{x.name}' of shape "
                                        f"{list(x.shape)} as input {k}, which it refuses")
    return MatchResult.success()


class _Identity(Rule):
    """Cases 1 and 2 (the engine rewires a graph output to x's producer, or refuses: kept_at_output)."""

    pattern = ("Identity",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        return m if m is not None and anchor.inputs and anchor.outputs else None

    def check(self, m: Match, ctx) -> MatchResult:
        return _constant_accepted(m.anchor.inputs[0], m.anchor.outputs[0])

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("identity")
        return m.anchor.inputs[0]


class _Dropout(_Identity):
    """Case 3: Dropout in inference mode with an unused mask."""

    pattern = ("Dropout",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        return m if m is not None and _dropout_is_identity(anchor, scope.outputs) else None

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("dropout")
        return m.anchor.inputs[0]


class _Neutral(Rule):
    """Case 4: arithmetic with the op's neutral element."""

    pattern = (tuple(_NEUTRAL),)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        # the operand first: most anchors have none, and no Match is made for them
        x = _neutral_operand(anchor) if anchor.op in _NEUTRAL else None
        if x is None:
            return None
        m = super().match(anchor, scope)
        if m is None:
            return None
        m.x = x
        return m

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("neutral")
        return m.x


@register
class EliminateIdentity(RulePass):
    """Removes Identity nodes, inference-mode Dropout and neutral-element arithmetic (x * 1, x + 0, ...).

    Cases:
      1. ``y`` is an internal tensor: its consumers read ``x``;
      2. ``y`` is a graph output and ``x`` is a local intermediate: ``x``'s producer writes ``y``;
      3. Dropout in inference mode with an unused mask: treated as case 1/2;
      4. Mul/Div by a constant 1, Add of -0.0, Sub of +0.0 (of any zero for integers), And with
         true, Or with false, the constant not broadcasting x (every dim of it 1, or x static with
         the output's shape): as case 1/2.
    """

    name = "eliminate_identity"
    summary = ("Remove Identity nodes, inference-mode Dropout, and x*1, x/1, x+(-0.0), x-(+0.0) (x+0, x-0 for ints), "
               "x and true, x or false.")
    kind = PassKind.CLEANUP
    promise = EXACT
    preserves_order = True

    rules = (_Identity(), _Dropout(), _Neutral())

    def survives_edits(self, result: PassResult) -> frozenset[str]:
        """Nothing matched: no Identity, no inference Dropout, no neutral operand. A merge of equal
        constants adds no node and keeps every constant's values, shape and dtype (what case 4
        reads) and every Variable's readers (Dropout's mask): nothing matches after it either."""
        rules = result.stats.get("rules")
        if result.modified or not isinstance(rules, RuleCounts) or rules.total("matched"):
            return frozenset()
        return frozenset({MERGE_EQUAL_CONSTANTS})

    def summarize(self, counts: RuleCounts) -> dict:
        # the only refusal: a graph output whose source cannot take its name
        return {**{k: counts.total(k) for k in ("identity", "dropout", "neutral")},
                "kept_at_output": counts.total("refused"), "rules": counts}
