"""simplify_shapes' rewrites, each reading a ``ShapeAnalysis`` (cases of ``SimplifyShapes``).

    Fold            an op whose value is all known                =>  constant (case 1)
    ReshapeTarget   Reshape(x, t), t partly known                 =>  Reshape(x, constant with 0/-1) (case 2)
    ReshapeNoop     Reshape(x, t), t equal to x's own shape       =>  x (case 3)
    ExpandNoop      Expand(x, t), broadcast(shape(x), t) == shape(x)  =>  x (case 4)
    TileNoop        Tile(x, r), r all ones                        =>  x (case 5)
    SliceNoop       Slice(x, ...) taking every element            =>  x (case 6)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.passes.cleanup._common import is_onnx_op
from graphpass.passes.cleanup._fold_bounds import valid_shape_operand
from graphpass.passes.cleanup._shape_analysis import ShapeAnalysis
from graphpass.passes.cleanup._shape_eval import FOLDABLE
from graphpass.passes.cleanup._shape_values import Dim, is_known, slice_indices
from graphpass.passes.framework.rewrite import Match, MatchResult, Rule, Scope

__all__ = ["ExpandNoop", "Fold", "ReshapeNoop", "ReshapeTarget", "SliceNoop", "TileNoop"]

_INT64_MAX = int(np.iinfo(np.int64).max)


class _AnalysisRule(Rule):
    """A rule reading the pass's one shape analysis (the walk's facts, shared by every rule)."""

    def __init__(self, analysis: ShapeAnalysis):
        self.analysis = analysis


class _NoopRule(_AnalysisRule):
    """A rule whose match proves the node changes nothing: its input replaces its output."""

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("noop_removed")
        return m.anchor.inputs[0]


class Fold(_AnalysisRule):
    """Case 1: a value whose every element is known becomes a constant, where it leaves the
    evaluated arithmetic (a reader that is not itself folded, or a graph output)."""

    pattern = (FOLDABLE,)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        if not is_onnx_op(anchor) or len(anchor.outputs) != 1:
            return None
        out = anchor.outputs[0]
        v = self.analysis.value(out)
        if v is None or not v.known:
            return None
        if not scope.is_output(out) and all(self._folded(r) for r in out.outputs):
            return None  # its readers fold: the constant goes there
        m = scope.match([anchor])
        m.vec = v
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        value = m.vec.array()
        for reader in m.anchor.outputs[0].outputs:
            for i, t in enumerate(reader.inputs):
                if t is not m.anchor.outputs[0]:
                    continue
                # (Range's bounds: a [1] tensor runs when computed, not as an initializer)
                if not valid_shape_operand(reader.op, i, value) or reader.op == "Range" and value.ndim:
                    return MatchResult.fail(f"{reader.op} cannot take this value as a constant input {i} "
                                            "(onnxruntime refuses it at load)")
        return MatchResult.success()

    def _folded(self, reader: gs.Node) -> bool:
        if reader.op not in FOLDABLE or not is_onnx_op(reader) or len(reader.outputs) != 1:
            return False
        v = self.analysis.value(reader.outputs[0])
        return v is not None and v.known

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("folded")
        out = m.anchor.outputs[0]
        value = gs.Constant(m.names(f"{out.name}_folded"), m.vec.array())
        if m.writes_graph_output():  # a Constant node writes the output under its own name
            return m.op("Constant", [], {"value": value}, dtype=m.vec.dtype, shape=list(value.shape))
        return value


def _reshape_parts(node: gs.Node, analysis: ShapeAnalysis):
    x, t = node.inputs[0], analysis.input(node, 1)
    v = analysis.value(t)
    if v is None or v.scalar:
        return None
    return x, t, v, int(node.attrs.get("allowzero", 0))


class ReshapeNoop(_NoopRule):
    """Case 3: a Reshape to the shape its input already has (every entry its input's dim at the
    same position, or one free entry -1/unknown beside dims whose product is a known nonzero)."""

    pattern = ("Reshape",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        parts = None if m is None else _reshape_parts(anchor, self.analysis)
        if parts is None:
            return None
        x, _, v, allowzero = parts
        dims = self.analysis.dims(x)
        if dims is None or len(dims) != len(v.elems):
            return None
        free = []
        for i, (e, d) in enumerate(zip(v.elems, dims)):
            if e == d or (is_known(e) and e == 0 and not allowzero):
                continue  # x's own dim: the same known int, the same symbolic dim, or a 0 that copies it
            free.append(i)
        if len(free) > 1:
            return None
        if free:
            j = free[0]
            if is_known(v.elems[j]) and v.elems[j] != -1:
                return None  # a known size other than x's dim: a real reshape
            if any(not (is_known(d) and d > 0) for i, d in enumerate(dims) if i != j):
                return None  # the free entry is x's dim j only when the others' product is nonzero
        return m


class ReshapeTarget(_AnalysisRule):
    """Case 2: a computed Reshape target, partly known, becomes a constant with 0 and -1."""

    pattern = ("Reshape",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        parts = None if m is None else _reshape_parts(anchor, self.analysis)
        if parts is None or isinstance(parts[1], gs.Constant) or not any(is_known(e) or isinstance(e, Dim)
                                                                           for e in parts[2].elems):
            return None
        m.parts = parts
        return m

    def check(self, m: Match, ctx) -> MatchResult:
        x, _, v, allowzero = m.parts
        xdims = self.analysis.dims(x)
        # an entry proven equal to x's own dim at its place becomes 0 ("copy"); under allowzero=1
        # too, by writing allowzero=0, when the target holds no literal 0 that would change meaning
        # and no -1 (onnxruntime infers a -1 next to a 0 under allowzero=1: [0, -1] on a (0, 3, 2)
        # input gives (0, 6); under allowzero=0 the copied 0 makes the Reshape fail)
        can_copy = not (allowzero and any(is_known(e) and e in (0, -1) for e in v.elems))
        target, free, copies = [], [], False
        for i, e in enumerate(v.elems):
            if is_known(e):
                target.append(e)
            elif isinstance(e, Dim) and can_copy and xdims is not None and i < len(xdims) and e == xdims[i]:
                target.append(0)  # the same value on every input, 0 included
                copies = True
            else:
                target.append(None)
                free.append(i)
        m.allowzero = 0 if copies else allowzero
        if len(free) > 1:
            return MatchResult.fail(f"target entries {free} are unknown: at most one can become -1")
        if free:
            j = free[0]
            if -1 in target:
                return MatchResult.fail(f"target entry {j} is unknown and another entry is already -1")
            for i, e in enumerate(target):
                if i == j:
                    continue
                if e == 0 and m.allowzero:
                    return MatchResult.fail(f"entry {i} is 0 with allowzero=1: a -1 cannot be inferred")
                size = e if e != 0 else (xdims[i] if xdims is not None and i < len(xdims) else None)
                if not (is_known(size) and size > 0):
                    return MatchResult.fail(f"entry {i} may be 0 at run time: the -1 for entry {j} would be ambiguous")
            target[j] = -1
        if any(e < -1 for e in target):
            return MatchResult.fail("the target holds a negative entry other than -1 (the Reshape fails)")
        m.target = np.array(target, dtype=np.int64)
        return MatchResult.success()

    def rewrite(self, m: Match, ctx) -> gs.Tensor:
        m.count("reshape_targets")
        node = m.anchor
        shape = gs.Constant(m.names(f"{node.inputs[1].name or 'shape'}_static"), m.target)
        attrs = {"allowzero": m.allowzero} if "allowzero" in node.attrs else None
        return m.copy(node, inputs=[node.inputs[0], shape], attrs=attrs)


class ExpandNoop(_NoopRule):
    """Case 4: an Expand whose target broadcasts to the input's own shape."""

    pattern = ("Expand",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or len(anchor.inputs) < 2:
            return None
        x, v = anchor.inputs[0], self.analysis.value(anchor.inputs[1])
        dims = self.analysis.dims(x)
        if v is None or v.scalar or dims is None or len(v.elems) > len(dims):
            return None
        off = len(dims) - len(v.elems)
        for j, e in enumerate(v.elems):
            d = dims[off + j]
            if not ((is_known(e) and e == 1) or e == d):
                return None
        return m


class TileNoop(_NoopRule):
    """Case 5: a Tile whose repeats are all ones."""

    pattern = ("Tile",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or len(anchor.inputs) < 2:
            return None
        reps = self.analysis.ints(anchor.inputs[1])
        dims = self.analysis.dims(anchor.inputs[0])
        if reps is None or any(r != 1 for r in reps) or dims is None or len(reps) != len(dims):
            return None
        return m


class SliceNoop(_NoopRule):
    """Case 6: a Slice that takes every element (step 1 from the start to the end of each axis it
    cuts: an end of INT64_MAX, or at least the dim when the dim is known)."""

    pattern = ("Slice",)

    def match(self, anchor: gs.Node, scope: Scope) -> Match | None:
        m = super().match(anchor, scope)
        if m is None or "starts" in anchor.attrs:
            return None
        a = self.analysis
        x = anchor.inputs[0]
        r = a.rank(x)
        starts, ends = a.ints(a.input(anchor, 1)), a.ints(a.input(anchor, 2))
        if r is None or starts is None or ends is None or len(starts) != len(ends):
            return None
        axes = a.ints(anchor.inputs[3]) if a.input(anchor, 3) is not None else list(range(len(starts)))
        steps = a.ints(anchor.inputs[4]) if a.input(anchor, 4) is not None else [1] * len(starts)
        if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
            return None
        for axis, start, end, step in zip(axes, starts, ends, steps):
            axis = axis + r if axis < 0 else axis
            if step != 1 or not 0 <= axis < r:
                return None
            n = a.dim(x, axis)
            if is_known(n):
                if len(slice_indices(n, start, end, 1)) != n:
                    return None
            elif start != 0 or end != _INT64_MAX:
                return None
        return m

