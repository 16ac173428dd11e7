"""Every bad input: one line on stderr, exit code 2, no output file, no traceback."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphpass.cli import main
from graphpass.testing import make_model


def _good():
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})


def _cycle():
    m = _good()
    g = m.graph
    del g.node[:]
    g.node.extend([helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
                   helper.make_node("Relu", ["a"], ["y"], name="n3")])
    return m.SerializeToString()


def _dangling():
    m = _good()
    m.graph.node[0].input[0] = "nobody_makes_this"
    return m.SerializeToString()


def _old_opset():
    # Upsample-1 (width_scale/height_scale attributes): onnx's converter has no adapter to opset 7
    m = make_model([helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0])],
                   {"x": [1, 1, 2, 2]}, {"y": [1, 1, 4, 4]}, opset=1)
    m.ir_version = 3
    return m.SerializeToString()


def _external_outside():
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2]}, {"y": [2]},
                   initializers={"w": np.ones(2, np.float32)})
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../etc/passwd")
    return m.SerializeToString()


def _external_missing():
    m = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [2]}, {"y": [2]},
                   initializers={"w": np.ones(2, np.float32)})
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="weights.bin")
    return m.SerializeToString()


CASES = {
    "empty file": (b"", "empty file"),
    "truncated model": (_good().SerializeToString()[:-7], "not an ONNX model"),
    "random bytes": (np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(), "not an ONNX model"),
    "text file": (b"this is not a model\nat all\n", "not an ONNX model"),
    "cycle": (_cycle(), "cycle"),
    "dangling input": (_dangling(), "nobody_makes_this"),
    "opset too old": (_old_opset(), "too old"),
    "external data outside the folder": (_external_outside(), "outside the model's folder"),
    "missing external data": (_external_missing(), "missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_exits_2_with_one_line(case, tmp_path, capsys):
    data, needle = CASES[case]
    model = tmp_path / "bad.onnx"
    model.write_bytes(data)
    out = tmp_path / "out.onnx"
    code = main(["optimize", str(model), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


def test_old_opset_that_converts_is_accepted(tmp_path, capsys):
    m = make_model([helper.make_node("Not", ["x"], ["y"])], {"x": (TensorProto.BOOL, [2])},
                   {"y": (TensorProto.BOOL, [2])}, opset=1)
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    back = onnx.load(tmp_path / "o.onnx")
    assert back.opset_import[0].version == 7


def test_output_folder_missing(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(_good().SerializeToString())
    code = main(["optimize", str(model), "-o", str(tmp_path / "nope" / "out.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1


def test_missing_input_file(tmp_path, capsys):
    code = main(["optimize", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "o.onnx")])
    assert code == 2 and "no such file" in capsys.readouterr().err


def test_unknown_pass_lists_known_ones(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(_good().SerializeToString())
    code = main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--disable", "no_such_pass"])
    err = capsys.readouterr().err
    assert code == 2 and "no_such_pass" in err and "fold_constants" in err
    assert not (tmp_path / "o.onnx").exists()


def test_unknown_domain_passes_through_untouched(tmp_path, capsys):
    m = make_model([helper.make_node("Mystery", ["x"], ["a"], domain="com.vendor", alpha=1.0),
                    helper.make_node("Identity", ["a"], ["b"]), helper.make_node("Relu", ["b"], ["y"])],
                   {"x": [2]}, {"y": [2]}, extra_opsets={"com.vendor": 1})
    src = tmp_path / "m.onnx"
    src.write_bytes(m.SerializeToString())
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0
    back = onnx.load(out)
    mystery = [n for n in back.graph.node if n.op_type == "Mystery"]
    assert len(mystery) == 1 and mystery[0].domain == "com.vendor"
    assert [n.op_type for n in back.graph.node] == ["Mystery", "Relu"]


def test_input_is_never_overwritten_unless_named(tmp_path):
    src = tmp_path / "m.onnx"
    data = _good().SerializeToString()
    src.write_bytes(data)
    out = tmp_path / "o.onnx"
    assert main(["optimize", str(src), "-o", str(out), "-q"]) == 0
    assert src.read_bytes() == data
    assert main(["optimize", str(src), "-o", str(src), "-q"]) == 0  # named as the output: allowed


def test_console_script_no_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    proc = subprocess.run([sys.executable, "-m", "graphpass.cli", "optimize", str(bad), "-o", str(tmp_path / "o.onnx")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
