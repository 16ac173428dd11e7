"""Issue 23: every flag checked. A bad value exits 2 with one line naming the range or the closest
pass name; none is accepted silently."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from graphpass.cli import main, parse_input_shapes
from graphpass.testing import make_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "models" / "shufflenet_v2_x0_5.onnx")


@pytest.fixture
def tiny(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                       {"x": ["batch", 3]}, {"y": ["batch", 3]})
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    return str(path)


def _one_line_exit_2(capsys, argv, *needles):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def _exit_2(capsys, argv, *needles):
    """Exit 2 by argparse (SystemExit) or by a UsageError (return code): one line either way."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("argv,needle", [
    (["optimize", "{m}", "-o", "{o}", "--max-rounds", "0"], ">= 1"),
    (["optimize", "{m}", "-o", "{o}", "--max-rounds", "-1"], ">= 1"),
    (["optimize", "{m}", "-o", "{o}", "--max-rounds", "many"], "not an integer"),
    (["optimize", "{m}", "-o", "{o}", "--fold-size-limit", "-5"], ">= 0"),
    (["optimize", "{m}", "-o", "{o}", "--iterations-per-loop", "0"], ">= 1"),
    (["optimize", "{m}", "-o", "{o}", "--seed", "-3"], ">= 0"),
    (["optimize", "{m}", "-o", "{o}", "--rtol", "nan"], ">= 0"),
    (["optimize", "{m}", "-o", "{o}", "--max-memory", "-1"], "--max-memory"),
    (["cost", "{m}", "--loop-trips", "0"], ">= 1"),
    (["cost", "{m}", "--iterations-per-loop", "0"], ">= 1"),
    (["cost", "{m}", "--top", "0"], ">= 1"),
    (["cost", "{m}", "--top", "-4"], ">= 1"),
    (["precision", "{m}", "--top", "0"], ">= 1"),
    (["precision", "{m}", "--underflow-share", "1.5"], "between 0 and 1"),
    (["precision", "{m}", "--absorption-share", "-0.1"], "between 0 and 1"),
    (["precision", "{m}", "--underflow-share", "nan"], "between 0 and 1"),
    (["verify", "{m}", "{m}", "--symbolic-dim", "0"], ">= 1"),
    (["verify", "{m}", "{m}", "--min-cosine", "2"], "between -1 and 1"),
    (["bisect", "{m}", "--seed", "-1"], ">= 0"),
])
def test_every_numeric_flag_is_range_checked_by_argparse(argv, needle, tiny, tmp_path, capsys):
    argv = [a.format(m=tiny, o=tmp_path / "o.onnx") for a in argv]
    err = _one_line_exit_2(capsys, argv, needle)
    assert argv[-2] in err  # the flag is named
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("flag", ["--passes", "--disable", "--enable", "--explain"])
def test_pass_name_flags_refuse_unknown_names_with_the_closest_match(flag, tiny, tmp_path, capsys):
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), f"{flag}=fold_constant"],
            "unknown pass 'fold_constant'", "did you mean fold_constants?")
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), f"{flag}=zzzz"], "unknown pass 'zzzz'",
            "known passes: ")
    assert not (tmp_path / "o.onnx").exists()


def test_bisect_and_passes_refuse_unknown_pass_names_too(tiny, tmp_path, capsys):
    _exit_2(capsys, ["bisect", tiny, "--disable", "fuse_gel", "--out-dir", str(tmp_path / "b")], "did you mean fuse_gelu?")
    _exit_2(capsys, ["passes", "--write-fusion-switch", str(tmp_path / "s.json"), "--disable", "fuse_gel"],
            "did you mean fuse_gelu?")


def test_explain_never_swallows_the_model_path(tiny, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", "--explain", tiny, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.exists() and "explain: " in text and tiny not in text.split("explain:", 1)[1].splitlines()[0]


def test_explain_prints_each_refusal_once_not_once_per_round(tmp_path, capsys):
    # the example runs several rounds; fuse_gather_split refuses the same Splits in each
    assert main(["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx"), "--explain", "fuse_gather_split"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("explain:")]
    assert len(lines) > 1 and len(lines) == len(set(lines)), lines


@pytest.mark.parametrize("spec", ["x:-1,3", "x:?,3", "x:batch,3", "x:N,3"])
def test_input_shape_keeps_a_dim_symbolic_with_minus_one_question_mark_or_a_name(spec, tiny, tmp_path, capsys):
    assert parse_input_shapes([spec]) == {"x": [-1, 3]}
    out = tmp_path / "o.onnx"
    assert main(["optimize", tiny, "-o", str(out), "--input-shape", spec, "-q"]) == 0
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 3


@pytest.mark.parametrize("spec", ["x:3.5,3", "x:a b,3", "x:-2,3", "x:1-,3"])
def test_input_shape_refuses_what_is_no_dim(spec, tiny, tmp_path, capsys):
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), "--input-shape", spec], "--input-shape")


def test_dim_zero_is_refused_with_the_reason(tiny, tmp_path, capsys):
    # decided (issue 23): a model specialized to an empty batch serves only empty batches; a
    # batch of 0 runs on the model as it is (the dim kept symbolic)
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), "--dim", "batch=0"], "--dim", "1..")
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), "--input-shape", "x:0,3"], "--input-shape")


def test_explain_before_a_model_file_named_like_a_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodel").write_bytes(Path(EXAMPLE).read_bytes())  # no extension, snake_case
    assert main(["optimize", "--explain", "mymodel", "-o", "o.onnx", "-q"]) == 0
    assert (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("verb", ["optimize", "bisect"])
@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_pass_list_is_refused_not_read_as_the_default_pipeline(verb, value, tiny, tmp_path, capsys):
    argv = [verb, tiny, f"--passes={value}"] + (["-o", str(tmp_path / "o.onnx")] if verb == "optimize"
                                               else ["--out-dir", str(tmp_path / "b")])
    _exit_2(capsys, argv, "--passes names no pass")
    assert not (tmp_path / "o.onnx").exists()


def test_an_unknown_pipeline_names_the_closest(tiny, tmp_path, capsys):
    _exit_2(capsys, ["optimize", tiny, "-o", str(tmp_path / "o.onnx"), "--pipeline", "defualt"],
            "unknown pipeline 'defualt'; did you mean default?", "known pipelines: ")


def test_fixed_shapes_the_model_cannot_run_are_one_line_exit_2(tmp_path, capsys):
    """BERT's position table holds 64 positions: --dim sequence=512 makes its embeddings' Add
    incompatible once the shapes fold. The written model would fail the checker; the input fails
    to run with those shapes too, so the shapes are at fault (exit 2), not graphpass (exit 3)."""
    from pathlib import Path

    from graphpass.cli import main

    src = Path(__file__).resolve().parents[1] / "data" / "exporters" / "bert.dynamo.onnx"
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--dim", "batch=2", "--dim", "sequence=512"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not run with its inputs fixed to" in err and "sequence" not in err.split(":")[0]
    assert not any(tmp_path.iterdir())
