"""Mutated models through ``graphpass optimize``: exit codes, worst time, worst peak RSS per family.

    python benchmarks/bad_inputs.py                 # 1,000 mutants (250 per family)
    python benchmarks/bad_inputs.py --per-family 50 --timeout 10 --address-space 2G

Families: ``bitflip`` (1-20 random bits of the file flipped), ``truncate`` (the file cut at a
random byte), ``overwrite`` (8 random bytes written somewhere), ``field-swap`` (the parsed
ModelProto changed field by field: node inputs swapped or renamed, op types exchanged between
nodes, attributes moved to another node or given another type, tensor dims and data types
swapped or made huge, nodes dropped or duplicated, opset versions changed). Seeds: small models
of onnx's model zoo ("light") and the shipped ShuffleNet example.

Each mutant runs in a forked child (graphpass is imported once) under an address-space limit
and a timeout, in a folder of its own; the table gives per family the exit codes, the worst
time and the worst peak RSS (``wait4``'s ru_maxrss of the child; it includes the ~150 MB the
runner had resident at the fork). Anything but exit 0 or 2 with one line, a timeout, or a file
left behind after an exit 2 is listed as a failure, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto

from graphpass.fuzzing import mutate_bytes

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "models" / "shufflenet_v2_x0_5.onnx"
SEEDS = ["light_squeezenet.onnx", "light_bvlc_alexnet.onnx", "light_inception_v1.onnx", "light_zfnet512.onnx",
         "light_vgg19.onnx", "light_shufflenet.onnx"]
FAMILIES = ("bitflip", "truncate", "overwrite", "field-swap")


def seeds() -> list[bytes]:
    out = [(LIGHT / n).read_bytes() for n in SEEDS if (LIGHT / n).exists()]
    if EXAMPLE.exists():
        out.append(EXAMPLE.read_bytes())
    return out


# -- mutations ----------------------------------------------------------------------------------


def _bytes_mutant(data: bytes, family: str, rng: random.Random) -> bytes:
    return mutate_bytes(data, family, rng)


_HUGE = [0, -1, 2**31, 2**40, 2**62, 10**12]


def _field_swap(data: bytes, rng: random.Random) -> bytes:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    g = m.graph
    nodes = list(g.node)
    tensors = list(g.initializer)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["swap-inputs", "rename-input", "swap-op", "move-attr", "attr-type", "attr-value",
                           "dims", "dtype", "drop-node", "dup-node", "opset", "io-swap", "raw-swap"])
        a, b = rng.choice(nodes), rng.choice(nodes)
        if kind == "swap-inputs" and len(a.input) > 1:
            i, j = rng.sample(range(len(a.input)), 2)
            a.input[i], a.input[j] = a.input[j], a.input[i]
        elif kind == "rename-input" and a.input:
            a.input[rng.randrange(len(a.input))] = rng.choice(list(b.output) or ["nothing"])
        elif kind == "swap-op":
            a.op_type, b.op_type = b.op_type, a.op_type
        elif kind == "move-attr" and a.attribute:
            b.attribute.append(a.attribute[rng.randrange(len(a.attribute))])
        elif kind == "attr-type" and a.attribute:
            at = a.attribute[rng.randrange(len(a.attribute))]
            at.type = rng.choice([AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING, AttributeProto.FLOATS,
                                  AttributeProto.INTS, AttributeProto.TENSOR, AttributeProto.GRAPH])
        elif kind == "attr-value" and a.attribute:
            at = a.attribute[rng.randrange(len(a.attribute))]
            if at.ints:
                at.ints[rng.randrange(len(at.ints))] = rng.choice(_HUGE)
            else:
                at.i = rng.choice(_HUGE)
                at.f = rng.choice([float("nan"), float("inf"), -0.0, 1e38])
        elif kind == "dims" and tensors:
            t = rng.choice(tensors)
            if t.dims:
                t.dims[rng.randrange(len(t.dims))] = rng.choice(_HUGE)
            else:
                t.dims.append(rng.choice(_HUGE))
        elif kind == "dtype" and tensors:
            rng.choice(tensors).data_type = rng.choice([0, TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL,
                                                        TensorProto.FLOAT16, 99])
        elif kind == "drop-node" and len(g.node) > 1:
            del g.node[rng.randrange(len(g.node))]
            nodes = list(g.node)
        elif kind == "dup-node":
            g.node.append(a)
        elif kind == "opset" and m.opset_import:
            m.opset_import[0].version = rng.choice([0, 1, 6, 99, 2**40])
        elif kind == "io-swap" and g.input and g.output:
            g.input[0].name, g.output[0].name = g.output[0].name, g.input[0].name
        elif kind == "raw-swap" and len(tensors) > 1:
            t, u = rng.sample(tensors, 2)
            t.raw_data, u.raw_data = u.raw_data, t.raw_data
    return m.SerializeToString()


def mutants(per_family: int, seed: int = 0):
    pool = seeds()
    rng = random.Random(seed)
    for family in FAMILIES:
        for k in range(per_family):
            data = rng.choice(pool)
            while True:
                try:
                    mutant = _field_swap(data, rng) if family == "field-swap" else _bytes_mutant(data, family, rng)
                    break
                except (ValueError, TypeError):  # a value protobuf itself refuses to hold: draw again
                    data = rng.choice(pool)
            yield family, k, mutant


# -- running ------------------------------------------------------------------------------------


def run_one(data: bytes, folder: Path, timeout: float, address_space: int) -> dict:
    """Exit code, seconds, peak RSS (bytes), stderr and leftovers of one optimize run."""
    folder.mkdir()
    (folder / "in.onnx").write_bytes(data)
    err = folder.parent / "stderr"
    before = sorted(os.listdir(folder))
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        code = 98
        try:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
            os.chdir(folder)
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            from graphpass.cli import main

            code = main(["optimize", "in.onnx", "-o", "out.onnx", "-q", "--target", "none"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 99
        finally:
            sys.stderr.flush()
            os._exit(code)
    timed_out = False
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.perf_counter() - start > timeout:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            timed_out = True
            break
        time.sleep(0.002)
    seconds = time.perf_counter() - start
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    after = sorted(os.listdir(folder))
    text = err.read_text(errors="replace").strip() if err.exists() else ""
    return {"code": "timeout" if timed_out else code, "seconds": seconds, "rss": usage.ru_maxrss * 1024,
            "stderr": text, "left": sorted(set(after) - set(before) - ({"out.onnx", "out.onnx.data"} if code == 0 else set()))}


def _warm_up() -> None:
    """One optimize run in this process before the forks, so each child starts with graphpass's
    lazy imports done (no onnxruntime session: its thread pools must not predate a fork)."""
    import contextlib
    import io
    import logging

    from graphpass.cli import main

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        src = Path(tmp) / "m.onnx"
        src.write_bytes(seeds()[0])
        main(["optimize", str(src), "-o", str(Path(tmp) / "o.onnx"), "-q", "--target", "none"])
    logging.getLogger().handlers.clear()  # each child sets up logging on its own stderr


def _size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in units else ""
    return int(float(t[: len(t) - len(unit)]) * units[unit])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per run (default 10)")
    ap.add_argument("--address-space", type=_size, default=_size("2G"), help="RLIMIT_AS of each run (default 2G)")
    ap.add_argument("--save", default=None, metavar="DIR", help="save each failing mutant as DIR/<family>_<k>.onnx")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _warm_up()

    rows: dict[str, dict] = collections.defaultdict(lambda: {"n": 0, "codes": collections.Counter(), "worst_s": 0.0,
                                                            "worst_rss": 0, "slowest": None, "biggest": None})
    failures = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gp-bad-inputs-") as tmp:
        for n, (family, k, data) in enumerate(mutants(args.per_family, args.seed)):
            folder = Path(tmp) / f"{n:05d}"
            r = run_one(data, folder, args.timeout, args.address_space)
            row = rows[family]
            row["n"] += 1
            row["codes"][r["code"]] += 1
            if r["seconds"] > row["worst_s"]:
                row["worst_s"], row["slowest"] = r["seconds"], k
            if r["rss"] > row["worst_rss"]:
                row["worst_rss"], row["biggest"] = r["rss"], k
            lines = r["stderr"].splitlines()
            clean = r["code"] in (0, 2) and "Traceback" not in r["stderr"] and (r["code"] == 0 or len(lines) == 1)
            if not clean or r["left"]:
                failures.append((family, k, r["code"], f"{r['seconds']:.1f} s", r["left"], lines[-1:] if lines else ""))
                if args.save:
                    Path(args.save).mkdir(parents=True, exist_ok=True)
                    (Path(args.save) / f"{family}_{k}.onnx").write_bytes(data)
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{sum(r['n'] for r in rows.values())} mutants in {time.perf_counter() - t0:.0f} s "
          f"(timeout {args.timeout:g} s, address space {args.address_space / 2**30:g} GiB)\n")
    print("| family | mutants | exit codes | worst time (mutant #) | worst peak RSS (mutant #) |")
    print("|---|---:|---|---:|---:|")
    for family in FAMILIES:
        r = rows[family]
        codes = ", ".join(f"{c}: {v}" for c, v in sorted(r["codes"].items(), key=lambda kv: str(kv[0])))
        print(f"| {family} | {r['n']} | {codes} | {r['worst_s']:.2f} s (#{r['slowest']}) | "
              f"{r['worst_rss'] / 2**20:.0f} MiB (#{r['biggest']}) |")
    if failures:
        print(f"\n{len(failures)} failures (exit other than 0/2, more than one line, traceback, timeout or files left):")
        for f in failures[:40]:
            print("  ", *f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
