"""The atc verb and optimize --atc on the command line: files, exit codes, one-line errors."""

import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

from graphpass.atc import read_kit
from graphpass.testing import make_model


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "graphpass", *args], capture_output=True, text=True, cwd=cwd)


def _dynamic(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    m = make_model(nodes, {"x": [1, 3, 6, 6]}, {"y": [1, 2, 4, 4]},
                   {"w": np.random.default_rng(1).standard_normal((2, 3, 3, 3)).astype(np.float32)})
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return p


def test_optimize_atc_writes_the_kit_for_the_optimized_model_with_three_gears(tmp_path):
    m = _dynamic(tmp_path)
    p = _run("optimize", str(m), "-o", str(tmp_path / "out.onnx"), "--atc", str(tmp_path / "kit"),
             "--shape-profile", "batch=1", "--shape-profile", "batch=2", "--shape-profile", "batch=4",
             "--disable", "fuse_conv_activation")
    assert p.returncode == 0, p.stderr
    back = read_kit(tmp_path / "kit")
    assert back.options["dynamic_batch_size"] == "1,2,4" and back.options["model"] == "out.onnx"
    assert back.switches["fuse_conv_activation"] is False
    assert "estimate per gear" in p.stdout and p.stdout.count(" ms") >= 3
    assert [n.op_type for n in onnx.load(tmp_path / "kit" / "out.onnx").graph.node] == \
           [n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node]


def test_atc_verb_refuses_by_name_and_writes_nothing(tmp_path):
    nodes = [helper.make_node("DFT", ["x"], ["y"], name="the_dft", onesided=0)]
    m = tmp_path / "dft.onnx"
    onnx.save(make_model(nodes, {"x": [1, 8, 1]}, {"y": [1, 8, 2]}), m)
    p = _run("atc", str(m), "-o", str(tmp_path / "kit"))
    assert p.returncode == 2 and "the_dft (DFT)" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "kit").exists()


def test_usage_errors_are_one_line_exit_2(tmp_path):
    m = _dynamic(tmp_path)
    cases = [("atc", str(m), "-o", str(tmp_path / "k"), "--cann-version", "3.3"),
             ("atc", str(m), "-o", str(tmp_path / "k")),                              # open batch, no profile
             ("atc", str(m), "-o", str(tmp_path / "k"), "--shape-profile", "batch=x"),
             ("atc", str(m), "-o", str(tmp_path / "k"), "--target", "none", "--shape-profile", "batch=1"),
             ("optimize", str(m), "-o", str(tmp_path / "o.onnx"), "--shape-profile", "batch=1")]
    for args in cases:
        p = _run(*args)
        assert p.returncode == 2 and p.stderr.startswith("graphpass: error:") and p.stderr.count("\n") == 1, (args, p.stderr)
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "k").exists()


def test_atc_verb_keep_fp32_auto_and_mixed_mode(tmp_path):
    m = _dynamic(tmp_path)
    p = _run("atc", str(m), "-o", str(tmp_path / "kit"), "--shape-profile", "batch=1", "--keep-fp32", "relu",
             "--precision-mode", "allow_mix_precision", "--cann-version", "6.0")
    assert p.returncode == 0, p.stderr
    back = read_kit(tmp_path / "kit")
    assert back.keep_fp32 == ["relu"] and back.options["precision_mode"] == "allow_mix_precision"
    assert "precision_mode_v2" not in back.options  # 6.0 has none


def test_optimize_keep_list_reaches_keep_dtype_and_fused_names_are_dropped_with_a_warning(tmp_path):
    m = _dynamic(tmp_path)
    common = ["--mixed-precision", "force_fp16", "--keep-fp32", "relu", "--shape-profile", "batch=1"]
    p = _run("optimize", str(m), "-o", str(tmp_path / "a.onnx"), "--atc", str(tmp_path / "ka"),
             "--disable", "fuse_conv_activation", *common)
    assert p.returncode == 0, p.stderr
    assert read_kit(tmp_path / "ka").keep_fp32 == ["relu"]
    p = _run("optimize", str(m), "-o", str(tmp_path / "b.onnx"), "--atc", str(tmp_path / "kb"), *common)
    assert p.returncode == 0, p.stderr
    names = {n.name for n in onnx.load(tmp_path / "b.onnx").graph.node}
    assert "relu" not in names  # fused with the Conv (portable emit renames the inlined Relu)
    assert read_kit(tmp_path / "kb").keep_fp32 == [] and "keep-list: 1 node(s)" in p.stderr


def test_an_input_name_atc_cannot_write_is_refused_by_name(tmp_path):
    """ATC's --input_shape separates inputs with ';', a name from its dims with ':' and dims with
    ',': an input named with one of them cannot be given to ATC (the kit would be wrong)."""
    for name in ("a;b", "a:b", "a,b"):
        m = tmp_path / "m.onnx"
        onnx.save(make_model([helper.make_node("Relu", [name], ["y"])], {name: [1, 3]}, {"y": [1, 3]}, opset=13), m)
        p = _run("atc", str(m), "-o", str(tmp_path / "kit"))
        assert p.returncode == 2 and f"'{name}'" in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert not (tmp_path / "kit").exists()
