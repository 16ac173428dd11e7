"""Small random models per dtype family for the differential fuzzer (graphpass/fuzzing.py).

Each example is a :class:`Case`: a model of a few nodes built from one template, the inputs it
is run on (special values mixed in), the storage form of its initializers and the passes to run
(the default pipeline, or a single registered pass). Templates:

  elementwise  unary/binary ops, operands of rank 0..6 broadcast both ways, constants 0/1/-0.0
  cast_pair    Cast T -> U -> T
  shapes       Transpose pairs, Reshape chains
  cse          the same op twice on the same operands
  concat       Concat of Concats
  loop         Loop: trip count only, cond only, both (cond false at entry, zero trips), with a
               loop-invariant op in the body (one that can fail: Cast from a string)
  if           If on a bool input or a constant, each branch reading outer values
  scan         Scan with a state, over a scan axis of length 0..3
  topk         TopK with k constant or a graph input, sorted 0/1, largest 0/1, ties, the values
               summed (lower_dynamic_topk's pattern)
  fusion       Conv + Add/Mul (operand rank up to 5), BatchNormalization (var + eps may be 0),
               Clip(0, 6), GELU's decomposition (exact and near-miss constants), LayerNorm's
               decomposition, MatMul + Add
  knowledge    issue 25's knowledges: Slice chains (merge_slices), an empty Slice into a Concat
               (eliminate_empty_slices), scalar-index Gathers (gather_to_split); reflect Pad (every dtype; pads by attribute,
               input or with axes), 1-D Conv chains, AveragePool over the AI Core window,
               a Conv kernel over 255, a Conv over an input W above 4096, Transpose-BN-Transpose;
               int64 index arithmetic on a symbolic batch (narrow_int64): Range + constants at the
               int32 edges, Less, read back through an Identity
Storage forms: inline, external data (tensors below and above 1 KiB), sparse initializer,
string initializer, int4/uint4 initializer (opset 21).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FAMILIES = ("float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "bool")
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64,
       "int8": np.int8, "int32": np.int32, "int64": np.int64, "bool": np.bool_}
_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
         "float64": TensorProto.DOUBLE, "int8": TensorProto.INT8, "int32": TensorProto.INT32,
         "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
TEMPLATES = ("elementwise", "cast_pair", "shapes", "cse", "concat", "loop", "if", "scan", "topk", "fusion", "knowledge")
STORAGE = ("inline", "external", "sparse", "string", "int4", "uint4")


@dataclasses.dataclass
class Case:
    family: str
    template: str
    storage: str
    opset: int
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    passes: list[str] | None  # None: the default pipeline

    def describe(self) -> str:
        run = "default pipeline" if self.passes is None else "pass " + ",".join(self.passes)
        return f"{self.family}/{self.template}/{self.storage}/opset{self.opset} ({run})"


def is_float(family: str) -> bool:
    return family in ("float32", "float16", "bfloat16", "float64")


def values(rng: np.random.Generator, family: str, shape, special: float, ties: bool = False) -> np.ndarray:
    """An array of ``family`` (bfloat16 as float32 holding bfloat16 values), with a fraction
    ``special`` of its elements replaced by the dtype's edge values."""
    shape = tuple(shape)
    n = int(np.prod(shape)) if shape else 1
    if family == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if is_float(family):
        dt = _NP[family]
        fi = ml_dtypes.finfo(dt) if family == "bfloat16" else np.finfo(dt)
        base = rng.choice([-1.0, 0.0, 0.5, 2.0], size=n) if ties else rng.standard_normal(n) * 2
        edges = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
                          float(fi.max) * 0.75, -float(fi.max), float(fi.max), 1.0, -1.0], np.float64)
        mask = rng.random(n) < special
        base = np.where(mask, edges[rng.integers(0, len(edges), n)], base)
        out = base.astype(dt)
        if family == "bfloat16":
            out = out.astype(np.float32)
        return out.reshape(shape)
    info = np.iinfo(_NP[family])
    base = rng.integers(-3, 4, size=n) if ties else rng.integers(-50, 51, size=n)
    edges = np.array([info.min, info.max, 0, -1, 1], np.int64)
    mask = rng.random(n) < special
    base = np.where(mask, edges[rng.integers(0, len(edges), n)], base)
    return base.astype(_NP[family]).reshape(shape)


class _Builder:
    def __init__(self, family: str, opset: int, rng: np.random.Generator, special: float):
        self.family, self.opset, self.rng, self.special = family, opset, rng, special
        self.t = _ONNX[family]
        self.io_t = TensorProto.FLOAT if family == "bfloat16" else self.t
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.sparse: list[onnx.SparseTensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.n = 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def node(self, op: str, ins, n_out: int = 1, **attrs) -> list[str]:
        outs = [self.name("t") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(ins), outs, **attrs))
        return outs

    def input(self, shape, ties: bool = False, family: str | None = None, elem: int | None = None,
              arr: np.ndarray | None = None) -> str:
        """A graph input of the family's dtype (bfloat16: a float32 input cast on entry)."""
        family = family or self.family
        nm = self.name("in")
        a = arr if arr is not None else values(self.rng, family, shape, self.special, ties)
        if elem is None:
            elem = TensorProto.FLOAT if family == "bfloat16" else _ONNX[family]
        self.inputs.append(helper.make_tensor_value_info(nm, elem, list(a.shape)))
        self.feeds[nm] = a
        if family == "bfloat16" and elem == TensorProto.FLOAT:
            return self.node("Cast", [nm], to=TensorProto.BFLOAT16)[0]
        return nm

    def const(self, arr: np.ndarray, family: str | None = None) -> str:
        family = family or self.family
        nm = self.name("c")
        if family == "bfloat16":
            t = helper.make_tensor(nm, TensorProto.BFLOAT16, list(arr.shape),
                                   np.asarray(arr, np.float32).astype(ml_dtypes.bfloat16).tobytes(), raw=True)
        else:
            t = numpy_helper.from_array(np.asarray(arr, _NP[family]), nm)
        self.inits.append(t)
        return nm

    def const_values(self, shape, ties: bool = False) -> str:
        return self.const(values(self.rng, self.family, shape, self.special, ties))

    def output(self, name: str, elem: int | None = None) -> None:
        """A graph output (bfloat16: cast back to float32 so onnxruntime's Python API can read it)."""
        elem = self.t if elem is None else elem
        if elem == TensorProto.BFLOAT16:
            name = self.node("Cast", [name], to=TensorProto.FLOAT)[0]
            elem = TensorProto.FLOAT
        self.outputs.append(helper.make_tensor_value_info(name, elem, None))

    def reduce(self, op: str, x: str, axes: list[int], keepdims: int = 0) -> str:
        since = 13 if op == "ReduceSum" else 18
        if self.opset >= since:
            return self.node(op, [x, self.const(np.array(axes, np.int64), "int64")], keepdims=keepdims)[0]
        return self.node(op, [x], axes=axes, keepdims=keepdims)[0]

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, self.outputs, initializer=self.inits,
                                  sparse_initializer=self.sparse)
        ops = [helper.make_opsetid("", self.opset)]
        m = helper.make_model(graph, opset_imports=ops)
        m.ir_version = max(helper.find_min_ir_version_for(ops), 7)
        try:  # the outputs' types as inference gives them (the full checker wants shapes)
            inferred = onnx.shape_inference.infer_shapes(m)
            known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
            for o in m.graph.output:
                vi = known.get(o.name)
                if vi is not None and vi.type.tensor_type.HasField("shape"):
                    o.type.CopyFrom(vi.type)
        except Exception:  # noqa: BLE001 - left to the checker, which reports it as a generator skip
            pass
        for o in m.graph.output:  # still unknown: rank-free shape
            if not o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.shape.SetInParent()
        return m


# ------------------------------------------------------------------------------------------
# templates: each gets (draw, st, builder) and adds nodes and outputs


def _bcast_shapes(draw, st):
    """Two broadcast-compatible shapes of rank 0..6 (either may have the higher rank)."""
    rank = draw(st.integers(0, 6))
    full = [draw(st.sampled_from([1, 2, 3])) for _ in range(rank)]
    if rank > 4:
        full = [min(d, 2) for d in full]
    other_rank = draw(st.integers(0, rank))
    other = [d if draw(st.booleans()) else 1 for d in full[rank - other_rank:]]
    return (full, other) if draw(st.booleans()) else (other, full)


def _unary_ops(family: str):
    if family == "bool":
        return ["Not", "Identity"]
    if is_float(family):
        return ["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Sqrt", "Exp", "Floor", "Identity", "Reciprocal"]
    return ["Neg", "Abs", "Identity", "Sign"]


def _binary_ops(family: str, opset: int = 21):
    if family == "bool":
        return ["And", "Or", "Xor", "Equal"]
    if is_float(family):
        return ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
    # no integer Div: a zero divisor kills onnxruntime; integer Max/Min since opset 12
    return ["Add", "Sub", "Mul"] + (["Max", "Min"] if opset >= 12 else [])


def t_elementwise(draw, st, b: _Builder):
    sa, sb = _bcast_shapes(draw, st)
    x = b.input(sa)
    cur = x
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            cur = b.node(draw(st.sampled_from(_unary_ops(b.family))), [cur])[0]
            continue
        op = draw(st.sampled_from(_binary_ops(b.family, b.opset)))
        kind = draw(st.sampled_from(["input", "const", "neutral"]))
        if kind == "input":
            other = b.input(sb)
        elif kind == "const" or b.family == "bool":
            other = b.const_values(sb)
        else:  # x+0, x-0, x*1, x/1, x+(-0.0): what algebraic simplifications look for
            neutral = {"Add": [0.0, -0.0], "Sub": [0.0, -0.0], "Mul": [1.0], "Div": [1.0], "Pow": [1.0],
                       "Max": [0.0], "Min": [0.0]}[op]
            v = draw(st.sampled_from(neutral))
            other = b.const(np.full(sb, v).astype(np.float32 if b.family == "bfloat16" else _NP[b.family]))
        ins = [cur, other] if draw(st.booleans()) or op in ("Sub", "Div", "Pow") else [other, cur]
        cur = b.node(op, ins)[0]
    if b.family != "bool" and draw(st.integers(0, 4)) == 0:
        mask = b.input(sa, family="bool")
        cur = b.node("Where", [mask, cur, b.const_values([])])[0]
    b.output(cur)


def t_cast_pair(draw, st, b: _Builder):
    x = b.input([draw(st.integers(0, 5))])
    mid = draw(st.sampled_from([f for f in FAMILIES if f != b.family]))
    y = b.node("Cast", [x], to=_ONNX[mid])[0]
    z = b.node("Cast", [y], to=b.t)[0]
    b.output(z)
    if draw(st.booleans()):
        b.output(y, _ONNX[mid])


def t_shapes(draw, st, b: _Builder):
    rank = draw(st.integers(1, 5))
    shape = [draw(st.sampled_from([1, 2, 3])) for _ in range(rank)]
    x = b.input(shape)
    if draw(st.booleans()):
        p1 = list(draw(st.permutations(list(range(rank)))))
        y = b.node("Transpose", [x], perm=p1)[0]
        p2 = list(draw(st.permutations(list(range(rank)))))
        z = b.node("Transpose", [y], perm=p2)[0]
    else:
        y = b.node("Reshape", [x, b.const(np.array([-1], np.int64), "int64")])[0]
        z = b.node("Reshape", [y, b.const(np.array(shape, np.int64), "int64")])[0]
        if draw(st.booleans()):
            z = b.node("Flatten", [z], axis=draw(st.integers(0, rank)))[0]
    b.output(z)


def t_cse(draw, st, b: _Builder):
    sa, sb = _bcast_shapes(draw, st)
    x = b.input(sa)
    c1 = b.const_values(sb)
    c2 = b.const(numpy_helper.to_array(b.inits[-1])) if draw(st.booleans()) else c1
    op = draw(st.sampled_from(_binary_ops(b.family, b.opset)))
    y1 = b.node(op, [x, c1])[0]
    y2 = b.node(op, [x, c2])[0]
    comb = "Or" if b.family == "bool" else "Add"
    b.output(b.node(comb, [y1, y2])[0])
    if draw(st.booleans()):
        b.output(y2)


def t_concat(draw, st, b: _Builder):
    axis = draw(st.integers(0, 1))
    xs = [b.input([draw(st.integers(0, 2)), 2]) if axis == 0 else b.input([2, draw(st.integers(0, 2))])
          for _ in range(3)]
    y = b.node("Concat", xs[:2], axis=axis)[0]
    z = b.node("Concat", [y, xs[2]], axis=axis)[0]
    b.output(z)


def t_loop(draw, st, b: _Builder):
    shape = [draw(st.integers(0, 3))]
    v0 = b.input(shape)
    outer = b.input(shape)
    mode = draw(st.sampled_from(["trip+cond", "trip", "cond"]))
    trips = draw(st.integers(0, 3))
    m_name = b.const(np.array(trips, np.int64), "int64") if mode != "cond" else ""
    cond_name = ""
    if mode != "trip":
        go = np.array(draw(st.booleans()))  # an input, or a constant (M=1 and true: inlined)
        cond_name = b.const(go, "bool") if draw(st.booleans()) else b.input([], family="bool", arr=go)
    vt = b.t
    body_nodes = []
    # the loop-invariant part: outer op outer (hoistable), or a Cast from a string input that
    # fails on non-numeric text (may only run when the loop runs)
    trap = b.family != "bool" and draw(st.integers(0, 3)) == 0
    if trap:
        text = draw(st.sampled_from(["1.5", "abc"]))
        s = b.name("str")
        b.inputs.append(helper.make_tensor_value_info(s, TensorProto.STRING, [1]))
        b.feeds[s] = np.array([text], dtype=object)
        body_nodes.append(helper.make_node("Cast", [s], ["inv"], to=vt))
    elif b.family == "bool":
        body_nodes.append(helper.make_node("Not", [outer], ["inv"]))
    else:
        body_nodes.append(helper.make_node(draw(st.sampled_from(["Add", "Mul"])), [outer, outer], ["inv"]))
    step = "Xor" if b.family == "bool" else draw(st.sampled_from(["Add", "Max" if b.opset >= 12 else "Sub"]))
    body_nodes.append(helper.make_node(step, ["v_in", "inv"], ["v_out"]))
    if mode == "cond":  # cond only: the body stops after the first iteration
        body_nodes.append(helper.make_node("Constant", [], ["cond_out"], value=helper.make_tensor("f", TensorProto.BOOL, [], [False])))
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, b.name("body"),
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", vt, shape)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", vt, shape)])
    y = b.node("Loop", [m_name, cond_name, v0], body=body)[0]
    b.output(y)


def t_if(draw, st, b: _Builder):
    shape = [draw(st.integers(0, 3))]
    x = b.input(shape)
    flag = np.array(draw(st.booleans()))
    # the condition an input, or a constant (inline_control_flow replaces the If by its branch)
    c = b.const(flag, "bool") if draw(st.booleans()) else b.input([], family="bool", arr=flag)
    un = _unary_ops(b.family)
    then_g = helper.make_graph([helper.make_node(draw(st.sampled_from(un)), [x], ["o1"])], b.name("then"), [],
                               [helper.make_tensor_value_info("o1", b.t, shape)])
    bin_op = draw(st.sampled_from(_binary_ops(b.family, b.opset)))
    k = b.const_values([])
    else_g = helper.make_graph([helper.make_node(bin_op, [x, k], ["o2"])], b.name("else"), [],
                               [helper.make_tensor_value_info("o2", b.t, shape)])
    y = b.node("If", [c], then_branch=then_g, else_branch=else_g)[0]
    b.output(y)


def t_scan(draw, st, b: _Builder):
    length, d = draw(st.integers(0, 3)), draw(st.integers(1, 3))
    s0 = b.input([d])
    xs = b.input([length, d])
    outer = b.const_values([d])
    step = "Xor" if b.family == "bool" else draw(st.sampled_from(["Add", "Sub", "Mul"]))
    body = helper.make_graph(
        [helper.make_node("Identity" if b.family == "bool" else "Abs", [outer], ["inv"]),
         helper.make_node(step, ["s_in", "x_in"], ["m"]),
         helper.make_node(step, ["m", "inv"], ["s_out"]),
         helper.make_node("Identity", ["m"], ["y_out"])],
        b.name("scan"),
        [helper.make_tensor_value_info("s_in", b.t, [d]), helper.make_tensor_value_info("x_in", b.t, [d])],
        [helper.make_tensor_value_info("s_out", b.t, [d]), helper.make_tensor_value_info("y_out", b.t, [d])])
    s, ys = b.node("Scan", [s0, xs], 2, body=body, num_scan_inputs=1)
    b.output(s)
    b.output(ys)


def t_topk(draw, st, b: _Builder):
    if b.family == "bool":
        return t_elementwise(draw, st, b)
    rows, m = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    x = b.input([rows, m], ties=draw(st.booleans()))
    k = draw(st.integers(0, m))
    if draw(st.booleans()):
        kk = b.input([1], family="int64", arr=np.array([k], np.int64))
    else:
        kk = b.const(np.array([k], np.int64), "int64")
    vals, idx = b.node("TopK", [x, kk], 2, axis=-1, largest=draw(st.integers(0, 1)), sorted=draw(st.integers(0, 1)))
    red = draw(st.sampled_from(["ReduceSum", "ReduceMean", "none"]))
    if red == "none" or (red == "ReduceMean" and k == 0):
        b.output(vals)
    else:
        b.output(b.reduce(red, vals, [1], keepdims=draw(st.integers(0, 1))))
    if draw(st.booleans()):
        b.output(idx, TensorProto.INT64)


_GELU = (0.5, 1.0, 1.4142135381698608)


def t_fusion(draw, st, b: _Builder):
    if not is_float(b.family):
        return t_elementwise(draw, st, b)
    kind = draw(st.sampled_from(["conv_add", "conv_mul", "bn", "relu6", "gelu", "layernorm", "matmul_add",
                                 *_TRANSFORMER_KINDS]))
    if kind in _TRANSFORMER_KINDS:
        return _t_transformer(draw, st, b, kind)
    c = draw(st.sampled_from([1, 2, 3]))
    if kind in ("conv_add", "conv_mul", "bn", "relu6"):
        x = b.input([1, c, 3, 3])
        w = b.const_values([c, c, 1, 1])
        y = b.node("Conv", [x, w], kernel_shape=[1, 1])[0]
        if kind in ("conv_add", "conv_mul"):
            rank = draw(st.integers(0, 5))
            shape = [1] * rank
            if rank >= 3:
                shape[rank - 3] = c
            operand = b.const_values(shape)
            y = b.node("Add" if kind == "conv_add" else "Mul", [y, operand])[0]
        elif kind == "bn":
            eps = draw(st.sampled_from([1e-5, 0.0]))
            var = np.abs(values(b.rng, b.family, [c], 0.0)).astype(np.float32)
            if draw(st.booleans()):
                var[0] = 0.0
            ps = [b.const_values([c]), b.const_values([c]), b.const_values([c]), b.const(var)]
            y = b.node("BatchNormalization", [y] + ps, epsilon=eps)[0]
        else:
            y = b.node("Clip", [y, b.const(np.array(0.0, np.float32)), b.const(np.array(6.0, np.float32))])[0]
        b.output(y)
        return
    if kind == "gelu":
        x = b.input([2, c])
        half, one, sqrt2 = _GELU
        if draw(st.booleans()):  # a near-miss constant: not GELU
            which = draw(st.integers(0, 2))
            vals = list(_GELU)
            vals[which] *= 1 + draw(st.sampled_from([1e-5, 5e-5, 1e-3]))
            half, one, sqrt2 = vals
        d = b.node("Div", [x, b.const(np.array(sqrt2, np.float32))])[0]
        e = b.node("Erf", [d])[0]
        a = b.node("Add", [e, b.const(np.array(one, np.float32))])[0]
        m = b.node("Mul", [x, a])[0]
        b.output(b.node("Mul", [m, b.const(np.array(half, np.float32))])[0])
        return
    if kind == "layernorm":
        x = b.input([2, c + 1])
        mean = b.reduce("ReduceMean", x, [-1], keepdims=1)
        dev = b.node("Sub", [x, mean])[0]
        sq = b.node("Pow", [dev, b.const(np.array(2.0, np.float32))])[0]
        var = b.reduce("ReduceMean", sq, [-1], keepdims=1)
        eps = b.node("Add", [var, b.const(np.array(draw(st.sampled_from([1e-5, 1e-12, 0.0])), np.float32))])[0]
        std = b.node("Sqrt", [eps])[0]
        y = b.node("Div", [dev, std])[0]
        y = b.node("Mul", [y, b.const_values([c + 1])])[0]
        b.output(b.node("Add", [y, b.const_values([c + 1])])[0])
        return
    x = b.input([2, c])
    mm = b.node("MatMul", [x, b.const_values([c, 3])])[0]
    b.output(b.node("Add", [mm, b.const_values([3])])[0])


#: issue 26's spellings: GELU's tanh form, LayerNorm's Mul(d, d), RMSNorm, rotate-half rotary, SwiGLU
_TRANSFORMER_KINDS = ("gelu_tanh", "layernorm_mul", "rmsnorm", "rotary", "swiglu")


def _t_transformer(draw, st, b: _Builder, kind: str) -> None:
    c = draw(st.sampled_from([1, 2, 3]))
    w = 2 * c
    if kind == "gelu_tanh":
        x = b.input([2, w])
        x3 = b.node("Pow", [x, b.const(np.array(3.0, np.float32))])[0]
        i = b.node("Add", [x, b.node("Mul", [x3, b.const(np.array(0.044715, np.float32))])[0]])[0]
        t = b.node("Tanh", [b.node("Mul", [i, b.const(np.array(0.7978845608028654, np.float32))])[0]])[0]
        a = b.node("Add", [t, b.const(np.array(1.0, np.float32))])[0]
        b.output(b.node("Mul", [b.node("Mul", [x, b.const(np.array(0.5, np.float32))])[0], a])[0])
    elif kind == "layernorm_mul":
        x = b.input([2, w + 1])
        dev = b.node("Sub", [x, b.reduce("ReduceMean", x, [-1], keepdims=1)])[0]
        var = b.reduce("ReduceMean", b.node("Mul", [dev, dev])[0], [-1], keepdims=1)
        std = b.node("Sqrt", [b.node("Add", [var, b.const(np.array(1e-5, np.float32))])[0]])[0]
        b.output(b.node("Mul", [b.node("Div", [dev, std])[0], b.const_values([w + 1])])[0])
    elif kind == "rmsnorm":
        x = b.input([2, 3, w])
        if draw(st.booleans()):  # a residual Add before it, read on
            x = b.node("Add", [x, b.input([2, 3, w])])[0]
            b.output(x)
        sq = b.node("Pow", [x, b.const(np.array(2.0, np.float32))])[0] if draw(st.booleans()) else b.node("Mul", [x, x])[0]
        ms = b.reduce("ReduceMean", sq, [-1], keepdims=1)
        r = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [ms, b.const(np.array(1e-6, np.float32))])[0]])[0]])[0]
        b.output(b.node("Mul", [b.const_values([w]), b.node("Mul", [x, r])[0]])[0])
    elif kind == "rotary":
        x = b.input([1, 2, 3, w])
        cos, sin = b.input([1, 1, 3, w]), b.input([1, 1, 3, w])
        ax, one = b.const(np.array([-1], np.int64), "int64"), b.const(np.array([1], np.int64), "int64")
        z, h, e = (b.const(np.array([v], np.int64), "int64") for v in (0, c, 2 ** 62))
        x1 = b.node("Slice", [x, z, h, ax, one])[0]
        x2 = b.node("Slice", [x, h, e, ax, one])[0]
        rot = b.node("Concat", [b.node("Neg", [x2])[0], x1], axis=-1)[0]
        b.output(b.node("Add", [b.node("Mul", [x, cos])[0], b.node("Mul", [rot, sin])[0]])[0])
    else:  # swiglu: two MatMuls of one input
        x = b.input([2, 3, w])
        g = b.node("MatMul", [x, b.const_values([w, c])])[0]
        u = b.node("MatMul", [x, b.const_values([w, c])])[0]
        b.output(b.node("Mul", [b.node("Mul", [g, b.node("Sigmoid", [g])[0]])[0], u])[0])
def t_knowledge(draw, st, b: _Builder):
    """Issue 25's conv/pool knowledges (the float ones where onnxruntime has float kernels)."""
    kinds = ["reflect_pad", "slice_chain", "empty_slice", "gathers", "int64_index"]
    if b.family in ("float32", "float16"):
        kinds += ["conv1d", "avgpool"]
    if b.family == "float32":
        kinds += ["large_kernel", "wide_conv", "transposed_bn"]
    kind = draw(st.sampled_from(kinds))
    if kind == "reflect_pad":
        x = b.input([1, 2, 4, 5])
        pads = [0, 0, draw(st.integers(0, 3)), draw(st.integers(0, 4)), 0, 0, draw(st.integers(0, 3)), draw(st.integers(0, 4))]
        if b.opset >= 18 and draw(st.booleans()):
            y = b.node("Pad", [x, b.const(np.array(pads[2:4] + pads[6:8], np.int64), "int64"), "",
                               b.const(np.array([-2, 3], np.int64), "int64")], mode="reflect")[0]
        else:
            y = b.node("Pad", [x, b.const(np.array(pads, np.int64), "int64")], mode="reflect")[0]
        b.output(y)
    elif kind == "slice_chain":  # merge_slices: two or three Slices, shared and disjoint axes, any step
        x = b.input([3, 7])
        y = x
        for _ in range(draw(st.integers(2, 3))):
            axis = draw(st.sampled_from([0, 1, -1]))
            bound = st.sampled_from([0, 1, 2, -1, -3, 5, 9, -9, 2**63 - 1, -2**63])
            step = draw(st.sampled_from([1, 2, -1, -2]))
            ins = [y, b.const(np.array([draw(bound)], np.int64), "int64"), b.const(np.array([draw(bound)], np.int64), "int64"),
                   b.const(np.array([axis], np.int64), "int64"), b.const(np.array([step], np.int64), "int64")]
            y = b.node("Slice", ins)[0]
        b.output(y)
    elif kind == "empty_slice":  # eliminate_empty_slices: an empty Concat input dropped
        x = b.input([2, 4])
        s0 = draw(st.sampled_from([0, 1, 3, -1]))
        e = b.node("Slice", [x, b.const(np.array([s0], np.int64), "int64"), b.const(np.array([s0], np.int64), "int64"),
                             b.const(np.array([1], np.int64), "int64")])[0]
        b.output(b.node("Concat", [x, e, x] if draw(st.booleans()) else [e, x], axis=1)[0])
    elif kind == "gathers":  # gather_to_split: scalar-index Gathers of one tensor along one axis
        x = b.input([2, 3, 4])
        axis = draw(st.sampled_from([0, 1, 2, -1]))
        dim = [2, 3, 4][axis]
        for i in draw(st.lists(st.integers(-dim, dim - 1), min_size=2, max_size=4)):
            b.output(b.node("Gather", [x, b.const(np.array(i, np.int64), "int64")], axis=axis)[0])
    elif kind == "int64_index":  # narrow_int64: a Range over a symbolic batch, constants at the int32 edges
        x = b.input([draw(st.integers(0, 3)), 64])  # 64 wide: batch <= 2**35 / 64 (910A, 1-byte types too)
        dim = b.inputs[-1].type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"  # static, the whole chain would be folded before narrow_int64 runs
        n = b.node("Gather", [b.node("Shape", [x])[0], b.const(np.array(0, np.int64), "int64")], axis=0)[0]
        r = b.node("Range", [b.const(np.array(0, np.int64), "int64"), n, b.const(np.array(1, np.int64), "int64")])[0]
        edge = st.sampled_from([0, 7, 2**31 - 1, 2**31 - 4, 2**31, -2**31, -2**31 - 1, 2**30, 2**62, -2**63])
        op = draw(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min"]))
        v = b.node(op, [r, b.const(np.array(draw(edge), np.int64), "int64")])[0]
        b.output(b.node("Less", [v, b.const(np.array(draw(edge), np.int64), "int64")])[0], TensorProto.BOOL)
        b.output(b.node("Identity", [v])[0], TensorProto.INT64)
    elif kind == "conv1d":
        c = draw(st.sampled_from([1, 2, 3]))
        x = b.input([1, c, 7])
        y = b.node("Conv", [x, b.const_values([c, c, 3])], pads=[1, 1])[0]
        y = b.node(draw(st.sampled_from(["Relu", "Sigmoid", "Neg"])), [y])[0]
        b.output(b.node("Conv", [y, b.const_values([2, c, 1])], strides=[draw(st.sampled_from([1, 2]))])[0])
    elif kind == "avgpool":
        x = b.input([1, 1, 18, 19])
        b.output(b.node("AveragePool", [x], kernel_shape=[16, 17], strides=[draw(st.sampled_from([1, 2, 16])), 1],
                        pads=draw(st.sampled_from([[0, 0, 0, 0], [1, 2, 0, 1]])), ceil_mode=draw(st.integers(0, 1)),
                        count_include_pad=draw(st.integers(0, 1)))[0])
    elif kind == "large_kernel":
        x = b.input([1, 1, 2, 300])
        w = values(b.rng, "float32", [2, 1, 1, 260], 0.0) * np.float32(0.05)
        b.output(b.node("Conv", [x, b.const(w)], pads=[0, draw(st.integers(0, 130)), 0, draw(st.integers(0, 130))])[0])
    elif kind == "wide_conv":
        x = b.input([1, 1, 1, 4100])
        b.output(b.node("Conv", [x, b.const_values([2, 1, 1, 3])], pads=[0, 1, 0, 1])[0])
    else:
        x = b.input([2, 4, 3])
        t = b.node("Transpose", [x], perm=[0, 2, 1])[0]
        var = (np.abs(values(b.rng, "float32", [3], 0.0)) + 0.1).astype(np.float32)
        bn = b.node("BatchNormalization", [t, b.const_values([3]), b.const_values([3]), b.const_values([3]), b.const(var)])[0]
        b.output(b.node("Transpose", [bn], perm=[0, 2, 1])[0])


_TEMPLATE_FNS = {"elementwise": t_elementwise, "cast_pair": t_cast_pair, "shapes": t_shapes, "cse": t_cse,
                 "concat": t_concat, "loop": t_loop, "if": t_if, "scan": t_scan, "topk": t_topk,
                 "fusion": t_fusion, "knowledge": t_knowledge}


def _apply_storage(draw, st, b: _Builder, storage: str) -> None:
    """Adds what the storage form needs (a side computation reading the stored tensor)."""
    if storage == "external":
        # one tensor below and one above 1 KiB (the 1 KiB external-data threshold)
        fam = "float32" if b.family in ("bfloat16", "bool") else b.family
        item = np.dtype(_NP[fam]).itemsize
        for nbytes in (draw(st.sampled_from([8, 512, 1024])), draw(st.sampled_from([1028, 4096]))):
            n = max(1, nbytes // item)
            e = b.input([n], family=fam)
            c = b.const(values(b.rng, fam, [n], 0.0), fam)
            b.output(b.node("Add", [e, c])[0], _ONNX[fam])
    elif storage == "sparse":
        fam = "float32" if b.family in ("bfloat16", "bool") else b.family
        n = draw(st.integers(2, 8))
        dense = np.zeros(n, _NP[fam])
        idx = np.array(sorted(set(int(i) for i in b.rng.integers(0, n, 2))), np.int64)
        dense[idx] = values(b.rng, fam, [len(idx)], 0.0)
        nm = b.name("sp")
        b.sparse.append(helper.make_sparse_tensor(numpy_helper.from_array(dense[idx], nm),
                                                  numpy_helper.from_array(idx, nm + "_idx"), [n]))
        e = b.input([n], family=fam)
        b.output(b.node("Add", [e, nm])[0], _ONNX[fam])
    elif storage == "string":
        nm = b.name("s")
        b.inits.append(helper.make_tensor(nm, TensorProto.STRING, [2], [b"a", b"bc"]))
        b.output(b.node("Identity", [nm])[0], TensorProto.STRING)
    elif storage in ("int4", "uint4"):
        lo, hi = (-8, 7) if storage == "int4" else (0, 15)
        n = draw(st.integers(1, 5))
        vals = b.rng.integers(lo, hi + 1, n)
        nm = b.name("q")
        b.inits.append(helper.make_tensor(nm, TensorProto.INT4 if storage == "int4" else TensorProto.UINT4, [n],
                                          vals.tolist()))
        e = b.input([n], family="float32")
        y = b.node("Cast", [nm], to=TensorProto.FLOAT)[0]
        b.output(b.node("Add", [e, y])[0], TensorProto.FLOAT)


def cases(family: str, pass_names: list[str]):
    """The hypothesis strategy of :class:`Case` for one dtype family."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw) -> Case:
        template = draw(st.sampled_from(TEMPLATES))
        storage = draw(st.sampled_from(STORAGE)) if draw(st.integers(0, 2)) == 0 else "inline"
        low = 13 if family == "bfloat16" else 11
        opset = 21 if storage in ("int4", "uint4") else draw(st.integers(low, 21))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        special = draw(st.sampled_from([0.0, 0.1, 0.3, 1.0]))
        b = _Builder(family, opset, rng, special)
        _TEMPLATE_FNS[template](draw, st, b)
        _apply_storage(draw, st, b, storage)
        passes = None if draw(st.booleans()) else [draw(st.sampled_from(pass_names))]
        return Case(family, template, storage, opset, b.model(), b.feeds, passes)

    return build()
