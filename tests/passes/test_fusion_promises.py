"""Every fusion keeps the promise it declares, on special values (issue 16).

Each case is a tiny graph a fusion fires on. Inputs hold NaN, ±inf, -0.0, subnormals and values
near float32's max among ordinary ones; onnxruntime (ORT_DISABLE_ALL) runs the graph before and
after. An exact pass must give the same bits (NaN payloads aside); a tolerance pass the same
NaN positions, the same infs with their signs, and finite values within its tolerance.
"""

import math

import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass import passes
from graphpass.passes.framework.pass_base import Promise
from graphpass.testing import check_full, make_model, ort_run

RNG = np.random.default_rng(16)
F32_MAX = float(np.finfo(np.float32).max)


def _x(shape, large=True, seed=0):
    """Ordinary values with the special ones spread over the tensor."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    special = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-42] + ([F32_MAX * 0.9, -F32_MAX * 0.5] if large else [])
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 3 * len(special)), replace=False)
    for k, i in enumerate(idx):
        flat[i] = special[k % len(special)]
    return x


def assert_keeps(promise: Promise, ref: np.ndarray, got: np.ndarray, what: str):
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN positions differ"
    if promise.exact:
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[ref.dtype.itemsize]
        assert np.array_equal(got[~nan].view(bits), ref[~nan].view(bits)), f"{what}: not bit for bit"
        return
    inf = np.isinf(ref)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], ref[inf]), f"{what}: inf positions/signs differ"
    fin = ~nan & ~inf
    np.testing.assert_allclose(got[fin], ref[fin], rtol=promise.rtol, atol=promise.atol, err_msg=what)


def _bn_params(c, gamma=None, var=None):
    return {"s": (RNG.uniform(0.5, 1.5, c) if gamma is None else gamma).astype(np.float32),
            "bb": RNG.standard_normal(c).astype(np.float32), "mu": RNG.standard_normal(c).astype(np.float32),
            "var": (RNG.uniform(0.5, 1.5, c) if var is None else var).astype(np.float32)}


def conv_bn(gamma=None, var=None, eps=1e-5):
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": RNG.standard_normal(4).astype(np.float32),
             **_bn_params(4, gamma, var)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["y"], epsilon=eps)]
    return make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]}, initializers=inits)


def gemm_bn():
    inits = {"w": RNG.standard_normal((5, 4)).astype(np.float32), "b": RNG.standard_normal(4).astype(np.float32),
             **_bn_params(4)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
             helper.make_node("BatchNormalization", ["g", "s", "bb", "mu", "var"], ["y"])]
    return make_model(nodes, {"x": [3, 5]}, {"y": [3, 4]}, initializers=inits)


def conv_then(op, operand, bias=True):
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "k": operand.astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c", "k"], ["y"])]
    return make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]}, initializers=inits)


def bn_then(op, operand):
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "mu", "var"], ["c"]),
             helper.make_node(op, ["c", "k"], ["y"])]
    return make_model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5]},
                      initializers={**_bn_params(4), "k": operand.astype(np.float32)})


def conv_act(act, bias=False):
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1])
    tail = {"Relu": [helper.make_node("Relu", ["c"], ["y"])],
            "Relu6": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
            "LeakyRelu": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
            "HardSwish": [helper.make_node("HardSwish", ["c"], ["y"])],
            "SiLU": [helper.make_node("Sigmoid", ["c"], ["sg"]), helper.make_node("Mul", ["c", "sg"], ["y"])]}[act]
    return make_model([conv] + tail, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]}, initializers=inits)


def matmul_add(c_shape):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "c"], ["y"])]
    return make_model(nodes, {"x": [4, 5]}, {"y": [4, 7]},
                      initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32),
                                    "c": RNG.standard_normal(c_shape).astype(np.float32)})


def gelu(opset):
    inits = {"k": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Div", ["x", "k"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return make_model(nodes, {"x": [4, 16]}, {"y": [4, 16]}, initializers=inits, opset=opset)


def layer_norm(opset):
    inits = {"two": np.array(2, np.float32), "eps": np.array(1e-5, np.float32),
             "g": RNG.uniform(0.5, 1.5, 8).astype(np.float32), "be": RNG.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ns"]),
             helper.make_node("Add", ["ns", "be"], ["y"])]
    return make_model(nodes, {"x": [6, 8]}, {"y": [6, 8]}, initializers=inits, opset=opset)


def pad_conv():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 4, 7, 8]},
                      initializers={"pads": np.array([0, 0, 1, 2, 0, 0, 0, 0], np.int64),
                                    "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)})


def concat_chain():
    nodes = [helper.make_node("Concat", ["x", "x2"], ["ab"], axis=1), helper.make_node("Concat", ["ab", "x"], ["y"], axis=1)]
    return make_model(nodes, {"x": [2, 3, 4], "x2": [2, 2, 4]}, {"y": [2, 8, 4]})


def channel_shuffle():
    return make_model([helper.make_node("Reshape", ["x", "s1"], ["r"]),
                       helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
                       helper.make_node("Reshape", ["t", "s2"], ["y"])],
                      {"x": [2, 12, 5, 5]}, {"y": [2, 12, 5, 5]},
                      initializers={"s1": np.array([2, 3, 4, 5, 5], np.int64), "s2": np.array([2, -1, 5, 5], np.int64)})


def gather_split():
    return make_model([helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
                       helper.make_node("Split", ["g", "sizes"], ["y0", "y1"], axis=1)],
                      {"x": [2, 6, 3, 3]}, {"y0": [2, 3, 3, 3], "y1": [2, 3, 3, 3]},
                      initializers={"idx": np.array([5, 0, 4, 1, 3, 2], np.int64), "sizes": np.array([3, 3], np.int64)})


def attention(scale):
    """torch's SDPA export over BNSD q, k, v (values near float32's max overflow the scores)."""
    inits = {"s": np.float32(math.sqrt(0.25)), "z": np.zeros((1,), np.float32), "c": np.float32(8.0)}
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    if scale == "sdpa":
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt", "s"], ["kts"]),
                  helper.make_node("MatMul", ["qs", "kts"], ["sc"])]
    else:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Div", ["s0", "c"], ["sc"])]
    nodes += [helper.make_node("Softmax", ["sc"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["n"]),
              helper.make_node("Where", ["n", "z", "p"], ["pg"]), helper.make_node("MatMul", ["pg", "v"], ["y"])]
    shape = [1, 2, 3, 4]
    return make_model(nodes, {"q": shape, "k": shape, "v": shape}, {"y": shape}, initializers=inits, opset=18)


def _pass_class(name):
    from graphpass.passes.framework.registry import get_pass
    return get_pass(name)


# (pass, model builder, feed values near float32's max?) -- not for the four cases in OVERFLOW
# below, where those overflow an intermediate of the original (see the test there).
CASES = {
    "fold_batchnorm/conv": ("fold_batchnorm", conv_bn, False),
    "fold_batchnorm/gamma0": ("fold_batchnorm", lambda: conv_bn(gamma=np.array([0, 1, -0.0, 2])), False),
    "fold_batchnorm/gemm": ("fold_batchnorm", gemm_bn, True),
    "fuse_conv_scale/conv": ("fuse_conv_scale", lambda: conv_then("Mul", RNG.uniform(-2, 2, (1, 4, 1, 1))), False),
    "fuse_conv_scale/zero": ("fuse_conv_scale", lambda: conv_then("Mul", np.array([0, -0.0, 1, -1])[:, None, None]), False),
    "fuse_conv_scale/bn": ("fuse_conv_scale", lambda: bn_then("Mul", RNG.uniform(-2, 2, (4, 1, 1))), False),
    "fuse_conv_bias/conv": ("fuse_conv_bias", lambda: conv_then("Add", RNG.standard_normal((4, 1, 1))), True),
    "fuse_conv_bias/nobias": ("fuse_conv_bias", lambda: conv_then("Add", np.array([-0.0, 0.0, 1, -1])[:, None, None], False), True),
    "fuse_conv_bias/bn": ("fuse_conv_bias", lambda: bn_then("Add", RNG.standard_normal((4, 1, 1))), True),
    "fuse_matmul_add/row": ("fuse_matmul_add", lambda: matmul_add((7,)), True),
    "fuse_matmul_add/full": ("fuse_matmul_add", lambda: matmul_add((4, 7)), True),
    "fuse_gelu/op": ("fuse_gelu", lambda: gelu(20), False),
    "fuse_gelu/device": ("fuse_gelu", lambda: gelu(13), True),
    "fuse_layer_norm/op": ("fuse_layer_norm", lambda: layer_norm(17), False),
    "fuse_layer_norm/device": ("fuse_layer_norm", lambda: layer_norm(13), True),
    "fold_pad": ("fold_pad", pad_conv, True),
    "merge_concats": ("merge_concats", concat_chain, True),
    "fuse_channel_shuffle": ("fuse_channel_shuffle", channel_shuffle, True),
    "fuse_gather_split": ("fuse_gather_split", gather_split, True),
    "fuse_attention/sdpa": ("fuse_attention", lambda: attention("sdpa"), True),
    "fuse_attention/div": ("fuse_attention", lambda: attention("div"), True),
}
CASES.update({f"fuse_conv_activation/{a}{'+b' if b else ''}": ("fuse_conv_activation", (lambda a=a, b=b: conv_act(a, b)), True)
              for a in ("Relu", "Relu6", "LeakyRelu", "HardSwish", "SiLU") for b in (False, True)})


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("emit", ["portable", "device"])
def test_fusion_keeps_its_promise_on_special_values(case, emit):
    name, build, large = CASES[case]
    pass_ = getattr(passes, name)
    promise = _pass_class(name).promise
    model = build()
    graph = gp.load(model).graph
    assert pass_(graph).modified, f"{case}: the pass must fire for the test to mean anything"
    after = gp.to_proto(graph, emit=emit)
    check_full(after)
    for seed in range(4):
        feeds = {i.name: _x([d.dim_value for d in i.type.tensor_type.shape.dim], large, seed) for i in model.graph.input}
        ref, got = ort_run(model, feeds), ort_run(after, feeds)
        for out in ref:
            assert_keeps(promise, ref[out], got[out], f"{case} seed {seed} {out}")


OVERFLOW = {  # case -> an input on which an intermediate of the original overflows float32
    "fuse_conv_scale/conv": np.full((1, 3, 6, 6), F32_MAX / 4, np.float32),          # Conv(x) itself is inf
    "fold_batchnorm/conv": np.full((1, 3, 6, 6), F32_MAX / 4, np.float32),
    "fuse_gelu/op": np.full((4, 16), F32_MAX * 0.9, np.float32),                     # x * (1 + erf) = 2x
    "fuse_layer_norm/op": np.tile(np.array([F32_MAX / 2, -F32_MAX / 2] * 4, np.float32), (6, 1)),  # d ** 2
}


@pytest.mark.parametrize("case", sorted(OVERFLOW))
def test_tolerance_passes_move_inf_only_where_an_intermediate_overflows(case):
    # The documented limit of the tolerance promises (README, "Fusions"): where an intermediate
    # of the original overflows (inputs near float32's max), the original gives inf or NaN that
    # the rewritten graph (other association, one kernel) need not give. Below that, the test
    # above holds: same NaN/inf positions and signs.
    name, build, large = CASES[case]
    assert not large
    model = build()
    graph = gp.load(model).graph
    assert getattr(passes, name)(graph).modified
    x = OVERFLOW[case]
    ref, got = ort_run(model, {"x": x})["y"], ort_run(gp.to_proto(graph), {"x": x})["y"]
    assert (~np.isfinite(ref)).any() and not np.array_equal(np.isfinite(ref), np.isfinite(got))
