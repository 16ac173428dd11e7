"""Placement + loop-invariant code motion on graphs made of many Loops (issue 7: 100k nodes < 10 s).

    python benchmarks/loops.py [--sizes 10000 100000]

Each Loop's body has 20 nodes: an invariant chain on an outer value (hoisted), a loop-carried
update, and an AI CPU Resize (cubic: ATC takes nearest and linear on AI Core only) of the carried
state in every fifth loop (which blocks sinking).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.ir.graph import count_nodes
from graphpass.passes import hoist_loop_invariants, place_and_sink

F = TensorProto.FLOAT


def _body(k: int, host: bool) -> onnx.GraphProto:
    nodes, prev = [], "w"
    for j in range(8):  # invariant chain on the outer value w
        nodes.append(helper.make_node("Mul" if j % 2 else "Add", [prev, "w"], [f"inv{j}"]))
        prev = f"inv{j}"
    cur = "s_in"
    for j in range(9):  # loop-carried work
        nodes.append(helper.make_node("Add" if j % 2 else "Mul", [cur, prev], [f"c{j}"]))
        cur = f"c{j}"
    if host:
        nodes.append(helper.make_node("Resize", [cur, "", "ones"], ["rz"], mode="cubic"))
        cur = "rz"
    nodes.append(helper.make_node("Relu", [cur], ["s_out"]))
    nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    return helper.make_graph(nodes, f"body{k}",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("s_in", F, [1, 4, 4, 4])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("s_out", F, [1, 4, 4, 4])])


def build(n_nodes: int) -> onnx.ModelProto:
    loops = max(1, n_nodes // 21)
    nodes, cur = [], "x"
    for k in range(loops):
        nodes.append(helper.make_node("Loop", ["trips", "", cur], [f"y{k}"], body=_body(k, host=k % 5 == 0)))
        cur = f"y{k}"
    g = helper.make_graph(nodes, "loops", [helper.make_tensor_value_info("x", F, [1, 4, 4, 4]), helper.make_tensor_value_info("w", F, [1, 4, 4, 4])],
                          [helper.make_tensor_value_info(cur, F, [1, 4, 4, 4])],
                          initializer=[onnx.numpy_helper.from_array(np.array(3, np.int64), "trips"),
                                       onnx.numpy_helper.from_array(np.ones(4, np.float32), "ones")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    t = Table(title="placement + LICM on graphs of Loops (seconds)")
    for col in ("nodes", "loops", "hoist s", "hoisted", "place+sink s", "sunk", "not sunk"):
        t.add_column(col, justify="right")
    for n in args.sizes:
        graph = gp.load(build(n)).graph
        ctx = PassContext(target=gp.cost_model.DEFAULT_TARGET)  # placement needs a hardware target
        t0 = time.perf_counter()
        h = hoist_loop_invariants(graph, ctx)
        t1 = time.perf_counter()
        p = place_and_sink(graph, ctx)
        t2 = time.perf_counter()
        t.add_row(str(count_nodes(graph)), str(sum(1 for x in graph.nodes if x.op == "Loop")), f"{t1 - t0:.2f}",
                  str(h.stats["hoisted"]), f"{t2 - t1:.2f}", str(p.stats["sunk"]), str(p.stats["not_sunk"]))
    Console(width=110).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
