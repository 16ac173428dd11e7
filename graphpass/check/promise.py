"""What a pass promises about the outputs of the graphs it rewrites: exact, a tolerance, or opt-in.

A ground-floor value (stdlib only): passes declare it, the checks (``graphpass.verify``) judge
outputs by it, and neither has to import the other's layer. ``graphpass.infra.pass_base``
re-exports these names.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Promise", "EXACT", "REASSOCIATION"]


@dataclasses.dataclass(frozen=True)
class Promise:
    """What a pass promises about the outputs of the graphs it rewrites.

    ``exact``: bitwise-equal outputs on every input (NaN positions and the sign of zero
    included) wherever onnxruntime itself is deterministic. ``tolerance``: outputs may differ by
    float rounding only, from the cause named in ``reason`` (reassociation of BN/scale/bias
    folds, MatMul+Add, a different summation order, a fused kernel instead of its
    decomposition); elementwise ``|a - b| <= atol + rtol * |b|``, and NaN/inf positions and
    signs stay exactly where the original has them. A rewrite that can change a value beyond
    that is a bug, never a tolerance.

    What a tolerance covers, precisely (settled when the fuzzer and two reviews probed it):
    it bounds one application on the values the rewritten nodes produce. Two things lie outside
    any rounding bound and are stated, not hidden: (1) an intermediate that overflows in one
    form and not the other (inputs near the dtype's max: ``(x*a)*b`` vs ``x*(a*b)``, a
    decomposed LayerNorm's ``(x-mu)^2``) moves an inf/NaN; inf and NaN *inputs* and parameters
    still land exactly where the original puts them; (2) later nodes can amplify the bounded
    error (cancellation, deep networks), so whole-model checks (``verify``) use a measured floor.
    For float16 models "exact" is judged under fp16 emulation (every float16 tensor rounded, as
    the spec computes): onnxruntime's CPU provider runs float16 ops without a float16 kernel in
    float32 between casts it places itself, so its bits follow the graph's structure.

    ``approximation``: the pass computes something else on purpose (a bilinear Resize as a
    nearest one), only when the user switches it on; no bound holds, so none is claimed: the pass
    measures its error on the verification inputs and reports it, and the output checks hold the
    outputs to the *other* passes' promises (an approximation never loosens a tolerance), so a
    verification fails unless the user states the error they accept.
    """

    kind: str  # "exact" | "tolerance" | "opt-in" (a precision change the user asked for: no bound) | "approximation"
    name: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    reason: str = "bitwise-equal outputs on every input"

    @classmethod
    def tolerance(cls, name: str, *, rtol: float, atol: float, reason: str) -> "Promise":
        return cls("tolerance", name, rtol, atol, reason)

    @classmethod
    def opt_in(cls, name: str, *, rtol: float, atol: float, reason: str) -> "Promise":
        """A change of precision the user asks for (never in a default pipeline): values outside
        the lower precision's range overflow and cancellation amplifies its rounding, so no
        per-element bound holds; ``rtol``/``atol`` are only ``verify``'s starting point, and
        ``graphpass precision`` (with fp16 emulation) is what judges the result."""
        return cls("opt-in", name, rtol, atol, reason)

    @classmethod
    def approximation(cls, name: str, *, reason: str) -> "Promise":
        """An approximation the user switches on (never in a default pipeline): named, unbounded,
        its error measured and reported by the pass; it loosens no output check."""
        return cls("approximation", name, 0.0, 0.0, reason)

    @property
    def bounded(self) -> bool:
        """Whether the promise is a bound the outputs are held to (exact or a rounding tolerance)."""
        return self.kind in ("exact", "tolerance")

    @property
    def approximate(self) -> bool:
        return self.kind == "approximation"

    @property
    def exact(self) -> bool:
        return self.kind == "exact"

    def __str__(self) -> str:
        if self.exact:
            return "exact"
        if self.approximate:
            return f"{self.name} (approximation, error measured and reported)"
        if not self.bounded:
            return f"{self.name} (opt-in, no bound)"
        return f"{self.name} (rtol {self.rtol:g}, atol {self.atol:g})"


EXACT = Promise("exact")

#: Float rounding from folding per-channel scales/biases into weights ((x*a)*b -> x*(a*b)).
REASSOCIATION = Promise.tolerance(
    "reassociation", rtol=1e-5, atol=1e-6,
    reason="scales and biases folded into weights: (x*a)*b -> x*(a*b), (x+a)+b -> x+(a+b)")
