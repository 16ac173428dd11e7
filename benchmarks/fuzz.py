"""Differential fuzzing at scale: each pass held to its promise, per dtype family.

    python benchmarks/fuzz.py                          # 2,000 examples per family, 8 families
    python benchmarks/fuzz.py --examples 500 --families float32 int64 --out fuzz_failures

Each example is a small model (graphpass/_fuzz_cases.py: elementwise ops with broadcasting over
ranks 0..6, Cast pairs, Transpose/Reshape chains, duplicates, Concats, Loop/If/Scan with cond
false, zero trips, trip count only or cond only, TopK with sorted/largest 0/1 and ties, the
fusions' patterns; special values NaN, +-inf, -0.0, subnormals, dtype max; opsets 11..21;
initializers inline, in external data below and above 1 KiB, sparse, string, int4/uint4) run
through the default pipeline or one pass. Passes that changed the graph decide the check:
bitwise when all are exact, else the loosest tolerance among them (graphpass/fuzzing.py).

A model onnxruntime's CPU provider (or ONNX's type constraints) cannot run is skipped with the
reason. The first failure of each new kind (signature) in a family is shrunk by hypothesis and
written to ``<out>/`` as the model, its inputs (.npz) and a script that re-runs the check; later
failures of a known kind are counted. Prints one row per family.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import time
import warnings
import zlib
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

from graphpass.fuzzing import FAMILIES, cases, differential, write_reproducer


class _Found(Exception):
    pass


def run_family(family: str, examples: int, chunk: int, out: Path, max_shrinks: int, log) -> dict:
    stats = collections.Counter()
    skips = collections.Counter()
    limits = collections.Counter()  # outside a tolerance's stated domain (an intermediate overflowed)
    failures: dict[str, dict] = {}
    state = {"target": None, "last": None}
    shrinks = [0]
    k = 0
    while stats["run"] < examples:
        n = min(chunk, examples - stats["run"])

        @seed(zlib.crc32(f"{family}:{k}".encode()))  # stable across runs (hash() of a str is salted per process)
        @settings(max_examples=n, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
                  suppress_health_check=list(HealthCheck))
        @given(cases(family))
        def prop(case):
            outcome = differential(case)
            if state["target"] is not None:  # shrinking a new failure
                if outcome.status == "fail" and outcome.signature == state["target"]:
                    state["last"] = (case, outcome)
                    raise _Found(outcome.signature)
                return
            stats["run"] += 1
            stats[outcome.status] += 1
            if outcome.status == "skip":
                skips[re.sub(r"\s+", " ", outcome.reason)[:100]] += 1
                return
            if outcome.status == "limit":
                limits[re.sub(r"\s+", " ", outcome.signature)[:100]] += 1
                return
            if outcome.status != "fail":
                return
            sig = outcome.signature
            f = failures.setdefault(sig, {"count": 0, "reason": outcome.reason, "path": None})
            f["count"] += 1
            if f["path"] is None:
                if shrinks[0] < max_shrinks:
                    shrinks[0] += 1
                    state["target"], state["last"] = sig, (case, outcome)
                    raise _Found(sig)
                f["path"] = write_reproducer(case, outcome, out)

        try:
            prop()
        except (_Found, ExceptionGroup):
            case, outcome = state["last"]
            path = write_reproducer(case, outcome, out)
            failures[state["target"]].update(path=path, reason=outcome.reason)
            log(f"  {family}: {state['target']}\n    {outcome.reason[:200]}\n    shrunk reproducer: {path}")
        state["target"] = state["last"] = None
        k += 1
    return {"stats": stats, "skips": skips, "failures": failures, "limits": limits}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=2_000, help="examples per family")
    ap.add_argument("--chunk", type=int, default=500, help="examples per hypothesis run")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--out", default="fuzz_failures", help="folder for minimized reproducers")
    ap.add_argument("--max-shrinks", type=int, default=6,
                    help="new failure kinds shrunk per family (later ones are saved unshrunk)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    out = Path(args.out)
    t0 = time.perf_counter()
    results = {}
    for fam in args.families:
        t = time.perf_counter()
        results[fam] = run_family(fam, args.examples, args.chunk, out, args.max_shrinks,
                                  lambda s: print(s, flush=True))
        r = results[fam]
        print(f"{fam}: {r['stats']['run']} examples, {r['stats']['skip']} skipped, {r['stats']['limit']} outside a "
              f"tolerance's domain, {r['stats']['fail']} failures ({len(r['failures'])} kinds) in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    print()
    print("| family | examples run | checked | skipped | overflowed intermediate (stated limit) | failures (kinds) |")
    print("|---|---:|---:|---:|---:|---:|")
    for fam, r in results.items():
        s = r["stats"]
        print(f"| {fam} | {s['run']:,} | {s['ok'] + s['fail'] + s['limit']:,} | {s['skip']:,} | {s['limit']:,} | "
              f"{s['fail']:,} ({len(r['failures'])}) |")
    for fam, r in results.items():
        for sig, n in r["limits"].most_common():
            print(f"{fam}: outside the promise (an intermediate overflowed): {n} x {sig}")
    print()
    for fam, r in results.items():
        print(f"{fam}: skipped, by reason")
        for why, n in r["skips"].most_common():
            print(f"  {n:5d}  {why}")
    print()
    for fam, r in results.items():
        for sig, f in sorted(r["failures"].items(), key=lambda kv: -kv[1]["count"]):
            print(f"FAIL {fam} x{f['count']}: {sig}\n    {f['reason'][:220]}\n    reproducer: {f['path']}")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
