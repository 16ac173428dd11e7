"""1,000 mutated protobufs of valid models (bit flips, truncations, overwritten bytes): every one
exits cleanly, 0 (still a valid model) or 2 with one line and no output file; never a traceback.

This corpus found two bugs: op types that were not valid UTF-8 reached the passes, and
fold_constants' node-by-node fallback unhooked a real node from its input (gs disconnects by
equality, and the probe node equalled the real one)."""

import contextlib
import io
import os
import random
import shutil

import onnx

from graphpass.cli import main
from graphpass.fuzzing import mutate_bytes

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "shufflenet_v2_x0_5.onnx")


def _mutants(n: int, seed: int = 0):
    seeds = [open(os.path.join(LIGHT, f), "rb").read() for f in ("light_squeezenet.onnx", "light_bvlc_alexnet.onnx")]
    seeds.append(open(EXAMPLE, "rb").read()[:200_000])
    rng = random.Random(seed)
    for _ in range(n):
        data = rng.choice(seeds)
        kind = rng.choice(["flip", "flip", "truncate", "overwrite"])
        yield kind, mutate_bytes(data, "bitflip" if kind == "flip" else kind, rng)


def test_thousand_mutated_models_exit_cleanly(tmp_path):
    """Every 10th run also asks for --verify, --dump-dir and --report: on exit 2 nothing the run
    created remains (no output, dump folder, report or staging folder)."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    failures = []
    codes = {0: 0, 2: 0}
    for k, (kind, data) in enumerate(_mutants(1000)):
        src.write_bytes(data)
        out.unlink(missing_ok=True)
        for p in tmp_path.iterdir():
            if p.name not in ("m.onnx",):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        extra = ["--verify", "--dump-dir", str(tmp_path / "d"), "--report", str(tmp_path / "r.json")] if k % 10 == 0 else []
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["optimize", str(src), "-o", str(out), "-q", "--target", "none", *extra])
        text = err.getvalue().strip()
        left = sorted(p.name for p in tmp_path.iterdir())
        clean = code in (0, 2) and "Traceback" not in text and (code == 0 or (len(text.splitlines()) == 1 and left == ["m.onnx"]))
        if not clean:
            failures.append((k, kind, code, text.splitlines()[-1] if text else ""))
        else:
            codes[code] += 1
    assert not failures, failures[:5]
    assert codes[2] > 500 and codes[0] > 0


def test_diff_of_mutated_models_exits_cleanly(tmp_path):
    """``graphpass diff`` on 300 mutants against the model they came from: 0 or 1, or 2 naming
    the file in one line; never a traceback or an internal error."""
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    good.write_bytes(open(os.path.join(LIGHT, "light_squeezenet.onnx"), "rb").read())
    failures = []
    for k, (kind, data) in enumerate(_mutants(300, seed=1)):
        bad.write_bytes(data)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["diff", str(good), str(bad), "--target", "none", "--exit-code"])
        text = err.getvalue().strip()
        clean = code in (0, 1) or (code == 2 and len(text.splitlines()) == 1 and "bad.onnx" in text)
        if not clean or "Traceback" in text:
            failures.append((k, kind, code, text.splitlines()[-1] if text else ""))
    assert not failures, failures[:5]
