import numpy as np
import onnx
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes.framework import PassContext
from graphpass.ir import annotations as A
from graphpass.passes import fold_batchnorm
from graphpass.testing import assert_equivalent, make_model, ops

RNG = np.random.default_rng(0)


def _bn_params(c, prefix="bn"):
    return {f"{prefix}_s": RNG.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_b": RNG.standard_normal(c).astype(np.float32),
            f"{prefix}_m": RNG.standard_normal(c).astype(np.float32), f"{prefix}_v": RNG.uniform(0.5, 1.5, c).astype(np.float32)}


def _bn(x, y, prefix="bn", **attrs):
    return helper.make_node("BatchNormalization", [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                            name=prefix, epsilon=1e-3, **attrs)


def _conv_bn(group=1, bias=True, dtype=np.float32):
    w = RNG.standard_normal((8, 8 // group, 3, 3)).astype(dtype)
    inits = {"w": w, **_bn_params(8)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = RNG.standard_normal(8).astype(dtype)
        conv_in.append("b")
    return make_model([helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], group=group), _bn("c", "y")],
                      {"x": [2, 8, 6, 6]}, {"y": [2, 8, 6, 6]}, initializers=inits)


def test_folds_into_conv_with_and_without_bias_and_groups():
    for group, bias in ((1, True), (1, False), (4, True), (8, False)):
        model = _conv_bn(group, bias)
        graph = gp.load(model).graph
        result = fold_batchnorm(graph)
        assert result.modified and result.stats["fired"] == 1
        assert ops(graph) == ["Conv"]
        conv = graph.nodes[0]
        assert conv.outputs[0].name == "y" and len(conv.inputs) == 3
        assert A.get(conv, A.PASS) == "fold_batchnorm" and A.fused_from(conv) == ["conv", "bn"]
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_folds_into_conv_transpose_and_gemm():
    ct = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["c"], strides=[2, 2]), _bn("c", "y")],
                    {"x": [1, 4, 5, 5]}, {"y": [1, 6, 11, 11]},
                    initializers={"w": RNG.standard_normal((4, 6, 3, 3)).astype(np.float32), **_bn_params(6)})
    gemm = make_model([helper.make_node("Gemm", ["x", "w", "c0"], ["g"], transB=1, beta=0.5), _bn("g", "y")],
                      {"x": [3, 5]}, {"y": [3, 7]},
                      initializers={"w": RNG.standard_normal((7, 5)).astype(np.float32), "c0": RNG.standard_normal(7).astype(np.float32),
                                    **_bn_params(7)})
    for model, op in ((ct, "ConvTranspose"), (gemm, "Gemm")):
        graph = gp.load(model).graph
        assert fold_batchnorm(graph).modified and ops(graph) == [op]
        assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def _refusal(model):
    graph = gp.load(model).graph
    ctx = PassContext()
    result = fold_batchnorm(graph, ctx)
    assert not result.modified and "BatchNormalization" in ops(graph)
    return ctx.explanations[0].reason


def test_refuses_with_reasons():
    assert "float16" in _refusal(_conv_bn(dtype=np.float16).__class__.FromString(_fp16_model().SerializeToString()))
    shared = _conv_bn()
    shared.graph.node.append(helper.make_node("Conv", ["x", "w"], ["other"], pads=[1, 1, 1, 1]))
    shared.graph.output.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, [2, 8, 6, 6]))
    assert "shared with Conv" in _refusal(shared)
    runtime = _conv_bn()
    runtime.graph.initializer.remove(next(i for i in runtime.graph.initializer if i.name == "bn_v"))
    runtime.graph.input.append(helper.make_tensor_value_info("bn_v", TensorProto.FLOAT, [8]))
    assert "'bn_v' is not a constant" in _refusal(runtime)
    grouped = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=2), _bn("c", "y")],
                         {"x": [1, 4, 5, 5]}, {"y": [1, 6, 7, 7]},
                         initializers={"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), **_bn_params(6)})
    assert "grouped ConvTranspose" in _refusal(grouped)


def _fp16_model():
    w = RNG.standard_normal((8, 8, 3, 3)).astype(np.float16)
    p = {k: v.astype(np.float16) for k, v in _bn_params(8).items()}
    return make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _bn("c", "y")],
                      {"x": (TensorProto.FLOAT16, [1, 8, 4, 4])}, {"y": (TensorProto.FLOAT16, [1, 8, 4, 4])},
                      initializers={"w": w, **p})


def test_bn_after_non_conv_is_not_matched():
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), _bn("r", "y")], {"x": [1, 8, 4, 4]}, {"y": [1, 8, 4, 4]},
                       initializers=_bn_params(8))
    graph = gp.load(model).graph
    assert not fold_batchnorm(graph).modified


def _conv_bn_with(**params):
    model = _conv_bn()
    for t in model.graph.initializer:
        if t.name in params:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(params[t.name], np.float32), t.name))
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            n.attribute[0].f = params.get("eps", n.attribute[0].f)
    return model


def test_var_plus_eps_zero_is_not_folded_the_bn_gives_inf_there():
    # var + eps = 0 in channel 2: the BN divides by zero; onnxruntime gives -inf or +inf in part
    # of the channel (NaN elsewhere); a fold would put inf into the weights and bias and give
    # NaN across the channel.
    var = np.full(8, 0.5, np.float32)
    var[2] = -1e-3
    model = _conv_bn_with(bn_v=var)
    assert "var + eps is 0 in channel 2" in _refusal(model)
    from graphpass.testing import ort_run
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    y = ort_run(model, {"x": x})["y"]
    assert np.isinf(y[:, 2]).any() and not np.isfinite(y[:, 2]).any() and np.isfinite(np.delete(y, 2, axis=1)).all()


def test_fold_that_would_overflow_or_underflow_a_weight_is_refused():
    big = np.full(8, 1.0, np.float32)
    big[0] = 3e38  # W * s overflows float32 for |W| > ~1.1 * sqrt(var + eps)
    assert "overflows" in _refusal(_conv_bn_with(bn_s=big))
    tiny = np.full(8, 1.0, np.float32)
    tiny[1] = 1e-45  # W * s rounds to 0: an inf input would give NaN where the BN gives ±inf
    assert "rounds a nonzero weight to zero" in _refusal(_conv_bn_with(bn_s=tiny))


def test_zero_gamma_is_folded_and_keeps_nan_and_inf():
    # gamma = 0: the BN gives 0 * (inf - mean) = NaN where the Conv output is inf, beta elsewhere;
    # the folded Conv has zero weights there: inf * 0 = NaN too.
    gamma = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
    gamma[[0, 3]] = [0.0, -0.0]
    model = _conv_bn_with(bn_s=gamma)
    graph = gp.load(model).graph
    assert fold_batchnorm(graph).modified
    from graphpass.testing import ort_run
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    x[0, 1, 2, 2], x[1, 4, 0, 0], x[1, 5, 3, 3] = np.inf, -np.inf, np.nan
    ref, got = ort_run(model, {"x": x})["y"], ort_run(gp.to_proto(graph), {"x": x})["y"]
    assert np.array_equal(np.isnan(ref), np.isnan(got)) and np.isnan(ref[:, 0]).any()
    assert np.array_equal(np.isinf(ref), np.isinf(got)) and np.array_equal(ref[np.isinf(ref)], got[np.isinf(got)])
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)


def test_bfloat16_conv_bn_is_refused_with_reason_not_a_crash():
    def t(name, shape):
        return helper.make_tensor(name, TensorProto.BFLOAT16, shape, RNG.uniform(0.5, 1.5, shape).ravel().tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _bn("c", "y")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 3, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, 4, 5, 5])],
                          initializer=[t("w", [4, 3, 3, 3])] + [t(f"bn_{k}", [4]) for k in "sbmv"])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])
    assert "is bfloat16: folding in bfloat16 would round" in _refusal(model)


def test_training_mode_or_used_running_statistics_are_refused():
    # opset 15 training_mode=1, and an opset-9 BN whose running mean is a graph output
    params = _bn_params(8)
    w = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)
    for opset, attrs, outs in ((15, {"training_mode": 1}, ["y", "rm", "rv"]), (9, {}, ["y", "rm"])):
        bn = helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], outs, epsilon=1e-3, **attrs)
        outputs = {"y": [2, 8, 6, 6], **{o: [8] for o in outs[1:]}}
        model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), bn], {"x": [2, 8, 6, 6]}, outputs,
                           initializers={"w": w, **params}, opset=opset)
        assert "training mode" in _refusal(model), opset


def test_gemm_with_beta_zero_folds_only_without_a_c_input():
    # beta=0 with a C input: C is multiplied by 0 (an inf in C would be NaN); without C it folds
    w = RNG.standard_normal((7, 5)).astype(np.float32)
    c0 = RNG.standard_normal(7).astype(np.float32)
    with_c = make_model([helper.make_node("Gemm", ["x", "w", "c0"], ["g"], transB=1, beta=0.0), _bn("g", "y")],
                        {"x": [3, 5]}, {"y": [3, 7]}, initializers={"w": w, "c0": c0, **_bn_params(7)})
    assert "beta=0 and a C input" in _refusal(with_c)
    without_c = make_model([helper.make_node("Gemm", ["x", "w"], ["g"], transB=1, beta=0.0), _bn("g", "y")],
                           {"x": [3, 5]}, {"y": [3, 7]}, initializers={"w": w, **_bn_params(7)})
    graph = gp.load(without_c).graph
    assert fold_batchnorm(graph).modified and ops(graph) == ["Gemm"]
    assert_equivalent(without_c, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_named_but_unused_running_statistics_do_not_stop_the_fold():
    # an opset-9 BN naming its running-mean output that nothing reads: inference, it folds
    params = _bn_params(8)
    w = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)
    bn = helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y", "rm"], epsilon=1e-3)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), bn], {"x": [2, 8, 6, 6]},
                       {"y": [2, 8, 6, 6]}, initializers={"w": w, **params}, opset=9)
    graph = gp.load(model).graph
    assert fold_batchnorm(graph).stats["fired"] == 1 and ops(graph) == ["Conv"]


def test_folds_into_a_gemm_without_trans_b():
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["g"]), _bn("g", "y")], {"x": [3, 5]}, {"y": [3, 7]},
                       initializers={"w": RNG.standard_normal((5, 7)).astype(np.float32), **_bn_params(7)})
    graph = gp.load(model).graph
    assert fold_batchnorm(graph).stats["fired"] == 1 and ops(graph) == ["Gemm"]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_a_weight_that_is_zero_already_does_not_stop_the_fold():
    model = _conv_bn()
    w = next(t for t in model.graph.initializer if t.name == "w")
    values = onnx.numpy_helper.to_array(w).copy()
    values[0, 0, 0, 0] = 0.0
    values[1, 0, 0, 0] = 1.0
    w.CopyFrom(onnx.numpy_helper.from_array(values, "w"))
    graph = gp.load(model).graph
    assert fold_batchnorm(graph).stats["fired"] == 1 and ops(graph) == ["Conv"]
    assert_equivalent(model, gp.to_proto(graph), rtol=1e-5, atol=1e-5)


def test_spatial_0_parameters_of_other_lengths_and_other_channel_counts_are_refused():
    # BatchNormalization-7 with spatial=0: statistics per activation, not per channel
    model = _conv_bn()
    model.graph.node[1].attribute.append(helper.make_attribute("spatial", 0))
    model.opset_import[0].version = 8
    assert _refusal(model) == "BatchNormalization with spatial=0 (per-activation statistics)"
    # a scale of one element beside vectors of 8
    model = _conv_bn()
    s = next(t for t in model.graph.initializer if t.name == "bn_s")
    s.CopyFrom(onnx.numpy_helper.from_array(np.array([1.5], np.float32), "bn_s"))
    assert _refusal(model).startswith("BatchNormalization parameters are not four vectors of one length")
    # statistics of 4 channels after a Conv of 8 output channels
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _bn("c", "y")],
                       {"x": [2, 8, 6, 6]}, {"y": (TensorProto.FLOAT, None)},
                       initializers={"w": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32), **_bn_params(4)})
    assert _refusal(model) == ("BatchNormalization has 4 channels, which do not fit Conv 'conv' (weight [8, 8, 3, 3])")


def _many_conv_bn(specials):
    """A chain of Conv(4 -> 4, 3x3) -> BN blocks, every other Conv with a bias; ``specials``: block
    -> the BN parameters (or the weight, "w") to set, for the cases a fold refuses or checks
    twice. Enough blocks of one weight shape that fold_batchnorm computes them together."""
    nodes, inits, x = [], {}, "x"
    for i in range(12):
        w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
        p = {k.replace("bn", f"bn{i}"): v for k, v in _bn_params(4).items()}
        for k, v in specials.get(i, {}).items():
            if k == "w":
                w = np.asarray(v, np.float32)
            else:
                p[f"bn{i}_{k}"] = np.asarray(v, np.float32)
        inits[f"w{i}"] = w
        inits.update(p)
        conv_in = [x, f"w{i}"]
        if i % 2:
            inits[f"b{i}"] = RNG.standard_normal(4).astype(np.float32)
            conv_in.append(f"b{i}")
        nodes += [helper.make_node("Conv", conv_in, [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  _bn(f"c{i}", f"y{i}", prefix=f"bn{i}")]
        x = f"y{i}"
    return make_model(nodes, {"x": [1, 4, 5, 5]}, {x: [1, 4, 5, 5]}, initializers=inits)


def test_folds_computed_together_are_the_folds_one_by_one(monkeypatch):
    """Same-shape folds are computed before the walk, many per numpy call (fold_batchnorm's
    _prefetch): the model, the stats and every refusal's reason are the ones of the folds
    computed one by one, for folds with and without a Conv bias, folds refused (var + eps <= 0,
    an overflow, a weight rounded to zero) and a weight that is zero already (checked again)."""
    from graphpass.passes.fusion import fold_batchnorm as F

    neg = np.full(4, 0.5, np.float32)
    neg[1] = -1e-3
    big = np.full(4, 1.0, np.float32)
    big[0] = 3e38
    tiny = np.full(4, 1.0, np.float32)
    tiny[2] = 1e-45
    zero_w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
    zero_w[0, 0, 0, 0] = 0.0
    model = _many_conv_bn({2: {"v": neg}, 5: {"s": big}, 7: {"s": tiny}, 8: {"w": zero_w}, 9: {"m": [-0.0] * 4}})

    def run():
        graph = gp.load(model).graph
        ctx = PassContext()
        result = fold_batchnorm(graph, ctx)
        return gp.to_proto(graph).SerializeToString(), result.stats, [(e.node, e.reason) for e in ctx.explanations]

    used = []
    real = F._prefetch

    def counting(graph):
        out = real(graph)
        used.append(len(out))
        return out

    monkeypatch.setattr(F, "_prefetch", counting)
    together = run()
    assert used == [8]  # 12 folds, 3 refused and the zero weight's computed again one by one
    monkeypatch.setattr(F, "_prefetch", lambda graph: {})
    one_by_one = run()
    assert together == one_by_one
    stats, reasons = together[1], dict(together[2])
    assert stats["fired"] == 9 and stats["refused"] == 3
    assert reasons["bn2"].startswith("var + eps is") and "overflows" in reasons["bn5"]
    assert "rounds a nonzero weight to zero" in reasons["bn7"]
    folded = gp.load(together[0]).graph
    assert ops(folded).count("BatchNormalization") == 3
    onnx.checker.check_model(gp.to_proto(folded), full_check=True)
    assert_equivalent(model, gp.to_proto(folded), rtol=1e-4, atol=1e-4)


def test_a_prefetched_fold_whose_tensors_changed_is_computed_again():
    """A fold computed before the walk is used only for the same Conv, weight, bias, BN vectors
    (the same objects and values objects) and epsilon; anything else is computed again."""
    from graphpass.passes.fusion import fold_batchnorm as F

    graph = gp.load(_many_conv_bn({})).graph
    pre = F._prefetch(graph)
    assert len(pre) == 12
    bn = next(n for n in graph.nodes if n.op == "BatchNormalization")
    key = F._key(bn)
    assert all(a is b for a, b in zip(pre[id(bn)][0], key))
    bn.inputs[1].values = np.asarray(bn.inputs[1].values).copy()  # another values object: not the same key
    assert not all(a is b for a, b in zip(pre[id(bn)][0], F._key(bn)))


def test_the_folds_computed_ahead_hold_at_most_their_byte_cap(monkeypatch):
    """At most _PREFETCH_MAX_BYTES of weights are held by folds computed ahead (a 1M-node CNN would
    hold every fold's at once); the folds past the cap are folded one by one, to the same bytes."""
    from graphpass.passes.fusion import fold_batchnorm as F

    model = _many_conv_bn({})
    per_fold = 12 * 4 * 4 * 3 * 3  # the float64 weight and its float32 copy, as _prefetch counts them
    monkeypatch.setattr(F, "_BATCH_BYTES", 8 * 4 * 4 * 3 * 3 * 3)  # chunks of 3 folds
    monkeypatch.setattr(F, "_PREFETCH_MAX_BYTES", 7 * per_fold)
    assert len(F._prefetch(gp.load(model).graph)) == 6  # two chunks of 3; the third would pass the cap
    graph = gp.load(model).graph
    capped = fold_batchnorm(graph, PassContext())
    monkeypatch.setattr(F, "_PREFETCH_MAX_BYTES", 1 << 26)
    full = gp.load(model).graph
    assert fold_batchnorm(full, PassContext()).stats == capped.stats and capped.stats["fired"] == 12
    assert gp.to_proto(graph).SerializeToString() == gp.to_proto(full).SerializeToString()


def test_the_pass_is_skipped_only_where_no_rule_can_anchor():
    """fold_batchnorm runs its own walk (the folds computed first), so the manager asks its
    anchor_ops, not its rules: the two must name the same ops."""
    from graphpass.passes.fusion.fold_batchnorm import FoldBatchNorm

    anchors = frozenset().union(*(r.anchors() for r in FoldBatchNorm.rules))
    assert FoldBatchNorm.anchor_ops == anchors
    assert not FoldBatchNorm().can_act(frozenset({"Conv", "Relu"}), PassContext())
    assert FoldBatchNorm().can_act(frozenset({"Conv", "BatchNormalization"}), PassContext())


def test_the_producer_is_edited_in_place_to_the_graph_a_copy_makes(monkeypatch):
    """The fused Conv/Gemm is the matched producer edited in place (Match.copy(reuse=True): its
    weight and bias inputs, Gemm's beta, the BN's output), not a copy: the same bytes, node order
    (a node between the Conv and its BN stays before it), readers' order, annotations and stats
    as the copy, for Conv with and without a bias, a refused fold and a Gemm; a BN with its
    running statistics named but unused (more than one output) is folded into a copy."""
    from graphpass.passes.framework.rewrite import Match

    gemm = make_model([helper.make_node("Gemm", ["x", "w", "cc"], ["g"], name="gemm", transB=1, beta=0.5),
                       helper.make_node("Relu", ["x"], ["side"], name="side"), _bn("g", "y")],
                      {"x": [2, 8]}, {"y": [2, 8], "side": [2, 8]},
                      initializers={"w": RNG.standard_normal((8, 8)).astype(np.float32),
                                    "cc": RNG.standard_normal(8).astype(np.float32), **_bn_params(8)})
    stats_out = _conv_bn()
    stats_out.graph.node[1].output.extend(["rm", "rv"])
    for model in (_many_conv_bn({2: {"v": [-1.0] * 4}}), gemm, _conv_bn(bias=False), stats_out):
        runs = []
        for reuse in (True, False):
            if not reuse:
                monkeypatch.setattr(Match, "_reusable", lambda self, node: False)
            graph = gp.load(model).graph
            producers = {id(n) for n in graph.nodes if n.op in ("Conv", "Gemm")}
            ctx = PassContext()
            result = fold_batchnorm(graph, ctx)
            kept = sum(id(n) in producers for n in graph.nodes)
            runs.append((gp.to_proto(graph).SerializeToString(), result.stats, [(e.node, e.reason) for e in ctx.explanations],
                         [(n.name, A.stored_meta(n), [[r.name for r in t.outputs] for t in n.inputs]) for n in graph.nodes]))
            if reuse:
                assert result.stats["fired"] and kept == len(producers) - (model is stats_out)
            else:
                assert kept == len(producers) - result.stats["fired"]
        monkeypatch.undo()
        assert runs[0] == runs[1]
    folded = gp.load(gemm).graph
    fold_batchnorm(folded, PassContext())
    assert ops(folded) == ["Relu", "Gemm"] and folded.nodes[1].attrs["beta"] == 1.0
    assert_equivalent(gemm, gp.to_proto(folded), rtol=1e-4, atol=1e-4)


def test_a_fold_computed_ahead_still_refuses_a_shared_weight_in_the_same_words(monkeypatch):
    """A fold computed before the walk skips the checks its computation made (constants, float32,
    the vectors' lengths, the values) but not whether another node reads the Conv's weight or
    bias: refused as one by one, with the same reason."""
    from graphpass.passes.fusion import fold_batchnorm as F

    model = _many_conv_bn({})
    model.graph.node.append(helper.make_node("Identity", ["w3"], ["w3_copy"], name="peek"))
    model.graph.node.append(helper.make_node("Identity", ["b5"], ["b5_copy"], name="peek_bias"))
    model.graph.output.extend([helper.make_tensor_value_info("w3_copy", TensorProto.FLOAT, [4, 4, 3, 3]),
                               helper.make_tensor_value_info("b5_copy", TensorProto.FLOAT, [4])])

    def run():
        graph = gp.load(model).graph
        ctx = PassContext()
        result = fold_batchnorm(graph, ctx)
        return gp.to_proto(graph).SerializeToString(), result.stats, [(e.node, e.reason) for e in ctx.explanations]

    assert len(F._prefetch(gp.load(model).graph)) == 12  # every fold computed ahead, the shared ones too
    together = run()
    monkeypatch.setattr(F, "_prefetch", lambda graph: {})
    assert together == run()
    reasons = dict(together[2])
    assert together[1]["fired"] == 10 and reasons == {
        "bn3": "weight 'w3' is shared with Identity 'peek'", "bn5": "bias of the producer 'b5' is shared with Identity 'peek_bias'"}
