"""Review verbs attacked with model pairs built to fool them (issue 17): each test is a bug that was found."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from graphpass.check import verify as V
from graphpass.cli import main
from graphpass.testing import make_model


def _write(tmp_path, name, model):
    p = tmp_path / f"{name}.onnx"
    onnx.save(model, str(p))
    return str(p)


def _split_to_sequence(splits):
    m = make_model([helper.make_node("SplitToSequence", ["x", "sp"], ["y"], axis=0)], {"x": [4]}, {},
                   {"sp": np.array(splits, np.int64)})
    m.graph.output.append(helper.make_tensor_sequence_value_info("y", T.FLOAT, None))
    return m


def test_a_sequence_output_never_equals_a_tensor_output():
    # a Reshape to [2, 2] and a sequence of two [2] tensors hold the same numbers, not the same value
    a = make_model([helper.make_node("Reshape", ["x", "sh"], ["y"])], {"x": [4]}, {"y": [2, 2]},
                   {"sh": np.array([2, 2], np.int64)})
    r = V.verify_models(a, _split_to_sequence([2, 2]))
    assert not r.ok and "sequence where the original has a tensor" in r.outputs[0].note


def test_ragged_sequences_are_compared_element_by_element(tmp_path, capsys):
    # was: internal error (exit 3) from np.asarray on a ragged list
    a = _write(tmp_path, "a", _split_to_sequence([1, 3]))
    b = _write(tmp_path, "b", _split_to_sequence([2, 2]))
    assert main(["verify", a, a]) == 0
    assert main(["verify", a, a, "--all-tensors", "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["verify", b, a]) == 1
    assert "shape [1] != [2]" in capsys.readouterr().out


def test_sequence_length_map_keys_and_empty_optional():
    x = np.ones(2, np.float32)
    assert not V.compare_arrays("s", [x], [x, x]).ok
    assert not V.compare_arrays("s", [x, x], [x, x + 1]).ok and V.compare_arrays("s", [x, x], [x, x.copy()]).ok
    assert not V.compare_arrays("m", {1: x}, {2: x}).ok and V.compare_arrays("m", {1: x}, {1: x.copy()}).ok
    assert V.compare_arrays("o", None, None).ok and not V.compare_arrays("o", None, x).ok


def _random_model():
    return make_model([helper.make_node("RandomNormalLike", ["x"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])],
                      {"x": [100]}, {"y": [100]})


def _training_dropout():
    return make_model([helper.make_node("Dropout", ["x", "ratio", "t"], ["y"])], {"x": [100]}, {"y": [100]},
                      {"ratio": np.array(0.5, np.float32), "t": np.array(True)})


@pytest.mark.parametrize("build", [_random_model, _training_dropout])
def test_nondeterministic_models_are_refused_not_judged(tmp_path, capsys, build):
    # was: RandomNormalLike vs itself "ok" (onnxruntime's fixed default seed), training Dropout vs
    # itself "48 of 100 values differ" (exit 1): neither verdict says anything about the models
    p = _write(tmp_path, "m", build())
    assert main(["verify", p, p]) == 2
    err = capsys.readouterr().err
    assert "gives other outputs on every run" in err and "y changed" in err
    assert main(["bisect", p, "--out-dir", str(tmp_path / "b")]) == 2
    assert main(["optimize", p, "-o", str(tmp_path / "o.onnx"), "--verify"]) == 2
    assert not (tmp_path / "o.onnx").exists()  # like a failed --verify: not kept without --keep-failed
    # --verify-each blamed the first pass that changed the graph (exit 1, propagate_layout)
    assert main(["optimize", p, "-o", str(tmp_path / "o.onnx"), "--verify-each"]) == 2


def test_inference_dropout_is_not_refused(tmp_path):
    m = make_model([helper.make_node("Dropout", ["x"], ["y"])], {"x": [8]}, {"y": [8]})
    assert V.random_nodes(m) == []
    p = _write(tmp_path, "m", m)
    assert main(["verify", p, p]) == 0


def _if_model(else_op):
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["o"])], "t", [],
                             [helper.make_tensor_value_info("o", T.FLOAT, [4])])
    other = helper.make_graph([helper.make_node(else_op, ["x"], ["o"])], "e", [],
                              [helper.make_tensor_value_info("o", T.FLOAT, [4])])
    return make_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch")],
                      {"c": (T.BOOL, []), "x": [4]}, {"y": [4]})


def test_an_untaken_if_branch_is_named(tmp_path, capsys):
    # the else branches differ (Neg vs Abs); seed 0 feeds c = True: "ok" is right for these inputs,
    # but it was said with no word that half of the model was never run
    a, b = _write(tmp_path, "a", _if_model("Neg")), _write(tmp_path, "b", _if_model("Abs"))
    assert main(["verify", a, b]) == 0
    out = capsys.readouterr().out
    assert "If 'branch' ran only its then branch" in out and "else branch is not verified" in out
    # the seed whose condition is False takes the else branch and fails
    seed = next(s for s in range(20) if not V.make_inputs(onnx.load(a), seed=s)[0]["c"])
    assert main(["verify", a, b, "--seed", str(seed)]) == 1


def test_if_on_a_computed_condition_is_observed():
    m = _if_model("Neg")
    m.graph.input.pop(0)
    m.graph.node.insert(0, helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0))
    m.graph.node.insert(1, helper.make_node("Greater", ["m", "big"], ["c"]))
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(100.0, np.float32), "big"))
    feeds, _, _, runner, _ = V.reference(m)
    assert V.branch_notes("model A", m, runner, feeds) == [
        "model A: If 'branch' ran only its else branch on these inputs; its then branch is not verified "
        "(--inputs or --seed reach it)"]


def test_a_failing_original_names_the_inputs_it_was_fed_in_one_line(tmp_path, capsys):
    # random ints are 0..3 (below a table's size only where an input indexes it directly): a Gather
    # over 2 rows of -i fails; the message says what was fed and how to feed others, and
    # onnxruntime's own log line no longer precedes it
    m = make_model([helper.make_node("Neg", ["i"], ["j"]), helper.make_node("Gather", ["d", "j"], ["y"])],
                   {"i": (T.INT64, [5])}, {"y": [5, 2]},
                   {"d": np.arange(4, dtype=np.float32).reshape(2, 2)})
    p = _write(tmp_path, "m", m)
    assert main(["verify", p, p]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inputs fed: i int64[5]" in err and "--inputs" in err


_TOL = [["--atol", "nan"], ["--rtol", "nan"], ["--atol", "inf"], ["--atol", "-1"], ["--seed", "-1"]]


@pytest.mark.parametrize("verb,flags", [(v, f) for v in ("verify", "bisect", "optimize") for f in _TOL]
                         + [("precision", ["--seed", "-1"]), ("verify", ["--min-cosine", "nan"]),
                            ("verify", ["--min-cosine", "2"])])
def test_tolerances_seeds_and_cosines_that_judge_nothing_are_exit_2(tmp_path, capsys, flags, verb):
    # was: Relu vs Abs "ok" under --atol nan (every comparison with NaN is False) in verify,
    # optimize --verify and bisect; --atol -1 failed identical models; --seed -1 was exit 3
    relu = _write(tmp_path, "relu", make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [4, 8]}, {"y": [4, 8]}))
    absm = _write(tmp_path, "abs", make_model([helper.make_node("Abs", ["x"], ["y"])], {"x": [4, 8]}, {"y": [4, 8]}))
    argv = {"verify": ["verify", relu, absm], "bisect": ["bisect", relu, "--out-dir", str(tmp_path / "b")],
            "optimize": ["optimize", relu, "-o", str(tmp_path / "o.onnx"), "--verify"],
            "precision": ["precision", relu]}[verb]
    with pytest.raises(SystemExit) as e:
        main(argv + flags)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flags[1] in err


def test_the_api_refuses_a_nan_tolerance_too():
    from graphpass.errors import UsageError

    a = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [4]}, {"y": [4]})
    b = make_model([helper.make_node("Abs", ["x"], ["y"])], {"x": [4]}, {"y": [4]})
    with pytest.raises(UsageError):
        V.verify_models(a, b, atol=float("nan"))
    with pytest.raises(UsageError):
        V.tolerance_for([], rtol=float("nan"))


def test_a_dim_bound_by_input_shape_holds_for_every_input_naming_it(tmp_path, capsys):
    # was: --input-shape x:5,3 fed y as [2, 3], onnxruntime failed, the retry fed y as [1, 3]
    # (Add broadcast a shape the model never meant) and the header still said "fed as 2"
    add = _write(tmp_path, "add", make_model([helper.make_node("Add", ["x", "y"], ["z"])],
                                             {"x": ["N", 3], "y": ["N", 3]}, {"z": ["N", 3]}))
    assert main(["verify", add, add, "--input-shape", "x:5,3"]) == 0
    out = capsys.readouterr().out
    assert "y float32[5(N), 3]" in out and "symbolic dims (N) fed as 5" in out and "fed as 1" not in out
    feeds, fed = V.make_inputs(onnx.load(add), input_shapes={"x": [5, 3]})
    assert feeds["y"].shape == (5, 3) and fed[1].symbolic == {0: "N"}


def test_verify_json_is_standard_json_when_a_difference_is_infinite(tmp_path, capsys):
    # was: "max_abs": Infinity (a shape mismatch), which JSON.parse and strict parsers reject
    import json

    def sl(end):
        return make_model([helper.make_node("Slice", ["x", "s", "e"], ["y"])], {"x": [3]}, {"y": [None]},
                          {"s": np.array([0]), "e": np.array([end])})

    a, b = _write(tmp_path, "a", sl(0)), _write(tmp_path, "b", sl(1))
    assert main(["verify", a, b, "--format", "json"]) == 1

    def refuse(constant):
        raise ValueError(constant)

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert data["ok"] is False and data["outputs"][0]["max_abs"] == "inf"


def test_precision_on_a_model_with_a_ragged_sequence_output(tmp_path, capsys):
    # was: internal error (exit 3) from np.asarray on the sequence; the Mul overflow is still found
    m = make_model([helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("SplitToSequence", ["m", "sp"], ["y"])],
                   {"x": [4]}, {}, {"sp": np.array([1, 3], np.int64), "k": np.array(1e6, np.float32)})
    m.graph.output.append(helper.make_tensor_sequence_value_info("y", T.FLOAT, None))
    assert main(["precision", _write(tmp_path, "m", m)]) == 0
    assert "overflow [activation] m (Mul m): emulated force_fp16: confirmed" in capsys.readouterr().out


def test_inputs_of_another_dtype_in_model_b_are_a_usage_error():
    # was: with fp16 emulation B's float16 input took A's float32 values unrounded ("ok", max abs 0);
    # without it, exit 2 from onnxruntime: the verdict depended on a switch about something else
    from graphpass.errors import UsageError

    a = make_model([helper.make_node("Mul", ["x", "k"], ["y"])], {"x": [4]}, {"y": [4]}, {"k": np.array(3, np.float32)})
    b = make_model([helper.make_node("Cast", ["x"], ["xf"], to=T.FLOAT), helper.make_node("Mul", ["xf", "k"], ["y"])],
                   {"x": (T.FLOAT16, [4])}, {"y": [4]}, {"k": np.array(3, np.float32)})
    for emulate in (True, False):
        with pytest.raises(UsageError, match="input 'x' is float in model A and float16 in model B"):
            V.verify_models(a, b, fp16_emulate=emulate)


def test_an_emulated_float16_input_holds_float16_values():
    from graphpass.check import fp16

    m = make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": (T.FLOAT16, [1])}, {"y": (T.FLOAT16, [1])})
    emu = fp16.Emulated(m, V.session)
    fed = emu.feeds({"x": np.array([0.1], np.float32)})["x"]
    assert fed.dtype == np.float32 and fed[0] == np.float32(np.float16(0.1)) != np.float32(0.1)


def test_a_loop_that_ran_zero_times_is_named():
    # the trip count is a graph input: random ints are 0..3, seed 1 feeds 0 and the body never runs
    body = helper.make_graph([helper.make_node("Neg", ["v"], ["v2"]), helper.make_node("Identity", ["cond"], ["c2"])], "b",
                             [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond", T.BOOL, []),
                              helper.make_tensor_value_info("v", T.FLOAT, [4])],
                             [helper.make_tensor_value_info("c2", T.BOOL, []), helper.make_tensor_value_info("v2", T.FLOAT, [4])])
    m = make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="loop")],
                   {"n": (T.INT64, []), "x": [4]}, {"y": [4]})
    zero = next(s for s in range(20) if V.make_inputs(m, seed=s)[0]["n"] == 0)
    report = V.verify_models(m, m, seed=zero)
    assert report.ok and any("Loop 'loop' ran zero times" in n for n in report.notes)
    runs = next(s for s in range(20) if V.make_inputs(m, seed=s)[0]["n"] > 0)
    assert not any("Loop" in n for n in V.verify_models(m, m, seed=runs).notes)


@pytest.mark.parametrize("verb", ["verify", "precision"])
def test_an_input_shape_the_npz_contradicts_is_exit_2(tmp_path, capsys, verb):
    # was: --input-shape x:5,3 silently ignored when --inputs fed x as [2, 3]
    p = _write(tmp_path, "m", make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]}, {"y": ["N", 3]}))
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((2, 3), np.float32))
    argv = ["verify", p, p] if verb == "verify" else ["precision", p]
    assert main(argv + ["--inputs", str(npz), "--input-shape", "x:5,3"]) == 2
    assert "--input-shape says [5, 3]" in capsys.readouterr().err
    assert main(argv + ["--inputs", str(npz), "--input-shape", "x:2,3"]) == 0


def test_bisect_out_dir_that_cannot_be_written_is_exit_2_before_the_search(tmp_path, capsys):
    # was: internal error (exit 3) after the whole search, when the models were written
    p = _write(tmp_path, "m", make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [4]}, {"y": [4]}))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["bisect", p, "--out-dir", str(blocker / "sub")]) == 2
    assert "cannot be created or written" in capsys.readouterr().err


def test_exact_comparison_matches_any_nan_with_any_nan_as_documented():
    # a judgement, pinned: NaN payload and sign bits are not compared even at rtol = atol = 0
    # (kernels canonicalize NaNs differently); the position of every NaN is
    a = np.array([np.nan, 1.0], np.float16)
    b = a.copy().view(np.uint16)
    b[0] |= 0x8001
    b = b.view(np.float16)
    assert np.isnan(b[0]) and V.compare_arrays("t", a, b, 0.0, 0.0).ok
    assert not V.compare_arrays("t", a, np.array([1.0, np.nan], np.float16), 0.0, 0.0).ok


def test_randomness_only_in_model_b_is_a_failure_not_a_usage_error(tmp_path, capsys):
    # the original is deterministic: a B that draws random numbers computes something else (exit 1)
    a = _write(tmp_path, "a", make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [100]}, {"y": [100]}))
    b = _write(tmp_path, "b", _training_dropout())
    assert main(["verify", a, b]) == 1
    assert "model B gives other outputs on every run" in capsys.readouterr().err
