"""A linear or cubic Resize as a nearest one: an approximation, only when the user asks for it.

    Resize(x, mode=linear|cubic, coordinate_transformation_mode=c, ...)
        =>  Resize(x, mode=nearest, nearest_mode=round_prefer_ceil, coordinate_transformation_mode=c)

auto_optimizer's "Resize mode to nearest" knowledge (issue 25). ATC's ONNX parser takes only
nearest and linear (CANN's ONNX Resize page; cubic does not compile) and implements nearest with
round_prefer_ceil only (CANN 9.x): the pass writes that rounding, where auto_optimizer writes
round_prefer_floor, which the 9.x page refuses. On the cost model's rows (op_info.toml, a row per
mode) linear runs on AI Core too (ResizeBilinearV2): nearest saves its lerps but not its memory
traffic, and a Resize is memory- or launch-bound in the estimate; cubic is not taken by ATC's parser
(priced on AI CPU). Each Resize is changed only where the target's estimate of it drops (the
report's explanations give both figures where it does not), and the pass is scored.

Not exact and not a rounding: every output element becomes one input element instead of a weighted
mean of its neighbours, so no bound holds (``Promise.approximation``). Never in the default
pipeline (``default_enabled = False``: ``--enable resize_to_nearest``). Each application measures
its error on the verification inputs (the seeded inputs ``optimize --verify`` feeds, same seed and
input shapes): the graph's outputs before and after the change, run in onnxruntime; the stats give
the max abs error per output and overall. A change whose error cannot be measured (the graph does
not run in onnxruntime as it stands) is not made, and ``--explain resize_to_nearest`` says why.
The output checks (``--verify``, ``graphpass verify``) are not loosened by it: they hold the
outputs to the other passes' promises unless the user gives the error they accept.

Left alone: a nearest Resize (whatever its rounding), a Resize outside the default domain. Resize-10
has no nearest_mode: its mode alone is changed.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.check.promise import Promise
from graphpass.errors import GraphpassError
from graphpass.ir.graph import iter_graphs
from graphpass.ir.model import opset_of
from graphpass.passes.framework import PassContext, PassKind, PassResult, register
from graphpass.passes.framework.pass_base import Pass

__all__ = ["ResizeToNearest", "RESIZE_NEAREST"]

_NAME = "resize_to_nearest"
_MODES = ("linear", "cubic")
#: the nearest rounding CANN's ONNX Resize implements (cann_atc.toml: Resize nearest_mode, 9.2)
_CANN_ROUNDING = "round_prefer_ceil"
_DROPPED = ("cubic_coeff_a", "exclude_outside", "antialias")  # meaningless for nearest

RESIZE_NEAREST = Promise.approximation(
    "resize-nearest",
    reason="a linear or cubic Resize computed as a nearest one: each output element is one input element "
           "instead of a weighted mean of its neighbours; the error is measured on the verification inputs "
           "and reported, not bounded")


def _mode(node: gs.Node) -> str:
    v = node.attrs.get("mode", "nearest")
    return v.decode() if isinstance(v, bytes) else str(v)


@register
class ResizeToNearest(Pass):
    """Rewrites linear and cubic Resizes as nearest ones (round_prefer_ceil), reporting the error.

    Cases:
      1. mode linear or cubic, any coordinate_transformation_mode (kept), opset 11+: nearest_mode
         round_prefer_ceil, cubic_coeff_a / exclude_outside / antialias dropped;
      2. Resize-10 (mode only): mode nearest.
    """

    name = _NAME
    summary = ("linear/cubic Resize -> nearest (CANN's round_prefer_ceil): an approximation, default off; "
               "its max abs error on the verification inputs is reported.")
    kind = PassKind.LOWERING
    promise = RESIZE_NEAREST
    default_enabled = False
    scored = True
    needs_target = True
    anchor_ops = frozenset({"Resize"})
    runs_before = (PassKind.FUSION,)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        sites = [n for g in iter_graphs(graph) for n in g.nodes
                 if n.op == "Resize" and n.domain in (None, "", "ai.onnx") and _mode(n) in _MODES]
        sites = [n for n in sites if self._pays(n, ctx)]
        if not sites:
            return PassResult(False, {"resizes": 0})
        before = self._run(graph, ctx)
        if isinstance(before, str):
            for n in sites:
                ctx.explain(self.name, n, f"not changed: its error could not be measured ({before})")
            return PassResult(False, {"resizes": 0, "not_measured": before})
        opset = opset_of(graph) or 11
        saved = [(n, dict(n.attrs)) for n in sites]
        modes: dict[str, int] = {}
        for n in sites:
            modes[_mode(n)] = modes.get(_mode(n), 0) + 1
            attrs = {k: v for k, v in n.attrs.items() if k not in _DROPPED}
            attrs["mode"] = "nearest"
            if opset >= 11:
                attrs["nearest_mode"] = _CANN_ROUNDING
            n.attrs = attrs
        after = self._run(graph, ctx, before[0])
        if isinstance(after, str):  # the nearest graph does not run: put the modes back
            for n, attrs in saved:
                n.attrs = attrs
                ctx.explain(self.name, n, f"not changed: the nearest form does not run in onnxruntime ({after})")
            return PassResult(False, {"resizes": 0, "not_measured": after})
        errors = self._errors(before[1], after[1])
        worst = max(errors.values(), default=0.0)
        return PassResult(True, {"resizes": len(sites), "from_modes": modes, "max_abs_error": worst,
                                 "max_abs_error_by_output": errors, "seed": ctx.seed,
                                 "measured_on": "the verification inputs (seeded as the run's output check seeds them)"})

    def _pays(self, node: gs.Node, ctx: PassContext) -> bool:
        """Whether the target's estimate of this Resize drops as a nearest one (symbolic dims at 1);
        an approximation that buys nothing is not made. Unknown shapes: left to the cost veto."""
        if not ctx.target.estimates:
            return True
        x, y = node.inputs[0], node.outputs[0]
        if x.shape is None or y.shape is None:
            return True

        def static(shape):
            return [int(d) if isinstance(d, (int, np.integer)) else 1 for d in shape]

        def site(attrs) -> gs.Graph:
            xi = gs.Variable("x", dtype=x.dtype or np.float32, shape=static(x.shape))
            yo = gs.Variable("y", dtype=xi.dtype, shape=static(y.shape))
            sizes = gs.Constant("sizes", np.array(static(y.shape), np.int64))
            ins = [xi, gs.Variable.empty(), gs.Variable.empty(), sizes]
            return gs.Graph(nodes=[gs.Node("Resize", "rs", attrs, ins, [yo])], inputs=[xi], outputs=[yo], opset=13)

        opts = {k: v for k, v in ctx.cost_options.items() if k == "precision_mode"}
        cm = ctx.target.cost_model
        mode = _mode(node)
        was = cm.estimate(site({"mode": mode}), **opts).total_us
        now = cm.estimate(site({"mode": "nearest", "nearest_mode": _CANN_ROUNDING}), **opts).total_us
        if now < was:
            return True
        ctx.explain(self.name, node, f"the approximation buys nothing on {ctx.target.name}: the cost model prices "
                                     f"this {mode} Resize {was:.1f} us, nearest {now:.1f} us (symbolic dims at 1)")
        return False

    @staticmethod
    def _run(graph: gs.Graph, ctx: PassContext, feeds=None):
        """(feeds, outputs) of the graph as it stands in onnxruntime, or why it does not run."""
        from graphpass.check import verify as V
        from graphpass.ir import model_io

        try:
            model = model_io.to_proto(graph, emit="device")
            if feeds is None:
                feeds, outputs, _, _, _ = V.reference(model, seed=ctx.seed, input_shapes=ctx.input_shapes or None)
            else:
                outputs = V.Runner(model, True).run(feeds)
        except GraphpassError as e:
            return str(e).splitlines()[0]
        return feeds, outputs

    @staticmethod
    def _errors(ref: dict, got: dict) -> dict[str, float]:
        """Max abs difference per output (integers exactly); inf where NaN/inf positions or signs moved."""
        out = {}
        for k, a in ref.items():
            a, b = np.asarray(a), np.asarray(got[k])
            if a.shape != b.shape:
                out[k] = math.inf
                continue
            if a.dtype.kind in "iub":  # an integer image: the difference of the values, exactly
                out[k] = float(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)))) if a.size else 0.0
                continue
            if a.dtype.kind != "f":
                out[k] = 0.0 if np.array_equal(a, b) else math.inf
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            fin = np.isfinite(a64) & np.isfinite(b64)
            if not np.array_equal(np.isnan(a64), np.isnan(b64)) or not np.array_equal(a64[~fin & ~np.isnan(a64)],
                                                                                       b64[~fin & ~np.isnan(a64)]):
                out[k] = math.inf
                continue
            out[k] = float(np.max(np.abs(a64[fin] - b64[fin]))) if fin.any() else 0.0
        return out
