"""A review corpus for ``graphpass diff``: pairs of models that differ in one known way, and pairs
that are the same model stored differently.

Each case is ``Case(name, build, same)``; ``build(folder)`` writes ``before/before.onnx`` and
``after/after.onnx`` (and their external data, if any) into ``folder`` and returns the two paths.
Each model is written to its own subfolder (``before/``, ``after/``) so both may name their
external data file alike. ``same`` is True when the two compute and store the same values (only storage or order differ):
``graphpass diff --exit-code`` must give 0 on those and 1 on every other.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphpass.testing import make_model

__all__ = ["Case", "CASES", "DIFFERENT", "SAME", "feeds_for"]

RNG = np.random.default_rng(17)
W = RNG.standard_normal((8, 8)).astype(np.float32)
W2 = RNG.standard_normal((8, 8)).astype(np.float32)
B = RNG.standard_normal((8,)).astype(np.float32)
#: A 5 MiB MatMul weight: above the 4 MiB the diff once sampled instead of hashing.
BIG = RNG.standard_normal((1024, 1280)).astype(np.float32)
CONV_W = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)
GEMM_W = RNG.standard_normal((16, 3)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], tuple[Path, Path]]
    same: bool

    def __repr__(self) -> str:  # pytest ids
        return self.name


def _save(model: onnx.ModelProto, path: Path, external: str | None = None) -> Path:
    model = _copy(model)  # onnx.save_model converts the proto it is given to external data
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external, size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def _pair(a: onnx.ModelProto, b: onnx.ModelProto, ext_a: str | None = None, ext_b: str | None = None):
    def build(folder: Path) -> tuple[Path, Path]:
        (folder / "before").mkdir(exist_ok=True)
        (folder / "after").mkdir(exist_ok=True)
        return _save(a, folder / "before" / "before.onnx", ext_a), _save(b, folder / "after" / "after.onnx", ext_b)
    return build


def _copy(m: onnx.ModelProto) -> onnx.ModelProto:
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def _init(m: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in m.graph.initializer if t.name == name)


# -- base models -------------------------------------------------------------------------------

def mlp(w=W, b=B, *, x_shape=(2, 8), opset=17, alpha=None) -> onnx.ModelProto:
    """y = LeakyRelu(x @ w + b)."""
    kw = {} if alpha is None else {"alpha": alpha}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["pre"], name="add"),
             helper.make_node("LeakyRelu", ["pre"], ["y"], name="act", **kw)]
    return make_model(nodes, {"x": list(x_shape)}, {"y": [x_shape[0], 8]}, initializers={"w": w, "b": b}, opset=opset)


def big_matmul(w=BIG) -> onnx.ModelProto:
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [1, 1024]}, {"y": [1, 1280]},
                      initializers={"w": w})


def two_outputs(first="Relu", second="Sigmoid") -> onnx.ModelProto:
    nodes = [helper.make_node(first, ["x"], ["y1"]), helper.make_node(second, ["x"], ["y2"])]
    return make_model(nodes, {"x": [2, 4]}, {"y1": [2, 4], "y2": [2, 4]})


def two_heads(w1=W, w2=W2) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("MatMul", ["x", "w2"], ["h2"])]
    return make_model(nodes, {"x": [2, 8]}, {"h1": [2, 8], "h2": [2, 8]}, initializers={"w1": w1, "w2": w2})


def with_function(body_op="Relu", names=("a", "t", "o")) -> onnx.ModelProto:
    """A graphpass.ascend device op defined by a model-local function (as ``--emit device`` keeps it);
    ``names``: the body's parameter and tensor names (private to it)."""
    a, t, o = names
    f = helper.make_function("graphpass.ascend", "FusedAct", [a], [o],
                             [helper.make_node("Neg", [a], [t]), helper.make_node(body_op, [t], [o])],
                             [helper.make_opsetid("", 17)])
    return make_model([helper.make_node("FusedAct", ["x"], ["y"], domain="graphpass.ascend")], {"x": [2, 4]},
                      {"y": [2, 4]}, functions=[f], extra_opsets={"graphpass.ascend": 1})


def with_if(then_op="Relu") -> onnx.ModelProto:
    then_g = helper.make_graph([helper.make_node(then_op, ["x"], ["o1"])], "then", [],
                               [helper.make_tensor_value_info("o1", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2])])
    return make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                      {"c": (TensorProto.BOOL, []), "x": [2]}, {"y": [2]})


def with_loop(body_op="Add") -> onnx.ModelProto:
    """y = x (op) 1 applied 3 times in a Loop body."""
    one = numpy_helper.from_array(np.ones(2, np.float32), "one")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node(body_op, ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])], initializer=[one])
    return make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], {"n": (TensorProto.INT64, []), "x": [2]},
                      {"y": [2]})


def split(n_out: int) -> onnx.ModelProto:
    """Split without a split input: equal parts, as many as outputs; no output shapes declared."""
    outs = [f"s{i}" for i in range(n_out)]
    nodes = [helper.make_node("Split", ["x"], outs, axis=0)]
    return make_model(nodes, {"x": [6]}, {"s0": (TensorProto.FLOAT, None), "s1": (TensorProto.FLOAT, None)}, opset=13)


def with_constant(value: float = 2.0) -> onnx.ModelProto:
    c = helper.make_tensor("c", TensorProto.FLOAT, [4], [value] * 4)
    nodes = [helper.make_node("Constant", [], ["k"], value=c), helper.make_node("Mul", ["x", "k"], ["y"])]
    return make_model(nodes, {"x": [4]}, {"y": [4]})


def with_cast_weight(dtype=np.float32) -> onnx.ModelProto:
    nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "wf"], ["y"])]
    return make_model(nodes, {"x": [8]}, {"y": [8]}, initializers={"w": B.astype(dtype)})


def sub(order=("x", "z")) -> onnx.ModelProto:
    return make_model([helper.make_node("Sub", list(order), ["y"])], {"x": [4], "z": [4]}, {"y": [4]})


def add_mul(swap: bool) -> onnx.ModelProto:
    def ops(a, b):
        return [b, a] if swap else [a, b]
    nodes = [helper.make_node("Add", ops("x", "b"), ["s"]), helper.make_node("Mul", ops("s", "x"), ["p"]),
             helper.make_node("Sub", ["p", "s"], ["y"])]
    return make_model(nodes, {"x": [8]}, {"y": [8]}, initializers={"b": B})


def branches(order: tuple[int, ...]) -> onnx.ModelProto:
    """Two independent chains joined at the end; ``order`` permutes the first four nodes (all
    topological orders of the same graph)."""
    chain = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Neg", ["r1"], ["r2"]),
             helper.make_node("Sigmoid", ["x"], ["g1"]), helper.make_node("Exp", ["g1"], ["g2"])]
    nodes = [chain[i] for i in order] + [helper.make_node("Sub", ["r2", "g2"], ["y"])]
    return make_model(nodes, {"x": [4]}, {"y": [4]})


def conv(explicit_defaults: bool) -> onnx.ModelProto:
    kw = dict(auto_pad="NOTSET", group=1) if explicit_defaults else {}
    gkw = dict(alpha=1.0, beta=1.0, transA=0, transB=0) if explicit_defaults else {}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], **kw),
             helper.make_node("Flatten", ["c"], ["f"], **({"axis": 1} if explicit_defaults else {})),
             helper.make_node("Gemm", ["f", "g"], ["y"], **gkw)]
    return make_model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 3]}, initializers={"w": CONV_W, "g": GEMM_W})


# -- variants ----------------------------------------------------------------------------------

def _as_typed_fields(m: onnx.ModelProto) -> onnx.ModelProto:
    """Every initializer's values moved from raw_data to float_data / int32_data / int64_data."""
    c = _copy(m)
    for t in c.graph.initializer:
        arr = numpy_helper.to_array(t)
        new = helper.make_tensor(t.name, t.data_type, list(t.dims), arr.ravel().tolist(), raw=False)
        t.CopyFrom(new)
    return c


def _stripped(m: onnx.ModelProto) -> onnx.ModelProto:
    """Node names removed and every internal tensor renamed."""
    c = _copy(m)
    io = {v.name for v in c.graph.input} | {v.name for v in c.graph.output} | {t.name for t in c.graph.initializer}
    rename = {}
    for n in c.graph.node:
        n.name = ""
        for i, o in enumerate(n.output):
            if o not in io:
                rename[o] = f"t{len(rename)}_{o[::-1]}"
                n.output[i] = rename[o]
    for n in c.graph.node:
        for i, t in enumerate(n.input):
            n.input[i] = rename.get(t, t)
    return c


def _renamed_weights(m: onnx.ModelProto) -> onnx.ModelProto:
    c = _copy(m)
    names = {t.name: f"param_{k}" for k, t in enumerate(c.graph.initializer)}
    for t in c.graph.initializer:
        t.name = names[t.name]
    for n in c.graph.node:
        for i, t in enumerate(n.input):
            n.input[i] = names.get(t, t)
    return c


def _rename_io(m: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    c = _copy(m)
    for v in list(c.graph.input) + list(c.graph.output):
        if v.name == old:
            v.name = new
    for n in c.graph.node:
        for i, t in enumerate(n.input):
            if t == old:
                n.input[i] = new
        for i, t in enumerate(n.output):
            if t == old:
                n.output[i] = new
    return c


def _extra_output(m: onnx.ModelProto) -> onnx.ModelProto:
    c = _copy(m)
    c.graph.output.append(helper.make_tensor_value_info("mm", TensorProto.FLOAT, [2, 8]))
    return c


def _outputs_reversed(m: onnx.ModelProto) -> onnx.ModelProto:
    c = _copy(m)
    outs = list(c.graph.output)[::-1]
    del c.graph.output[:]
    c.graph.output.extend(outs)
    return c


def _one_value(arr: np.ndarray, delta: float, index=0) -> np.ndarray:
    out = arr.copy()
    out.flat[index] += delta
    return out


def _negative_zero() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    b0 = B.copy()
    b0[3] = 0.0
    b1 = b0.copy()
    b1[3] = -0.0
    return mlp(b=b0), mlp(b=b1)


def _nan_weights() -> onnx.ModelProto:
    b = B.copy()
    b[[1, 5]] = np.nan
    b[2] = -np.inf
    return mlp(b=b)


def _fp16_int64() -> onnx.ModelProto:
    """Weights of other dtypes: float16 (int32_data holds its bits when not raw) and int64."""
    nodes = [helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "hf"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["y"])]
    return make_model(nodes, {"x": [8]}, {"y": [2, 4]},
                      initializers={"h": B.astype(np.float16), "shape": np.array([2, 4], np.int64)})


def _pairs() -> list[Case]:
    nz_a, nz_b = _negative_zero()
    cases = [
        # differ: weights
        Case("external_value_changed", _pair(mlp(), mlp(w=_one_value(W, 0.5, 9)), "w.bin", "w.bin"), False),
        Case("big_weight_one_value_changed", _pair(big_matmul(), big_matmul(_one_value(BIG, 1000.0, 654_321))), False),
        Case("big_weight_external_one_value_changed",
             _pair(big_matmul(), big_matmul(_one_value(BIG, 1000.0, 1_300_000)), "w.bin", "w.bin"), False),
        Case("weight_sign_of_zero_changed", _pair(nz_a, nz_b), False),
        Case("initializer_dtype_changed", _pair(with_cast_weight(np.float32), with_cast_weight(np.float64)), False),
        Case("constant_value_changed", _pair(with_constant(2.0), with_constant(3.0)), False),
        # differ: graph interface
        Case("input_shape_changed", _pair(mlp(), mlp(x_shape=(4, 8))), False),
        Case("input_renamed", _pair(mlp(), _rename_io(mlp(), "x", "x2")), False),
        Case("output_renamed", _pair(mlp(), _rename_io(mlp(), "y", "y_out")), False),
        Case("extra_output", _pair(mlp(), _extra_output(mlp())), False),
        Case("outputs_swapped", _pair(two_outputs("Relu", "Sigmoid"), two_outputs("Sigmoid", "Relu")), False),
        Case("heads_swapped", _pair(two_heads(W, W2), two_heads(W2, W)), False),
        Case("outputs_reordered", _pair(two_outputs(), _outputs_reversed(two_outputs())), False),
        # differ: nodes, attributes, opsets, bodies
        Case("attribute_changed", _pair(mlp(alpha=0.01), mlp(alpha=0.02)), False),
        Case("opset_changed", _pair(mlp(opset=17), mlp(opset=18)), False),
        Case("split_arity_changed", _pair(split(2), split(3)), False),
        Case("non_commutative_operands_swapped", _pair(sub(("x", "z")), sub(("z", "x"))), False),
        Case("function_body_changed", _pair(with_function("Relu"), with_function("Sigmoid")), False),
        Case("if_body_changed", _pair(with_if("Relu"), with_if("Sigmoid")), False),
        Case("loop_body_changed", _pair(with_loop("Add"), with_loop("Sub")), False),
        # same model, stored differently
        Case("inline_vs_external", _pair(mlp(), mlp(), None, "w.bin"), True),
        Case("external_other_layout", _pair(mlp(), _renamed_weights(mlp()), "a.bin", "other.data"), True),
        Case("big_weight_inline_vs_external", _pair(big_matmul(), big_matmul(), None, "big.bin"), True),
        Case("raw_vs_typed_fields", _pair(mlp(), _as_typed_fields(mlp())), True),
        Case("fp16_int64_raw_vs_typed_fields", _pair(_fp16_int64(), _as_typed_fields(_fp16_int64())), True),
        Case("nan_weights_raw_vs_typed_fields", _pair(_nan_weights(), _as_typed_fields(_nan_weights())), True),
        Case("names_stripped", _pair(mlp(), _stripped(mlp())), True),
        Case("weights_renamed", _pair(two_heads(), _renamed_weights(two_heads())), True),
        Case("default_attributes_explicit", _pair(conv(False), conv(True)), True),
        Case("leakyrelu_default_alpha_explicit", _pair(mlp(), mlp(alpha=0.01)), True),
        Case("commutative_operands_swapped", _pair(add_mul(False), add_mul(True)), True),
        Case("node_order_shuffled", _pair(branches((0, 1, 2, 3)), branches((2, 0, 3, 1))), True),
        Case("function_body_names_differ", _pair(with_function("Relu"), with_function("Relu", ("p", "q", "r"))), True),
        Case("identical_subgraphs", _pair(with_if("Relu"), with_if("Relu")), True),
    ]
    return cases


CASES = _pairs()
DIFFERENT = [c for c in CASES if not c.same]
SAME = [c for c in CASES if c.same]


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for a corpus model's inputs (bool and int64 inputs get small fixed values)."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if tt.elem_type == TensorProto.BOOL:
            out[vi.name] = np.array(True)
        elif tt.elem_type == TensorProto.INT64:
            out[vi.name] = np.array(3, np.int64)
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out
