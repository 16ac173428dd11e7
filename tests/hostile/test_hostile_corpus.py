"""The hostile-input corpus (issue 18): every case ends with exit 0 (a valid model that computes
what the input computes, where the input runs in onnxruntime) or exit 2 (one line on stderr,
no traceback), in under 10 s of CPU time, under a 2 GiB address-space limit, with peak RSS under 1 GiB
above the input's size, and leaves no file it created (beyond the outputs of an exit 0).

The cases are in ``hostile_cases.py`` (a table); they run in two runner processes in parallel
(``hostile_runner.py``), each forking one child per case. Cases that wait for a fix of another
branch are listed in ``hostile_cases.NEEDS`` and marked xfail (not strict).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hostile_cases
import hostile_runner

HERE = Path(__file__).parent
POOL = 2


def _params():
    out = []
    for c in hostile_cases.CASES:
        marks = [pytest.mark.xfail(strict=False, reason=c.needs)] if c.needs else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Run the selected cases (all of them unless -k narrowed the selection) in POOL shards."""
    selected = [item.callspec.params["case"].id for item in request.session.items
                if getattr(item, "callspec", None) and "case" in item.callspec.params
                and item.module.__name__ == request.module.__name__]
    base = tmp_path_factory.mktemp("hostile")
    shards = [selected[k::POOL] for k in range(POOL)]
    procs = []
    for k, ids in enumerate(shards):
        if not ids:
            continue
        out = base / f"results{k}.jsonl"
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        procs.append((out, subprocess.Popen([sys.executable, str(HERE / "hostile_runner.py"), str(base / f"w{k}"), str(out),
                                             *ids], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    found = {}
    for out, p in procs:
        _, err = p.communicate(timeout=1800)
        assert p.returncode == 0, err[-3000:]
        for line in out.read_text().splitlines():
            r = json.loads(line)
            found[r["id"]] = r
    return found


def _allowed_new(argv: list[str]) -> set[str]:
    """Files an exit-0 optimize may leave: the model, its external data, the report, the dumps."""
    def opt(name):
        return argv[argv.index(name) + 1] if name in argv else None

    allowed = set()
    if argv and argv[0] == "optimize":
        out = opt("-o")
        allowed |= {out, f"{out}.data"}
        if opt("--report"):
            allowed.add(opt("--report"))
        if opt("--dump-dir"):
            allowed.add(opt("--dump-dir"))
    return {os.path.normpath(a) for a in allowed if a}


@pytest.mark.parametrize("case", _params())
def test_hostile_case(case, results):
    r = results.get(case.id)
    assert r is not None, "the runner did not report this case"
    assert "build_error" not in r, r.get("build_error")
    last = r["stderr"].strip().splitlines()[-1:] if r["stderr"].strip() else []
    where = (f"{case.id}: {' '.join(r['argv'][:3])}... exit {r['code']} {r['cpu']:.1f} s CPU, {r['seconds']:.1f} s; "
             f"stderr: {last}")
    assert r["timeout"] != "graphpass", f"timed out ({hostile_runner.TIMEOUT} s CPU or {hostile_runner.WALL_TIMEOUT:.0f} s): {where}"
    assert r["signal"] is None or r["timeout"], f"killed by signal {r['signal']}: {where}"
    assert r["cpu"] < hostile_runner.TIMEOUT, where
    assert r["code"] in case.expect, where
    err = r["stderr"].strip()
    if r["code"] == 2:
        assert "Traceback" not in err and len(err.splitlines()) == 1, where + "\n" + err[-2000:]
        assert r["after"] == r["before"], f"left behind: {sorted(set(r['after']) - set(r['before']))}: {where}"
    else:
        assert "Traceback" not in err, err[-2000:]
        new = set(r["after"]) - set(r["before"])
        allowed = _allowed_new(r["argv"])
        stray = sorted(n for n in new if os.path.normpath(n) not in allowed
                       and not any(n.startswith(a + os.sep) for a in allowed))
        assert not stray, f"left behind: {stray}: {where}"
        if r["argv"][0] == "optimize":
            assert r["timeout"] != "check", f"checking the output timed out: {where}"
            assert r["check"] == "ok" or r["check"].startswith("skip"), f"{r['check']}: {where}"
    assert r["maxrss"] < (1 << 30) + r["input_bytes"], f"peak RSS {r['maxrss'] / 2**20:.0f} MiB: {where}"
