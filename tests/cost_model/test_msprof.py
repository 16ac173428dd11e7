"""graphpass calibrate: msprof op_summary timings -> a corrected target file (issue 21)."""

import csv

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cli import main
from graphpass.cost_model import get_target
from graphpass.cost_model.msprof import COLUMNS, read_op_summary
from graphpass.testing import make_model

F16 = TensorProto.FLOAT16
#: measured / estimated per op type: every type its own error
FACTORS = {"Conv": 2.0, "MaxPool": 0.5, "Transpose": 3.0, "Softmax": 1.3}


@pytest.fixture()
def model(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c2"], ["t"], name="transpose1", perm=[0, 2, 3, 1]),
             helper.make_node("Softmax", ["t"], ["y"], name="softmax1", axis=-1)]
    m = make_model(nodes, {"x": (F16, [4, 32, 32, 32])}, {"y": (F16, [4, 16, 16, 64])},
                   initializers={"w": np.zeros((32, 32, 3, 3), np.float16), "w2": np.zeros((64, 32, 3, 3), np.float16)})
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def _write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Device_id", "Model Name", "Op Name", "OP Type", "Task Type", "Task Start Time(us)", "Task Duration(us)",
                    "Task Wait Time(us)", "Block Dim"])
        for i, (name, op_type, us) in enumerate(rows):
            w.writerow([0, "m", name, op_type, "AI_CORE", 1000.0 + i, f"{us:.3f}", 0.1, 8])


def _measured(model, tmp_path, target="ascend310p3"):
    """A CSV of what the chip 'measured': each node's estimate times its op type's factor; two
    inferences (each op twice); conv2 under an unknown name (matched by its Ascend type)."""
    r = get_target(target).estimate(gp.load(str(model)).graph)
    rows, truth = [], {}
    for n in r.nodes:
        if n["us"] > 0 and n["op"] in FACTORS:
            us = n["us"] * FACTORS[n["op"]]
            name = n["name"] if n["name"] != "conv2" else "trans_Conv2D_7"
            op_type = {"Conv": "Conv2D", "MaxPool": "MaxPool", "Transpose": "TransposeD", "Softmax": "SoftmaxV2"}[n["op"]]
            rows += [(name, op_type, us * 0.99), (name, op_type, us * 1.01)]
            truth[n["op"]] = truth.get(n["op"], 0.0) + us
    path = tmp_path / "op_summary_0_1.csv"
    _write_csv(path, rows)
    return path, truth


def test_calibrate_writes_a_target_with_which_each_op_types_total_is_the_measured_one(model, tmp_path, capsys):
    csv_path, truth = _measured(model, tmp_path)
    out = tmp_path / "ascend310p3.calibrated.toml"
    assert main(["calibrate", str(model), str(csv_path), "--target", "ascend310p3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Conv" in text and "wrote" in text
    before = get_target("ascend310p3").estimate(gp.load(str(model)).graph).per_op_us
    after = get_target(str(out)).estimate(gp.load(str(model)).graph).per_op_us
    assert set(truth) == set(FACTORS)
    for op, us in truth.items():
        assert after[op] == pytest.approx(us, rel=0.05), op
        assert before[op] != pytest.approx(us, rel=0.05), op  # the errors were real, per type
    # the corrected file is a valid profile of the same chip; calibrating it again changes nothing
    out2 = tmp_path / "again.toml"
    assert main(["calibrate", str(model), str(csv_path), "--target", str(out), "-o", str(out2)]) == 0
    again = get_target(str(out2)).estimate(gp.load(str(model)).graph).per_op_us
    for op, us in truth.items():
        assert again[op] == pytest.approx(us, rel=0.05), op


def test_a_csv_without_the_documented_columns_is_one_line_and_exit_2(model, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("Op Name,Duration\nconv1,3.0\n")
    assert main(["calibrate", str(model), str(bad), "--target", "ascend310p3", "-o", str(tmp_path / "o.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OP Type" in err[0] and "Task Duration(us)" in err[0]


def test_a_bad_duration_names_its_row(tmp_path):
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("conv1", "Conv2D", 3.0)])
    p.write_text(p.read_text().replace("3.000", "n/a"))
    with pytest.raises(gp.UsageError, match="row 2"):
        read_op_summary(p)
    assert set(COLUMNS) <= set(p.read_text().splitlines()[0].split(","))


# --- hostile review (attack2) ---------------------------------------------------------------

@pytest.mark.parametrize("duration", ["nan", "inf", "-inf", "1e400"])
def test_a_non_finite_duration_names_its_row_exit_2(model, tmp_path, capsys, duration):
    """A NaN or infinite Task Duration was accepted: the table showed nan/inf and the corrected
    file silently lacked the op type's factor (exit 0)."""
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("conv1", "Conv2D", 3.0)])
    p.write_text(p.read_text().replace("3.000", duration))
    out = tmp_path / "o.toml"
    assert main(["calibrate", str(model), str(p), "--target", "ascend310p3", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row 2" in err[0], err
    assert not out.exists()


def test_durations_whose_sum_overflows_are_exit_2(model, tmp_path, capsys):
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("conv1", "Conv2D", 1.5e308), ("conv1", "Conv2D", 1.5e308)])
    out = tmp_path / "o.toml"
    assert main(["calibrate", str(model), str(p), "--target", "ascend310p3", "-o", str(out)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_csv_that_matches_no_node_is_exit_2_and_writes_nothing(model, tmp_path, capsys):
    """An op summary of another model (no name, no Ascend type matches) wrote an uncalibrated copy
    of the target and exited 0."""
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("other_op", "FooBar", 3.0), ("another", "BarBaz", 1.0)])
    out = tmp_path / "o.toml"
    assert main(["calibrate", str(model), str(p), "--target", "ascend310p3", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matched no node" in err[0], err
    assert not out.exists()


def test_the_calibrated_file_is_accepted_by_optimize_and_bisect(model, tmp_path, capsys):
    """calibrate says 'use it with --target FILE', but optimize's --target took only the known
    names (argparse choices): exit 2 'invalid choice'."""
    csv_path, _ = _measured(model, tmp_path)
    out = tmp_path / "mine.toml"
    assert main(["calibrate", str(model), str(csv_path), "--target", "ascend310p3", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", str(out)]) == 0
    assert (tmp_path / "o.onnx").is_file()
    # an unknown name is still one line, exit 2
    assert main(["optimize", str(model), "-o", str(tmp_path / "o2.onnx"), "--target", "ascend999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ascend999" in err[0]


@pytest.mark.parametrize("bad", ["non_utf8", "nan_value", "inf_value", "inf_scale", "nan_scale"])
def test_a_bad_target_file_is_one_line_exit_2(model, tmp_path, capsys, bad):
    """A target file that is not UTF-8 crashed (exit 3); NaN/inf hardware numbers or op_scale
    factors were accepted and the estimate came out nan/inf us."""
    base = get_target("ascend310p3").profile.path.read_text(encoding="utf-8")
    f = tmp_path / "t.toml"
    if bad == "non_utf8":
        f.write_bytes(b"\xff\xfe" + base.encode("utf-16-le"))
    elif bad in ("nan_value", "inf_value"):
        import re

        text, n = re.subn(r"(\[cube_freq_mhz\][^\[]*?value = )[-0-9.e+]+", r"\g<1>" + bad[:3], base, count=1, flags=re.S)
        assert n == 1
        f.write_text(text)
    else:
        f.write_text(base + f'\n[op_scale]\n"Conv" = {bad[:3]}\n')
    assert main(["cost", str(model), "--target", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.toml" in err[0], err


def _dynamic_model(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu1")]
    m = make_model(nodes, {"x": (F16, ["batch", 32, 32, 32])}, {"y": (F16, ["batch", 32, 32, 32])},
                   initializers={"w": np.zeros((32, 32, 3, 3), np.float16)})
    path = tmp_path / "dyn.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_calibrating_a_model_with_a_symbolic_batch_names_it_exit_2(tmp_path, capsys):
    """The op summary was profiled at one batch; calibrate estimated the model at an assumed
    batch of 1 without a word and wrote factors off by the batch (and took no --dim)."""
    model = _dynamic_model(tmp_path)
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("conv1", "Conv2D", 40.0)])
    out = tmp_path / "o.toml"
    assert main(["calibrate", str(model), str(p), "--target", "ascend310p3", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch" in err[0] and "--dim" in err[0], err
    assert not out.exists()
    # fixed either way, it calibrates; the batch the CSV was profiled at is what the estimate takes
    totals = {}
    for flag in (["--dim", "batch=8"], ["--input-shape", "x:8,32,32,32"]):
        o = tmp_path / f"{flag[0][2:]}.toml"
        assert main(["calibrate", str(model), str(p), "--target", "ascend310p3", "-o", str(o), *flag]) == 0
        totals[flag[0]] = get_target(str(o)).estimate(gp.load(str(model), dims={"batch": 8}).graph).per_op_us["Conv"]
    assert totals["--dim"] == pytest.approx(40.0, rel=0.01) and totals["--input-shape"] == pytest.approx(40.0, rel=0.01)


def test_an_op_type_measured_but_estimated_at_zero_is_named(tmp_path, capsys):
    """A Relu the estimate fuses into its Conv (0 us) but the chip ran on its own: its measured
    time was printed with a ratio of 0.00 and silently given no factor."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu1")]
    m = make_model(nodes, {"x": (F16, [4, 32, 32, 32])}, {"y": (F16, [4, 32, 32, 32])},
                   initializers={"w": np.zeros((32, 32, 3, 3), np.float16)})
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    est = get_target("ascend310p3").estimate(gp.load(str(path)).graph).per_op_us
    assert est.get("Relu", 0.0) == 0.0 and est["Conv"] > 0  # the premise: the estimate fuses the Relu
    p = tmp_path / "op_summary.csv"
    _write_csv(p, [("conv1", "Conv2D", 30.0), ("relu1", "Relu", 4.0)])
    assert main(["calibrate", str(path), str(p), "--target", "ascend310p3", "-o", str(tmp_path / "o.toml")]) == 0
    out = capsys.readouterr().out
    note = [ln for ln in out.splitlines() if "Relu" in ln and "no factor" in ln]
    assert note, out
