import json
import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from graphpass.cli import main, parse_input_shapes
from graphpass.ir import external, model_io
from graphpass.testing import make_model

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "shufflenet_v2_x0_5.onnx")


def test_optimize_the_shipped_example_prints_report_and_writes_reports(tmp_path, capsys):
    out = tmp_path / "s.onnx"
    code = main(["optimize", EXAMPLE, "-o", str(out), "--input-shape", "input:1,3,224,224",
                 "--report", str(tmp_path / "r.json"), "--verify"])
    text = capsys.readouterr().out
    assert code == 0
    assert "fold_constants" in text and "op histogram" in text and "verified with onnxruntime" in text
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "graphpass.optimize_report/1"
    assert report["nodes"]["after"] < report["nodes"]["before"]
    assert report["ops"]["Shape"]["after"] == 0  # every dynamic shape chain folded away
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert main(["optimize", EXAMPLE, "-o", str(out), "-q", "--report", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("### graphpass optimize")


def test_passes_lists_every_pass(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name in ("fold_constants", "eliminate_dead_nodes", "specialize_shapes", "merge_transposes"):
        assert name in out


def test_inspect_shows_dynamic_dims_and_ops(capsys):
    assert main(["inspect", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "dynamic dims: input[0]=N" in out and "Conv" in out and "opsets: ai.onnx=13" in out


def test_verify_passes_same_model_and_fails_perturbed_one(tmp_path, capsys):
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [3]}, {"y": [3]},
                       initializers={"w": np.ones(3, np.float32)})
    a = tmp_path / "a.onnx"
    a.write_bytes(model.SerializeToString())
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.array([1, 1, 1.5], np.float32), "w"))
    b = tmp_path / "b.onnx"
    b.write_bytes(model.SerializeToString())
    assert main(["verify", str(a), str(a)]) == 0
    assert main(["verify", str(a), str(b)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_disable_and_passes_options(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", EXAMPLE, "-o", str(out), "--passes", "eliminate_identity", "-v"]) == 0
    text = capsys.readouterr().out
    assert "eliminate_identity" in text and "fold_constants" not in text
    assert main(["optimize", EXAMPLE, "-o", str(out), "--disable", "fold_constants,eliminate_identity"]) == 0
    assert "disabled: fold_constants, eliminate_identity" in capsys.readouterr().out


def test_parse_input_shapes():
    assert parse_input_shapes(["x:1,3,224,224", "ns:scope/y:4"]) == {"x": [1, 3, 224, 224], "ns:scope/y": [4]}
    assert parse_input_shapes(["x:1x3x224x224", "s:"]) == {"x": [1, 3, 224, 224], "s": []}  # D1xD2..., a scalar


@pytest.mark.parametrize("values, says", [
    (["a:3,x"], "empty dimension"),            # was read as a:3 (rank 1): 'x' is a separator
    (["a:3,,4"], "empty dimension"),
    (["a:1,3", "a:2,3"], "given twice"),       # was: the last one silently
    (["a:1,3 a:1,3"], "given twice"),
])
def test_an_input_shape_with_an_empty_dim_or_given_twice_is_refused(values, says):
    from graphpass.errors import UsageError

    with pytest.raises(UsageError, match=says):
        parse_input_shapes(values)


# -- nothing left behind, exit codes, onnxruntime's logs (issue 18) ------------------------------


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _add_model(tmp_path, name="m.onnx"):
    """y = x + w (one Identity for a pass to remove, so a dump is written)."""
    model = make_model([helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Add", ["i", "w"], ["y"])],
                       {"x": [3]}, {"y": [3]}, initializers={"w": np.array([1, 2, 3], np.float32)})
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def _perturbing_save(monkeypatch, corrupt=False):
    """model_io.save that writes a wrong model (w changed), or bytes onnxruntime cannot load."""
    real = model_io.save

    def save(graph, path, *a, **k):
        out = real(graph, path, *a, **k)
        if "_" not in path.name[:4]:  # the output, not a dump (001_name.onnx)
            if corrupt:
                out.write_bytes(b"\x08\x07garbage")
            else:
                m = onnx.load(out)
                for init in m.graph.initializer:
                    init.CopyFrom(onnx.numpy_helper.from_array(np.array([9, 9, 9], np.float32), init.name))
                out.write_bytes(m.SerializeToString())
        return out

    monkeypatch.setattr(model_io, "save", save)


def test_failed_verify_leaves_no_output_report_or_dumps(tmp_path, monkeypatch, capsys):
    src = _add_model(tmp_path)
    before = _listing(tmp_path)
    _perturbing_save(monkeypatch)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "--report", str(tmp_path / "r.json"),
                 "--dump-dir", str(tmp_path / "dumps"), "-q"])
    assert code == 1
    assert "differs" in capsys.readouterr().err
    assert _listing(tmp_path) == before


def test_output_onnxruntime_cannot_load_is_a_failed_verification_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    src = _add_model(tmp_path)
    before = _listing(tmp_path)
    _perturbing_save(monkeypatch, corrupt=True)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "-q"])
    err = capsys.readouterr().err
    # the written model fails the ONNX checker while the input passes it: graphpass's bug (exit 3),
    # caught before verification, and nothing is left behind
    assert code == 3, err
    assert "wrote a model the ONNX checker refuses" in err and len(err.strip().splitlines()) == 1
    assert _listing(tmp_path) == before


def test_keep_failed_keeps_everything_and_says_where(tmp_path, monkeypatch, capsys):
    src = _add_model(tmp_path)
    _perturbing_save(monkeypatch)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "--keep-failed",
                 "--report", str(tmp_path / "r.json"), "--dump-dir", str(tmp_path / "dumps"), "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert (tmp_path / "o.onnx").is_file() and list((tmp_path / "dumps").glob("*.onnx"))
    assert "--keep-failed: kept" in err and str(tmp_path / "o.onnx") in err
    assert not (tmp_path / "r.json").exists()  # the report is written after verification only
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_dumps_left_on_bad_input_exit_2(tmp_path, capsys):
    """The input runs in graphpass but not in onnxruntime: --verify exits 2, dumps written
    during the passes are removed."""
    model = make_model([helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Reshape", ["i", "s"], ["y"])],
                       {"x": ["N"]}, {"y": [5]}, initializers={"s": np.array([5], np.int64)})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    before = _listing(tmp_path)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "--dump-dir", str(tmp_path / "d"), "-q"])
    assert code == 2, capsys.readouterr().err
    assert _listing(tmp_path) == before


def test_dumps_left_on_internal_error_exit_3(tmp_path, monkeypatch, capsys):
    import graphpass.api

    src = _add_model(tmp_path)
    (tmp_path / "d").mkdir()
    before = _listing(tmp_path)

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(graphpass.api, "layout_summary", boom)  # after the passes (and their dumps)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--dump-dir", str(tmp_path / "d"), "-q"])
    assert code == 3 and "injected" in capsys.readouterr().err
    assert _listing(tmp_path) == before


def test_success_moves_dumps_report_and_model_into_place(tmp_path, capsys):
    src = _add_model(tmp_path)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--verify", "--report", str(tmp_path / "r.md"),
                 "--dump-dir", str(tmp_path / "a" / "b"), "-q"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "o.onnx").is_file() and (tmp_path / "r.md").is_file()
    assert "001_eliminate_identity.onnx" in [p.name for p in (tmp_path / "a" / "b").iterdir()]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_fifo_output_path_is_refused_not_replaced(tmp_path, capsys):
    src = _add_model(tmp_path)
    fifo = tmp_path / "out.onnx"
    os.mkfifo(fifo)
    code = main(["optimize", str(src), "-o", str(fifo), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1
    assert not fifo.is_file() and fifo.exists()  # still the FIFO


def test_fifo_as_report_or_dump_dir_is_refused(tmp_path, capsys):
    src = _add_model(tmp_path)
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(fifo), "-q"]) == 2
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--dump-dir", str(fifo), "-q"]) == 2
    assert not (tmp_path / "o.onnx").exists()


def test_unwritable_output_folder_is_exit_2(tmp_path, monkeypatch, capsys):
    """A write refused by the file system (read-only folder, full disk) is exit 2, one line."""
    import tempfile

    src = _add_model(tmp_path)

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "Permission denied" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_exit_2(tmp_path, capsys):
    src = _add_model(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(["optimize", str(src), "-o", str(ro / "o.onnx"), "-q"]) == 2
    finally:
        ro.chmod(0o755)
    assert "not writable" in capsys.readouterr().err


def test_no_space_while_saving_is_exit_2_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    import errno

    src = _add_model(tmp_path)
    before = _listing(tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(external, "_write_streaming", full)
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "o.onnx" in err
    assert _listing(tmp_path) == before


_SLOW_SAVE = """
import sys, time
from graphpass.ir import external
real = external._write_streaming
def slow(model, originals, dst):
    real(model, originals, dst)
    print("saving", flush=True)
    time.sleep(60)
external._write_streaming = slow
from graphpass.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_saving_removes_temporaries(tmp_path, sig):
    src = _add_model(tmp_path)
    before = _listing(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, "optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q",
                          "--dump-dir", str(tmp_path / "d"), "--report", str(tmp_path / "r.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "saving"
        assert _listing(tmp_path) != before  # the temporaries exist now
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _listing(tmp_path) == before


def test_external_data_is_staged_with_the_model(tmp_path):
    """A model saved with external data: both files appear only on commit, neither on discard."""
    from graphpass.outputs import Outputs

    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [512]}, {"y": [512]},
                       initializers={"w": np.arange(512, dtype=np.float32)})  # 2 KiB: external (1 KiB and more)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    graph = model_io.load(str(tmp_path / "m.onnx"))
    for commit in (False, True):
        with Outputs() as outs:
            staged = outs.file(tmp_path / "big.onnx")
            model_io.save(graph, staged, external_data=True)
            assert sorted(p.name for p in staged.parent.iterdir() if not p.name.startswith(".")) == ["big.onnx", "big.onnx.data"]
            assert not (tmp_path / "big.onnx").exists() and not (tmp_path / "big.onnx.data").exists()
            if commit:
                outs.commit()
        assert (tmp_path / "big.onnx.data").exists() == commit and (tmp_path / "big.onnx").exists() == commit
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    onnx.checker.check_model(str(tmp_path / "big.onnx"), full_check=True)


def test_absurd_input_shape_is_exit_2(tmp_path, capsys):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]}, {"y": ["N", 3]})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x:1000000000000,3", "--verify"])
    err = capsys.readouterr().err
    assert code == 2 and "1000000000000" in err and len(err.strip().splitlines()) == 1
    # dims below 2^31 whose product is too big for --verify's inputs: refused before allocating
    code = main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--input-shape", "x:2000000000,3", "--verify"])
    err = capsys.readouterr().err
    assert code == 2 and "--max-memory" in err
    assert not (tmp_path / "o.onnx").exists()


def test_corrupt_npz_inputs_are_exit_2(tmp_path, capsys):
    src = _add_model(tmp_path)
    npz = tmp_path / "in.npz"
    for data in (b"PK\x03\x04" + b"garbage" * 20, b"", b"\x93NUMPY junk"):
        npz.write_bytes(data)
        assert main(["verify", str(src), str(src), "--inputs", str(npz)]) == 2
        err = capsys.readouterr().err
        assert "in.npz" in err and len(err.strip().splitlines()) == 1


def test_diff_of_an_empty_file_is_exit_2(tmp_path, capsys):
    src = _add_model(tmp_path)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert main(["diff", str(empty), str(src)]) == 2
    assert "empty.onnx" in capsys.readouterr().err
    assert main(["diff", str(src), str(empty)]) == 2
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    assert main(["diff", str(src), str(fifo)]) == 2  # refused, not read forever


def test_onnxruntime_log_lines_stay_off_stderr_unless_verbose(tmp_path, capfd):
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": ["N"]}, {"y": [5]},
                       initializers={"s": np.array([5], np.int64)})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    assert main(["verify", str(src), str(src)]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "onnxruntime:" not in err.split("error:", 1)[0]
    assert "[E:onnxruntime" not in err
    assert main(["verify", str(src), str(src), "-v"]) == 2
    assert "[E:onnxruntime" in capfd.readouterr().err


def test_max_memory_and_freeze_initializers_reach_the_pass_context(tmp_path, monkeypatch, capsys):
    import graphpass.api
    from graphpass.cli import parse_size

    seen = []
    real = graphpass.api.PassManager

    class manager(real):
        def __call__(self, model, ctx=None):
            seen.append((ctx.max_memory, ctx.freeze_initializer_inputs))
            return super().__call__(model, ctx)

    monkeypatch.setattr(graphpass.api, "PassManager", manager)
    src = _add_model(tmp_path)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--max-memory", "512M",
                 "--freeze-initializers"]) == 0
    assert seen == [(None, False), (512 << 20, True)]  # None: the library's default budget
    assert parse_size("1G") == 1 << 30 and parse_size("4096") == 4096 and parse_size("1.5k") == 1536
    with pytest.raises(SystemExit) as e:
        main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--max-memory", "lots"])
    assert e.value.code == 2
    assert "is not a byte count" in capsys.readouterr().err


def test_cost_and_diff_refuse_a_fifo_as_output(tmp_path, capsys):
    src = _add_model(tmp_path)
    fifo = tmp_path / "report.txt"
    os.mkfifo(fifo)
    assert main(["cost", str(src), "-o", str(fifo)]) == 2
    assert main(["diff", str(src), str(src), "-o", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert not fifo.is_file()

def test_passes_lists_each_pass_promise(capsys):
    import re

    from graphpass.passes.framework.registry import all_passes

    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name, cls in all_passes().items():
        row = next(line for line in out.splitlines() if re.search(rf"\b{name}\b", line))
        assert str(cls.promise).split(" (")[0] in row, (name, row)
