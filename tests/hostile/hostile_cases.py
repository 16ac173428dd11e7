"""The hostile-input corpus: a table of cases, each a small file (or folder entry) built on demand.

Every case names its family, the command line it runs (paths relative to the case's own
folder), the exit codes it may end with (``expect``) and, when it can only pass once a fix of
another branch is in, the fix it waits for (``needs``: the test marks it xfail with that reason,
so flipping a case is a one-line change in :data:`NEEDS`).

The families follow issue 18: memory and time bombs (Expand, Resize, Pad, Tile,
ConstantOfShape, Range, Loop, Reshape, declared dims, shape-inference data propagation),
deep nesting, huge variadic ops, names (long, NUL, unicode, duplicates), opset imports and
domains, local functions calling themselves, wrong attribute types, malformed external data,
non-regular and truncated files, hostile output paths.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OK_OR_BAD = frozenset({0, 2})
BAD = frozenset({2})

#: Cases waiting for a fix: case id -> reason. The test marks them ``xfail(strict=False)``;
#: delete an entry once the fix is merged. Empty: every case of the corpus holds.
_LOAD = "needs hostile-load branch: "
NEEDS: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    family: str
    build: Callable[[Path], list[str]]  # writes the case's files into the folder, returns argv
    expect: frozenset = OK_OR_BAD
    #: compare onnxruntime outputs of input and output on exit 0 (where the input runs)
    compare: bool = True

    @property
    def needs(self) -> str | None:
        return NEEDS.get(self.id)


CASES: list[Case] = []


def case(id: str, family: str, expect=OK_OR_BAD, compare: bool = True):
    def deco(fn):
        CASES.append(Case(id, family, fn, frozenset(expect), compare))
        return fn
    return deco


def add(id: str, family: str, build, expect=OK_OR_BAD, compare: bool = True) -> None:
    CASES.append(Case(id, family, build, frozenset(expect), compare))


# --------------------------------------------------------------------------------------------
# building blocks


def model(nodes, inputs, outputs, inits=None, opset=17, functions=(), extra_opsets=None, value_info=(), ir=10):
    """A model (not checked: many cases are invalid on purpose); shapes are lists, types TensorProto."""
    def vi(name, spec):
        if spec is None:
            return helper.make_value_info(name, onnx.TypeProto())  # no type at all
        elem, shape = spec if isinstance(spec, tuple) else (TensorProto.FLOAT, spec)
        return helper.make_tensor_value_info(name, elem, shape)

    tensors = []
    for k, v in (inits or {}).items():
        tensors.append(v if isinstance(v, TensorProto) else numpy_helper.from_array(np.asarray(v), k))
    g = helper.make_graph(list(nodes), "hostile", [vi(k, v) for k, v in inputs.items()],
                          [vi(k, v) for k, v in outputs.items()], initializer=tensors, value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] if opset is not None else []
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = ir
    return m


def optimize(m: onnx.ModelProto | bytes, *extra: str, name: str = "in.onnx"):
    """build function: write the model, run ``graphpass optimize`` on it."""
    def build(folder: Path) -> list[str]:
        data = m if isinstance(m, bytes) else m.SerializeToString()
        (folder / name).write_bytes(data)
        return ["optimize", name, "-o", "out.onnx", "-q", "--target", "none", *extra]
    return build


def verb(m: onnx.ModelProto | bytes, *argv: str):
    """build function: write the model as in.onnx, run ``graphpass <argv>`` (in.onnx named in argv)."""
    def build(folder: Path) -> list[str]:
        (folder / "in.onnx").write_bytes(m if isinstance(m, bytes) else m.SerializeToString())
        return list(argv)
    return build


def i64(*v):
    return np.array(v, np.int64)


F = TensorProto.FLOAT
BIG_SHAPES = {"1e4sq": [10_000, 10_000], "5e4sq": [50_000, 50_000], "2p31x2": [2**31, 2], "2p40": [2**40],
              "1e6sq": [1_000_000, 1_000_000], "2p62": [2**31, 2**31], "3d": [4096, 4096, 4096]}


# --------------------------------------------------------------------------------------------
# 1. memory bombs of constant folding


for key, shape in BIG_SHAPES.items():
    for dtype, np_dtype in (("f32", np.float32), ("i64", np.int64), ("bool", np.bool_)):
        add(f"bomb/expand/{key}/{dtype}", "bomb-expand", optimize(model(
            [helper.make_node("Expand", ["c", "s"], ["e"]), helper.make_node("ReduceMax", ["e"], ["y"], keepdims=0)]
            if dtype == "f32" else [helper.make_node("Expand", ["c", "s"], ["e"]),
                                    helper.make_node("Shape", ["e"], ["y"])],
            {}, {"y": (F, []) if dtype == "f32" else (TensorProto.INT64, [len(shape)])},
            {"c": np.ones([1], np_dtype), "s": i64(*shape)}, opset=17)), compare=False)
    add(f"bomb/constantofshape/{key}", "bomb-constantofshape", optimize(model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
         helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
        {}, {"y": (F, [])}, {"s": i64(*shape)})), compare=False)
    add(f"bomb/tile/{key}", "bomb-tile", optimize(model(
        [helper.make_node("Tile", ["c", "r"], ["t"]), helper.make_node("ReduceMean", ["t"], ["y"], keepdims=0)],
        {}, {"y": (F, [])}, {"c": np.ones([1] * len(shape), np.float32), "r": i64(*shape)})), compare=False)
    add(f"bomb/reshape/{key}", "bomb-reshape", optimize(model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": [4]}, {"y": (F, None)}, {"s": i64(*shape)})),
        compare=False)
    add(f"bomb/declared-dim/{key}", "bomb-declared-dim", optimize(model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
         helper.make_node("ConstantOfShape", ["s"], ["y"])], {"x": shape}, {"y": shape})), compare=False)
    add(f"bomb/input-shape/{key}", "bomb-input-shape", optimize(model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ConstantOfShape", ["s"], ["c"]),
         helper.make_node("Add", ["x", "c"], ["y"])], {"x": ["N", "M"] if len(shape) == 2 else ["N"] * len(shape)},
        {"y": ["N", "M"] if len(shape) == 2 else ["N"] * len(shape)}),
        "--input-shape", "x:" + ",".join(str(d) for d in shape)), compare=False)

for n, scale in (("x1e4", 1e4), ("x1e6", 1e6), ("x1e9", 1e9), ("inf", float("inf")), ("nan", float("nan")),
                 ("neg", -5.0)):
    add(f"bomb/resize/{n}", "bomb-resize", optimize(model(
        [helper.make_node("Resize", ["c", "", "sc"], ["y"], mode="nearest")], {}, {"y": (F, None)},
        {"c": np.ones([1, 1, 8, 8], np.float32), "sc": np.array([1, 1, scale, scale], np.float32)}, opset=13)))
for n, pads in (("1e5", [0, 100_000, 0, 100_000]), ("2p31", [0, 2**31, 0, 2**31]), ("neg", [0, -1000, 0, -1000]),
                ("2p40", [0, 2**40, 0, 0])):
    add(f"bomb/pad/{n}", "bomb-pad", optimize(model(
        [helper.make_node("Pad", ["c", "p"], ["y"])], {}, {"y": (F, None)},
        {"c": np.ones([2, 2], np.float32), "p": i64(*pads)}, opset=13)))
for n, (start, limit, delta, dt) in {
    "1e12": (0, 10**12, 1, np.int64), "2p62": (0, 2**62, 1, np.int64), "tiny-delta": (0.0, 1e6, 1e-9, np.float32),
    "zero-delta": (0, 10, 0, np.int64), "neg": (10**12, 0, -1, np.int64), "nan": (0.0, float("nan"), 1.0, np.float32),
    "inf": (0.0, float("inf"), 1.0, np.float32),
}.items():
    add(f"bomb/range/{n}", "bomb-range", optimize(model(
        [helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Shape", ["r"], ["y"])],
        {}, {"y": (TensorProto.INT64, [1])},
        {"a": np.array(start, dt), "b": np.array(limit, dt), "d": np.array(delta, dt)}, opset=13)), compare=False)


def _loop(trips: int, cond_const: bool = True, depth_body: int = 1):
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                  helper.make_node("Add", ["v_in", "one"], ["v_out"])]
    body = helper.make_graph(body_nodes, "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", F, [1])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", F, [1])],
                             initializer=[numpy_helper.from_array(np.ones([1], np.float32), "one")])
    return model([helper.make_node("Loop", ["M", "cond", "v0"], ["y"], body=body)], {}, {"y": [1]},
                 {"M": np.array(trips, np.int64), "cond": np.array(cond_const), "v0": np.zeros([1], np.float32)})


for trips in (10**3, 10**6, 10**9, 2**62, -1):
    add(f"bomb/loop/{trips}", "bomb-loop", optimize(_loop(trips)), compare=trips <= 10**3)

# Cast of NaN / inf / huge floats to the shape of a Reshape or Expand
for n, v in (("nan", float("nan")), ("inf", float("inf")), ("1e30", 1e30), ("-1e30", -1e30)):
    add(f"bomb/cast-shape/reshape-{n}", "bomb-cast-shape", optimize(model(
        [helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64), helper.make_node("Reshape", ["x", "s"], ["y"])],
        {"x": [4]}, {"y": (F, None)}, {"f": np.array([v], np.float32)})))
    add(f"bomb/cast-shape/expand-{n}", "bomb-cast-shape", optimize(model(
        [helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64), helper.make_node("Expand", ["x", "s"], ["y"])],
        {"x": [1]}, {"y": (F, None)}, {"f": np.array([v], np.float32)})))


# --------------------------------------------------------------------------------------------
# 2. time bombs: deep nesting, huge variadic ops, huge attributes


def _nested(kind: str, depth: int) -> onnx.ModelProto:
    """If (or Loop with one trip) nested ``depth`` deep, built in place (no copy per level)."""
    m = model([], {"x": [2], "c": (TensorProto.BOOL, [])}, {"o0": (F, None)},
              {"one_trip": np.array(1, np.int64)} if kind == "loop" else None)
    graph = m.graph
    for d in range(depth):
        node = graph.node.add()
        node.output.append(f"o{d}")
        if kind == "if":
            node.op_type = "If"
            node.input.append("c")
            other = node.attribute.add()
            other.CopyFrom(helper.make_attribute("else_branch", helper.make_graph(
                [helper.make_node("Identity", ["x"], [f"e{d}"])], f"e{d}", [], [helper.make_tensor_value_info(f"e{d}", F, None)])))
            attr = node.attribute.add()
            attr.name, attr.type = "then_branch", onnx.AttributeProto.GRAPH
            sub = attr.g
            sub.name = f"g{d}"
        else:
            node.op_type = "Loop"
            node.input.extend(["one_trip", "c"])
            attr = node.attribute.add()
            attr.name, attr.type = "body", onnx.AttributeProto.GRAPH
            sub = attr.g
            sub.name = f"b{d}"
            sub.input.extend([helper.make_tensor_value_info(f"i{d}", TensorProto.INT64, []),
                              helper.make_tensor_value_info(f"ci{d}", TensorProto.BOOL, [])])
            sub.node.append(helper.make_node("Identity", [f"ci{d}"], [f"co{d}"]))
            sub.output.append(helper.make_tensor_value_info(f"co{d}", TensorProto.BOOL, []))
        sub.output.append(helper.make_tensor_value_info(f"o{d + 1}", F, None))
        graph = sub
    graph.node.append(helper.make_node("Identity", ["x"], [f"o{depth}"]))
    return m


def lazy(make, *extra):
    """build function: ``make()`` builds the model only when the case runs (big or slow to build)."""
    def build(folder: Path) -> list[str]:
        return optimize(make(), *extra)(folder)
    return build


for kind in ("if", "loop"):
    for depth in (10, 25, 100, 500, 2000):
        add(f"time/nested-{kind}/{depth}", "time-nesting", lazy(lambda kind=kind, depth=depth: _nested(kind, depth)))

def _variadic(op: str, n: int, distinct: bool) -> onnx.ModelProto:
    attrs = {"axis": 0} if op == "Concat" else {}
    if not distinct:
        return model([helper.make_node(op, ["x"] * n, ["y"], **attrs)], {"x": [1]}, {"y": (F, None)})
    return model([helper.make_node("Relu", ["x"], [f"r{k}"]) for k in range(min(n, 2000))]
                 + [helper.make_node(op, [f"r{k % 2000}" for k in range(n)], ["y"], **attrs)], {"x": [1]}, {"y": (F, None)})


for op in ("Sum", "Max", "Min", "Mean", "Concat"):
    for n in (10_000, 100_000):
        add(f"time/variadic-{op}/{n}", "time-variadic", lazy(lambda op=op, n=n: _variadic(op, n, False)))
        add(f"time/variadic-{op}-distinct/{n}", "time-variadic", lazy(lambda op=op, n=n: _variadic(op, n, True)))
# graphpass's time on 100,000 node outputs is the point; the harness checks the output with the
# full checker but does not compare 100,000 outputs in onnxruntime one by one (over its own budget)
add("time/many-outputs/100k", "time-variadic", lazy(lambda: model(
    [helper.make_node("Split", ["x"], [f"s{k}" for k in range(100_000)], axis=0)], {"x": [100_000]},
    {"s0": [1]}, opset=11)), compare=False)
add("time/huge-attribute/ints-1e6", "time-attribute", lazy(lambda: model(
    [helper.make_node("Transpose", ["x"], ["y"], perm=list(range(1_000_000)))], {"x": [1]}, {"y": [1]})))
add("time/huge-attribute/floats-1e6", "time-attribute", lazy(lambda: model(
    [helper.make_node("Relu", ["x"], ["y"], junk=[0.5] * 1_000_000)], {"x": [1]}, {"y": [1]})))
add("time/long-chain/10k", "time-chain", lazy(lambda: model(
    [helper.make_node("Relu", [f"t{k}" if k else "x"], [f"t{k + 1}" if k < 9_999 else "y"]) for k in range(10_000)],
    {"x": [2]}, {"y": [2]})))


# --------------------------------------------------------------------------------------------
# 3. names


def _relu_named(inp: str, out: str, node: str = "n") -> onnx.ModelProto:
    return model([helper.make_node("Relu", [inp], [out], name=node)], {inp: [2]}, {out: [2]})


for n, name in {"1mb": "x" * (1 << 20), "10mb": "y" * (10 << 20), "nul": "a\0b", "nul-only": "\0",
                "unicode": "输入😀\u202e", "newline": "a\nb", "slash": "../../etc/passwd", "space": " ",
                "empty-node": "", "percent": "%s%n%x", "rtl": "\u202ex"}.items():
    add(f"names/tensor/{n}", "names", optimize(_relu_named(name, "y")))
    add(f"names/node/{n}", "names", optimize(_relu_named("x", "y", node=name)))
add("names/output-equals-input", "names", optimize(model([], {"x": [2]}, {"x": [2]})))
add("names/duplicate-node-names", "names", optimize(model(
    [helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Relu", ["a"], ["y"], name="n")],
    {"x": [2]}, {"y": [2]})))
m = _relu_named("x", "y")
m.graph.output.append(helper.make_tensor_value_info("y", F, [2]))
add("names/duplicate-graph-output", "names", optimize(m))


def _dup_init(same_value: bool) -> onnx.ModelProto:
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2]}, {"y": [2]}, {"w": np.ones(2, np.float32)})
    m.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32) * (1 if same_value else 7), "w"))
    return m


add("names/duplicate-initializer/same", "names", optimize(_dup_init(True)))
add("names/duplicate-initializer/different", "names", optimize(_dup_init(False)))
m = _relu_named("x", "y")
m.graph.input.append(helper.make_tensor_value_info("x", F, [2]))
add("names/duplicate-graph-input", "names", optimize(m))
m = model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
add("names/two-producers", "names", optimize(m), expect=BAD)


# --------------------------------------------------------------------------------------------
# 4. opsets, domains, functions


add("opset/no-default-domain", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                       opset=None)))
add("opset/none-at-all-empty-graph", "opset", optimize(model([], {"x": [2]}, {"x": [2]}, opset=None)))
for v in (0, -1, 1, 6, 29, 999, 2**62):
    add(f"opset/version/{v}", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                       opset=v)))
add("opset/duplicate-default", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                       extra_opsets={"": 13})))
add("opset/unknown-domain-op", "domain", optimize(model([helper.make_node("Bar", ["x"], ["y"], domain="foo.bar")],
                                                        {"x": [2]}, {"y": [2]}, extra_opsets={"foo.bar": 1})))
add("opset/unknown-domain-no-import", "domain", optimize(model([helper.make_node("Bar", ["x"], ["y"], domain="foo.bar")],
                                                               {"x": [2]}, {"y": [2]})))
add("opset/unknown-op-default-domain", "domain", optimize(model([helper.make_node("NoSuchOp", ["x"], ["y"])],
                                                                {"x": [2]}, {"y": [2]})))
add("opset/ml-domain-only", "domain", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                     opset=None, extra_opsets={"ai.onnx.ml": 3})))
add("opset/op-newer-than-opset", "domain", optimize(model([helper.make_node("Gelu", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                          opset=13)))
add("opset/ir-0", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}, ir=0)), expect=BAD)
add("opset/ir-99", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}, ir=99)),
    expect=BAD)
add("opset/ir-3-functions", "opset", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}, ir=3)))


def _fn(name: str, calls: str, domain: str = "local") -> onnx.FunctionProto:
    return helper.make_function(domain, name, ["a"], ["b"], [helper.make_node(calls, ["a"], ["b"], domain=domain)],
                                [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


for n, fns in {"self": [_fn("F", "F")], "mutual": [_fn("F", "G"), _fn("G", "F")],
               "three-cycle": [_fn("F", "G"), _fn("G", "H"), _fn("H", "F")],
               "missing-callee": [_fn("F", "Nope")], "duplicate": [_fn("F", "F"), _fn("F", "F")]}.items():
    add(f"functions/{n}", "functions", optimize(model([helper.make_node("F", ["x"], ["y"], domain="local")], {"x": [2]},
                                                      {"y": [2]}, functions=fns, extra_opsets={"local": 1})))
deep = [helper.make_function("local", f"F{k}", ["a"], ["b"],
                             [helper.make_node(f"F{k + 1}" if k < 299 else "Relu", ["a"], ["b"],
                                               domain="local" if k < 299 else "")],
                             [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]) for k in range(300)]
add("functions/chain-300", "functions", optimize(model([helper.make_node("F0", ["x"], ["y"], domain="local")], {"x": [2]},
                                                       {"y": [2]}, functions=deep, extra_opsets={"local": 1})))


# --------------------------------------------------------------------------------------------
# 5. wrong attributes, missing types, wrong value_info


def _with_attr(op: str, inputs, attr: onnx.AttributeProto, shape=(1, 1, 4, 4), inits=None) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, ["y"])
    node.attribute.append(attr)
    return model([node], {"x": list(shape)}, {"y": (F, None)}, inits)


W = {"w": np.ones([1, 1, 3, 3], np.float32)}
attr_cases = {
    "conv-strides-floats": ("Conv", ["x", "w"], helper.make_attribute("strides", [1.0, 1.0]), W),
    "conv-strides-string": ("Conv", ["x", "w"], helper.make_attribute("strides", "11"), W),
    "conv-strides-zero": ("Conv", ["x", "w"], helper.make_attribute("strides", [0, 0]), W),
    "conv-strides-negative": ("Conv", ["x", "w"], helper.make_attribute("strides", [-1, -1]), W),
    "conv-strides-huge": ("Conv", ["x", "w"], helper.make_attribute("strides", [2**62, 2**62]), W),
    "conv-pads-wrong-length": ("Conv", ["x", "w"], helper.make_attribute("pads", [1, 1, 1]), W),
    "conv-group-zero": ("Conv", ["x", "w"], helper.make_attribute("group", 0), W),
    "conv-dilations-huge": ("Conv", ["x", "w"], helper.make_attribute("dilations", [2**31, 2**31]), W),
    "transpose-perm-float": ("Transpose", ["x"], helper.make_attribute("perm", [0.0, 1.0, 2.0, 3.0]), None),
    "transpose-perm-repeated": ("Transpose", ["x"], helper.make_attribute("perm", [0, 0, 1, 1]), None),
    "transpose-perm-out-of-range": ("Transpose", ["x"], helper.make_attribute("perm", [0, 1, 2, 99]), None),
    "softmax-axis-float": ("Softmax", ["x"], helper.make_attribute("axis", 1.5), None),
    "softmax-axis-huge": ("Softmax", ["x"], helper.make_attribute("axis", 2**40), None),
    "cast-to-999": ("Cast", ["x"], helper.make_attribute("to", 999), None),
    "cast-to-string-type": ("Cast", ["x"], helper.make_attribute("to", "float"), None),
    "relu-graph-attribute": ("Relu", ["x"], helper.make_attribute("g", helper.make_graph([], "e", [], [])), None),
    "leakyrelu-alpha-ints": ("LeakyRelu", ["x"], helper.make_attribute("alpha", [1, 2]), None),
    "gather-axis-string": ("Gather", ["x", "i"], helper.make_attribute("axis", "zero"), {"i": i64(0)}),
    "maxpool-kernel-zero": ("MaxPool", ["x"], helper.make_attribute("kernel_shape", [0, 0]), None),
    "maxpool-kernel-huge": ("MaxPool", ["x"], helper.make_attribute("kernel_shape", [2**40, 2**40]), None),
}
for n, (op, inputs, attr, inits) in attr_cases.items():
    add(f"attributes/{n}", "attributes", optimize(_with_attr(op, inputs, attr, inits=inits)))
no_value = helper.make_node("Constant", [], ["c"])
add("attributes/constant-without-value", "attributes", optimize(model(
    [no_value, helper.make_node("Add", ["x", "c"], ["y"])], {"x": [2]}, {"y": [2]})))
two_values = helper.make_node("Constant", [], ["c"], value_float=1.0)
two_values.attribute.append(helper.make_attribute("value_int", 1))
add("attributes/constant-two-values", "attributes", optimize(model(
    [two_values, helper.make_node("Add", ["x", "c"], ["y"])], {"x": [2]}, {"y": [2]})))
add("attributes/attribute-type-undefined", "attributes", optimize(_with_attr(
    "Relu", ["x"], onnx.AttributeProto(name="alpha", type=onnx.AttributeProto.UNDEFINED))))
add("types/input-without-type", "types", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": None}, {"y": [2]})))
add("types/output-without-type", "types", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": None})))
add("types/input-elem-type-0", "types", optimize(model([helper.make_node("Relu", ["x"], ["y"])],
                                                       {"x": (TensorProto.UNDEFINED, [2])}, {"y": [2]})))
add("types/input-elem-type-999", "types", optimize(model([helper.make_node("Relu", ["x"], ["y"])],
                                                         {"x": (999, [2])}, {"y": [2]})))
add("types/negative-dim", "types", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": [-5]}, {"y": [-5]})))
for n, dims in (("false-dims", [7, 7]), ("wrong-rank", [2, 2, 2]), ("huge", [2**40]), ("zero", [0])):
    add(f"types/value-info-{n}", "types", optimize(model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], {"x": [2]}, {"y": [2]},
        value_info=[helper.make_tensor_value_info("r", F, dims)])))
add("types/value-info-wrong-dtype", "types", optimize(model(
    [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], {"x": [2]}, {"y": [2]},
    value_info=[helper.make_tensor_value_info("r", TensorProto.INT8, [2])])))
m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2], "w": [2]}, {"y": [2]}, {"w": np.ones(2, np.float32)})
add("initializers/also-graph-input", "initializers", optimize(m))
add("initializers/also-graph-input-frozen", "initializers", optimize(m, "--freeze-initializers"))
for n, (dims, raw) in {"raw-short": ([4], b"\0" * 8), "raw-long": ([1], b"\0" * 64), "raw-empty": ([1000], b""),
                       "dims-negative": ([-1], b""), "dims-huge": ([2**40], b"\0" * 4),
                       "dims-overflow": ([2**62, 2**62], b"\0" * 4)}.items():
    t = TensorProto(name="w", data_type=F, dims=dims, raw_data=raw)
    add(f"initializers/{n}", "initializers", optimize(model(
        [helper.make_node("Add", ["x", "w"], ["y"])], {"x": [1]}, {"y": (F, None)}, {"w": t})))
t = TensorProto(name="w", data_type=F, dims=[3], float_data=[1.0])
add("initializers/float-data-short", "initializers", optimize(model(
    [helper.make_node("Add", ["x", "w"], ["y"])], {"x": [3]}, {"y": [3]}, {"w": t})))
t = TensorProto(name="w", data_type=999, dims=[1], raw_data=b"\0\0\0\0")
add("initializers/dtype-999", "initializers", optimize(model(
    [helper.make_node("Add", ["x", "w"], ["y"])], {"x": [1]}, {"y": [1]}, {"w": t})))


# --------------------------------------------------------------------------------------------
# 6. external data


def _external(entries: dict, data: bytes | None = b"\0" * 64, data_name: str = "w.bin", make=None):
    def build(folder: Path) -> list[str]:
        m = model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [4]}, {"y": [4]}, {"w": np.ones(4, np.float32)})
        t = m.graph.initializer[0]
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in entries.items():
            t.external_data.add(key=k, value=v)
        if data is not None:
            (folder / data_name).write_bytes(data)
        if make:
            make(folder)
        (folder / "in.onnx").write_bytes(m.SerializeToString())
        return ["optimize", "in.onnx", "-o", "out.onnx", "-q", "--target", "none"]
    return build


ext = {
    "ok": {"location": "w.bin", "offset": "0", "length": "16"},
    "offset-past-end": {"location": "w.bin", "offset": "1000", "length": "16"},
    "length-past-end": {"location": "w.bin", "offset": "0", "length": "1000000"},
    "offset-negative": {"location": "w.bin", "offset": "-16", "length": "16"},
    "length-negative": {"location": "w.bin", "offset": "0", "length": "-16"},
    "offset-not-a-number": {"location": "w.bin", "offset": "zero", "length": "16"},
    "length-huge": {"location": "w.bin", "offset": "0", "length": str(2**62)},
    "length-wrong-for-shape": {"location": "w.bin", "offset": "0", "length": "8"},
    "no-location": {"offset": "0", "length": "16"},
    "location-nul": {"location": "w.bin\0x", "offset": "0", "length": "16"},
    "location-long": {"location": "a" * 5000, "offset": "0", "length": "16"},
    "location-absolute": {"location": "/etc/passwd", "offset": "0", "length": "16"},
    "location-parent": {"location": "../w.bin", "offset": "0", "length": "16"},
    "location-folder": {"location": ".", "offset": "0", "length": "16"},
    "location-missing": {"location": "nope.bin", "offset": "0", "length": "16"},
    "checksum-junk": {"location": "w.bin", "offset": "0", "length": "16", "checksum": "\xff" * 10},
    "duplicate-keys": {"location": "w.bin"},
}
for n, entries in ext.items():
    add(f"external/{n}", "external-data", _external(entries))
add("external/data-is-fifo", "external-data", _external({"location": "w.bin", "length": "16"}, data=None,
                                                        make=lambda f: os.mkfifo(f / "w.bin")), expect=BAD)
add("external/data-is-dev-zero", "external-data", _external({"location": "w.bin"}, data=None,
                                                            make=lambda f: os.symlink("/dev/zero", f / "w.bin")), expect=BAD)
add("external/data-is-folder", "external-data", _external({"location": "w.bin", "length": "16"}, data=None,
                                                          make=lambda f: (f / "w.bin").mkdir()), expect=BAD)
add("external/data-empty-no-length", "external-data", _external({"location": "w.bin"}, data=b""))


# --------------------------------------------------------------------------------------------
# 7. files: non-regular, truncated, not ONNX; hostile output paths


def _good() -> onnx.ModelProto:
    return model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                 {"x": [1, 2, 6, 6]}, {"y": [1, 3, 4, 4]}, {"w": np.arange(54, dtype=np.float32).reshape(3, 2, 3, 3) / 50})


def _input_path(make):
    def build(folder: Path) -> list[str]:
        make(folder / "in.onnx")
        return ["optimize", "in.onnx", "-o", "out.onnx", "-q", "--target", "none"]
    return build


add("files/input-fifo", "files", _input_path(lambda p: os.mkfifo(p)), expect=BAD)
add("files/input-dev-zero", "files", _input_path(lambda p: os.symlink("/dev/zero", p)), expect=BAD)
add("files/input-dev-null", "files", _input_path(lambda p: os.symlink("/dev/null", p)), expect=BAD)
add("files/input-folder", "files", _input_path(lambda p: p.mkdir()), expect=BAD)
add("files/input-missing", "files", _input_path(lambda p: None), expect=BAD)
add("files/input-dangling-symlink", "files", _input_path(lambda p: os.symlink("nowhere.onnx", p)), expect=BAD)
add("files/input-symlink-loop", "files", _input_path(lambda p: os.symlink(p.name, p)), expect=BAD)
add("files/input-empty", "files", _input_path(lambda p: p.write_bytes(b"")), expect=BAD)
add("files/input-text", "files", _input_path(lambda p: p.write_text("ir_version: 8\ngraph { }\n")), expect=BAD)
add("files/input-zeros", "files", _input_path(lambda p: p.write_bytes(b"\0" * 4096)), expect=BAD)
add("files/input-ff", "files", _input_path(lambda p: p.write_bytes(b"\xff" * 4096)), expect=BAD)
add("files/input-npz", "files", _input_path(lambda p: p.write_bytes(b"PK\x03\x04" + b"\0" * 100)), expect=BAD)
good = _good().SerializeToString()
for k in range(24):
    cut = max(1, len(good) * k // 24)
    add(f"files/truncated/{k:02d}", "truncated", optimize(good[:cut]))
for k in range(12):
    add(f"files/bitflip/{k:02d}", "bitflip", optimize(bytes(b ^ (1 << (k % 8)) if i == (k * 37) % len(good) else b
                                                             for i, b in enumerate(good))))


def _output_path(make, out="out.onnx", extra=()):
    def build(folder: Path) -> list[str]:
        (folder / "in.onnx").write_bytes(good)
        make(folder)
        return ["optimize", "in.onnx", "-o", out, "-q", "--target", "none", *extra]
    return build


add("outputs/fifo", "outputs", _output_path(lambda f: os.mkfifo(f / "out.onnx")), expect=BAD)
add("outputs/symlink-to-fifo", "outputs", _output_path(lambda f: (os.mkfifo(f / "p"), os.symlink("p", f / "out.onnx"))),
    expect=BAD)
add("outputs/folder", "outputs", _output_path(lambda f: (f / "out.onnx").mkdir()), expect=BAD)
add("outputs/missing-folder", "outputs", _output_path(lambda f: None, out="nope/out.onnx"), expect=BAD)
add("outputs/report-fifo", "outputs", _output_path(lambda f: os.mkfifo(f / "r.json"), extra=("--report", "r.json")),
    expect=BAD)
add("outputs/dump-dir-is-file", "outputs", _output_path(lambda f: (f / "d").write_text(""), extra=("--dump-dir", "d")),
    expect=BAD)
add("outputs/external-data-fifo", "outputs", _output_path(lambda f: os.mkfifo(f / "out.onnx.data")), expect=BAD)
add("outputs/verify-dump-report", "outputs", _output_path(lambda f: None, extra=("--verify", "--dump-dir", "d",
                                                                                  "--report", "r.md")))
add("outputs/output-is-input", "outputs", _output_path(lambda f: None, out="in.onnx"))
add("outputs/empty-name", "outputs", _output_path(lambda f: None, out=""), expect=BAD)


# --------------------------------------------------------------------------------------------
# 8. the other verbs on hostile inputs


reshape_nan = model([helper.make_node("Cast", ["f"], ["s"], to=TensorProto.INT64), helper.make_node("Reshape", ["x", "s"], ["y"])],
                    {"x": [4]}, {"y": (F, None)}, {"f": np.array([float("nan")], np.float32)})
samples = {"good": good, "truncated": good[: len(good) // 2], "empty": b"",
           "expand-bomb": model([helper.make_node("Expand", ["c", "s"], ["y"])], {}, {"y": (F, None)},
                                {"c": np.ones([1], np.float32), "s": i64(50_000, 50_000)}).SerializeToString(),
           "no-opset": model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}, opset=None).SerializeToString(),
           "reshape-nan": reshape_nan.SerializeToString(),
           "recursive-function": model([helper.make_node("F", ["x"], ["y"], domain="local")], {"x": [2]}, {"y": [2]},
                                       functions=[_fn("F", "F")], extra_opsets={"local": 1}).SerializeToString()}
for n, data in samples.items():
    add(f"verbs/inspect/{n}", "verbs", verb(data, "inspect", "in.onnx"))
    add(f"verbs/diff/{n}", "verbs", verb(data, "diff", "in.onnx", "in.onnx", "--target", "none"))
    add(f"verbs/verify/{n}", "verbs", verb(data, "verify", "in.onnx", "in.onnx"))
    add(f"verbs/cost/{n}", "verbs", verb(data, "cost", "in.onnx"))


def _npz(content: bytes):
    def build(folder: Path) -> list[str]:
        (folder / "in.onnx").write_bytes(good)
        (folder / "x.npz").write_bytes(content)
        return ["verify", "in.onnx", "in.onnx", "--inputs", "x.npz"]
    return build


for n, content in {"garbage": b"PK\x03\x04" + b"junk" * 30, "empty": b"", "npy-header": b"\x93NUMPY\x01\x00junk",
                   "zeros": b"\0" * 1000}.items():
    add(f"verbs/verify-npz/{n}", "verbs", _npz(content), expect=BAD)
add("verbs/diff-fifo", "verbs", lambda f: (f.joinpath("in.onnx").write_bytes(good), os.mkfifo(f / "p.onnx"))
    and ["diff", "in.onnx", "p.onnx"], expect=BAD)
add("verbs/inspect-fifo", "verbs", lambda f: os.mkfifo(f / "p.onnx") or ["inspect", "p.onnx"], expect=BAD)
add("verbs/input-shape-huge", "verbs", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N"]}, {"y": ["N"]}),
                                                "--input-shape", "x:1000000000000", "--verify"), expect=BAD)
add("verbs/input-shape-verify-2p30", "verbs", optimize(model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", "M"]},
                                                             {"y": ["N", "M"]}),
                                                       "--input-shape", "x:1073741824,1073741824", "--verify"), expect=BAD)


# --------------------------------------------------------------------------------------------
# 9. mutants found by benchmarks/bad_inputs.py (default settings: 250 per family, seed 0)


def _bench_mutant(family: str, k: int):
    def build(folder: Path) -> list[str]:
        (folder / "in.onnx").write_bytes(_bench_mutants()[(family, k)])
        return ["optimize", "in.onnx", "-o", "out.onnx", "-q", "--target", "none"]
    return build


_MUTANTS: dict = {}


def _bench_mutants() -> dict:
    """The benchmark's mutants by (family, number), generated once per process."""
    if not _MUTANTS:
        import importlib.util

        path = Path(__file__).resolve().parents[2] / "benchmarks" / "bad_inputs.py"
        spec = importlib.util.spec_from_file_location("_gp_bad_inputs", path)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        _MUTANTS.update({(f, k): data for f, k, data in bench.mutants(250, 0)})
    return _MUTANTS


_DATA_FITS = "needs hostile-load branch: initializer data size checked against its shape (exit 3: cannot reshape / broadcast)"
BENCH_MUTANTS = {
    ("bitflip", 45): _DATA_FITS, ("bitflip", 94): _DATA_FITS, ("field-swap", 54): _DATA_FITS,
    ("field-swap", 84): _DATA_FITS, ("field-swap", 214): _DATA_FITS, ("field-swap", 218): _DATA_FITS,
    ("field-swap", 62): _LOAD + "a Constant whose value is an empty list (fold_constants: exit 3)",
    ("field-swap", 127): _LOAD + "a Constant whose value is an empty list (fold_constants: exit 3)",
    ("field-swap", 124): _LOAD + "attribute types checked against the op schema (merge_concats: int() of a Graph, exit 3)",
    ("field-swap", 61): _LOAD + "size guards / --max-memory (760 MiB peak and over 10 s)",
}
for (family, k), reason in BENCH_MUTANTS.items():  # each reason is what was fixed for that mutant
    add(f"mutants/{family}/{k}", "mutants", _bench_mutant(family, k))
