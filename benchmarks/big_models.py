"""Big models: a model over 2 GB (external data) and a 200k-node graph through ``graphpass optimize``.

    python benchmarks/big_models.py                     # 2.2 GB of weights, 200k nodes
    python benchmarks/big_models.py --gb 0.5 --nodes 50000

Each model is written to a temporary folder (the weights streamed into one external data file,
so writing never holds them all), then ``graphpass optimize`` runs on it in a child process;
the table gives its wall time, its peak RSS (``resource.getrusage(RUSAGE_SELF)`` in the child) and the
ratio of peak RSS to the size of the weights (the bar: under 1.5x).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper



def big_weights_model(folder: Path, gigabytes: float, channels: int = 512, seed: int = 0) -> tuple[Path, int]:
    """Conv -> BatchNormalization -> Relu blocks with a residual Add, 3x3 weights of ``channels``
    squared, until the weights pass ``gigabytes``; weights streamed to ``weights.bin``."""
    rng = np.random.default_rng(seed)
    per = channels * channels * 9 * 4
    blocks = int(gigabytes * 1e9 // per) + 1
    data = folder / "weights.bin"
    nodes, inits = [], []
    offset = 0
    x = "input"
    with open(data, "wb") as f:
        def external(name: str, arr: np.ndarray) -> str:
            nonlocal offset
            raw = arr.astype(np.float32).tobytes()
            f.write(raw)
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape))
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data.name), ("offset", str(offset)), ("length", str(len(raw)))):
                t.external_data.add(key=k, value=v)
            offset += len(raw)
            inits.append(t)
            return name

        for b in range(blocks):
            w = external(f"b{b}.w", (rng.standard_normal((channels, channels, 3, 3)) * 0.02).astype(np.float32))
            bn = [external(f"b{b}.bn{k}", v) for k, v in (("s", np.ones(channels)), ("b", np.zeros(channels)),
                                                          ("m", np.zeros(channels)), ("v", np.ones(channels)))]
            nodes += [helper.make_node("Conv", [x, w], [f"b{b}.c"], pads=[1, 1, 1, 1]),
                      helper.make_node("BatchNormalization", [f"b{b}.c", *bn], [f"b{b}.n"]),
                      helper.make_node("Relu", [f"b{b}.n"], [f"b{b}.r"]),
                      helper.make_node("Add", [f"b{b}.r", x], [f"b{b}.y"])]
            x = f"b{b}.y"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, channels, 4, 4])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, 4, 4])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "big.onnx"
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, offset


_CHILD = ("import resource, sys\n"
          "from graphpass.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
          "sys.exit(rc)\n")


_MAKE_NODES = ("import sys, onnx\n"
               "from _synthetic import residual_stack\n"
               "m = residual_stack(int(sys.argv[2]), channels=int(sys.argv[3]))\n"
               "w = sum(len(t.raw_data) for t in m.graph.initializer)\n"
               "onnx.save(m, sys.argv[1], save_as_external_data=w > 1.5e9, location='nodes.onnx.data')\n"
               "print(len(m.graph.node), w)\n")


def optimize_child(model: Path, out: Path) -> tuple[float, int, int]:
    """(seconds, peak RSS bytes of the child that ran ``graphpass optimize``, exit code)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "optimize", str(model), "-o", str(out), "-q"],
                          capture_output=True, text=True)
    dt = time.perf_counter() - t0
    peak = 0
    for line in proc.stderr.splitlines():
        if line.startswith("peak_rss_kb "):
            peak = int(line.split()[1]) * 1024
        elif proc.returncode:
            print(line, file=sys.stderr)
    return dt, peak, proc.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.2, help="weights of the external-data model")
    ap.add_argument("--nodes", type=int, default=200_000, help="nodes of the big graph")
    ap.add_argument("--channels", type=int, default=8,
                    help="channels of the big graph's convolutions (64: ~3.9 GB of weights at 200k nodes)")
    ap.add_argument("--keep", default=None, help="write the models here instead of a temporary folder")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.gb > 0:
            d = folder / "ext"
            d.mkdir(exist_ok=True)
            path, weights = big_weights_model(d, args.gb)
            dt, peak, rc = optimize_child(path, d / "big.opt.onnx")
            out_bytes = sum(p.stat().st_size for p in d.iterdir() if p.name.startswith("big.opt"))
            rows.append((f"{weights / 1e9:.2f} GB weights (external data)", weights, dt, peak, rc, out_bytes))
        if args.nodes > 0:
            # built in its own process: a parent holding the model while it forks the optimizer
            # would count in the child's peak RSS (Linux keeps ru_maxrss across fork + exec)
            path = folder / "nodes.onnx"
            out = subprocess.run([sys.executable, "-c", _MAKE_NODES, str(path), str(args.nodes), str(args.channels)],
                                 capture_output=True, text=True, check=True, cwd=str(Path(__file__).resolve().parent))
            n, weights = (int(v) for v in out.stdout.split())
            dt, peak, rc = optimize_child(path, folder / "nodes.opt.onnx")
            rows.append((f"{n:,}-node graph, {args.channels} channels", weights, dt, peak, rc,
                         sum(p.stat().st_size for p in folder.glob("nodes.opt.onnx*")) if not rc else 0))
    print("| model | weights MB | optimize s | peak RSS MB | RSS / weights | exit | output MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, weights, dt, peak, rc, out_bytes in rows:
        print(f"| {label} | {weights / 1e6:,.0f} | {dt:.1f} | {peak / 1e6:,.0f} | {peak / max(weights, 1):.2f} | {rc} | "
              f"{out_bytes / 1e6:,.0f} |")
    return 0 if all(r[4] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
