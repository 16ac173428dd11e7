"""Every ONNX node conformance case and every light model through the default pipeline.

The default pipeline is every default pass (layout included) with the ascend910a cost model;
a light model is run on the input onnx's backend runner uses (arange(n)/n) against the output
shipped beside it, in the device and the portable form.

    python benchmarks/conformance.py            # all ~1,900 cases, summary by status and op
    python benchmarks/conformance.py --failures # also list each failing or crashing case

Each case's inputs are fed in the form onnxruntime takes (0-d arrays, not numpy scalars;
TensorProtos as arrays; sequences as lists). A case is run where onnxruntime reproduces the
expected outputs on the original model; it passes when the optimized model still does. 'crash'
means the optimizer raised: a bug. The cases left out (onnxruntime cannot load the original,
fails running it, or does not reproduce its expected outputs) are listed by name with the reason
(``--left-out FILE`` writes the list to a file instead).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings

from onnx.backend.test.case.node import collect_testcases

from graphpass.conformance import light_models, run_case, run_light_model


def _reason(detail: str) -> str:
    """A left-out case's reason without the case-specific part (node names, type numbers)."""
    import re

    detail = re.sub(r"node with name '[^']*'", "node", detail)
    detail = re.sub(r"\(\d+\)", "", detail)
    return detail[:110]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failures", action="store_true", help="list failing and crashing cases")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--no-models", action="store_true", help="skip the light models (node cases only)")
    ap.add_argument("--left-out", default="", help="write the left-out cases (name: reason) to this file")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    warnings.simplefilter("ignore")
    cases = [c for c in collect_testcases(None) if args.filter in c.name]
    t0 = time.perf_counter()
    outcomes = [run_case(c) for c in cases]
    if not args.no_models:
        outcomes += [run_light_model(p) for p in light_models() if args.filter in p]
    status = collections.Counter(o.status for o in outcomes)
    console = Console(width=140)
    seconds = time.perf_counter() - t0
    summary = Table(title=f"{len(outcomes)} conformance cases and light models in {seconds:.0f} s")
    summary.add_column("status")
    summary.add_column("cases", justify="right")
    for k, v in status.most_common():
        summary.add_row(k, str(v))
    console.print(summary)
    by_op = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_op[o.op][o.status] += 1
    bad_ops = {op: c for op, c in by_op.items() if c["fail"] or c["crash"]}
    table = Table(title="ops with failures (pass / fail / crash / not counted)")
    for col in ("op", "pass", "fail", "crash", "not counted"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for op, c in sorted(bad_ops.items()):
        table.add_row(op, str(c["pass"]), str(c["fail"]), str(c["crash"]),
                      str(sum(c.values()) - c["pass"] - c["fail"] - c["crash"]))
    console.print(table if bad_ops else "no op has a failing or crashing case")
    if args.failures:
        for o in outcomes:
            if o.status in ("fail", "crash"):
                console.print(f"{o.status}: {o.name} ({o.op}): {o.detail}")
    left = [o for o in outcomes if o.status.startswith("ort-")]
    lines = [f"{o.name} [{o.status}]: {o.detail}" for o in sorted(left, key=lambda o: (o.status, o.name))]
    if args.left_out:
        with open(args.left_out, "w") as f:
            f.write("\n".join(lines) + "\n")
    else:
        for line in lines:
            print(f"left out: {line}")
    reasons = collections.Counter(f"{o.status}: {_reason(o.detail)}" for o in left)
    ran = len(outcomes) - len(left)
    print(f"{len(outcomes)} cases; {ran} run, {status['pass']} passed, {status['fail'] + status['crash']} failed, "
          f"{status['rejected']} rejected; {len(left)} left out (onnxruntime cannot run the original):")
    for why, n in reasons.most_common():
        print(f"  {n:5d}  {why}")
    return 1 if status["fail"] or status["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
