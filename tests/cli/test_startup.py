"""What a run pays for before and after its work: the modules ``graphpass optimize`` imports
(the data of other verbs is not read), and the help that is made only when shown."""

import subprocess
import sys

import numpy as np
import onnx
from onnx import helper

from graphpass.cli import main
from graphpass.testing import make_model

#: modules of other verbs that an optimize without their options must not import
NOT_FOR_OPTIMIZE = ("graphpass.cost_model.cann", "graphpass.atc")
#: the check layer's runners and analysis: an optimize that folds nothing through onnxruntime
#: and verifies nothing does not import them (fold_constants imports verify on its first session)
NOT_FOR_PLAIN_OPTIMIZE = ("graphpass.check.verify", "graphpass.check.precision", "onnxruntime")

_LIST = "import sys; from graphpass.cli import main; rc = main(sys.argv[1:]); print(' '.join(sorted(sys.modules)))"


def _model(path):
    w = np.ones((2, 3, 1, 1), np.float32)
    onnx.save(make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": [1, 3, 4, 4]}, {"y": [1, 2, 4, 4]},
                         {"w": w}), path)


def test_optimize_does_not_read_other_verbs_data(tmp_path):
    _model(tmp_path / "m.onnx")
    p = subprocess.run([sys.executable, "-c", _LIST, "optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"),
                        "-q"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    modules = set(p.stdout.split())
    assert "graphpass.passes.framework.manager" in modules  # the list is the run's
    assert not modules & set(NOT_FOR_OPTIMIZE)
    assert not modules & set(NOT_FOR_PLAIN_OPTIMIZE)


def test_precision_analysis_still_finds_the_mixed_precision_conversion():
    """``import graphpass`` registers the conversion the precision analysis checks on without
    importing the analysis; the analysis, imported later, finds it (and register_converter
    still replaces it)."""
    code = ("import sys, graphpass, graphpass.api as api; assert 'graphpass.check.precision' not in sys.modules; "
            "from graphpass.check import precision as P; import graphpass.check as C; "
            "assert C.converter is api._mixed_precision_conversion; f = lambda m, mode, keep: m; "
            "assert P.register_converter(f) is f and C.converter is f; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.split() == ["ok"], p.stderr


def test_cann_version_help_is_made_when_shown(capsys):
    from graphpass.cost_model import cann

    for verb in ("optimize", "atc"):
        try:
            main([verb, "--help"])
        except SystemExit as e:
            assert e.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"({', '.join(cann.releases())}; default the newest documented, {cann.NEWEST})" in out
        assert "computed when shown" not in out


def test_optimize_with_atc_still_checks_the_release(tmp_path, capsys):
    _model(tmp_path / "m.onnx")
    rc = main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--atc", str(tmp_path / "k"),
               "--cann-version", "1.0"])
    assert rc == 2 and not (tmp_path / "o.onnx").exists()
    assert "1.0" in capsys.readouterr().err


_IMPORT = """
import gc, sys
before = sys.argv[1]
if before == "disabled":
    gc.disable()
if before == "frozen":
    keep = [[] for _ in range(100)]
    gc.freeze()
frozen = gc.get_freeze_count()
runs = []
# from the first module graphpass imports on (compiling its own __init__ without a .pyc may collect)
gc.callbacks.append(lambda phase, info: runs.append(1) if phase == "start" and "graphpass._compat" in sys.modules else None)
import graphpass
still_frozen = gc.get_freeze_count() > 0 and not any(o is keep for o in gc.get_objects()) if frozen else None
print(len(runs), gc.isenabled(), gc.get_freeze_count() == 0 if not frozen else still_frozen)
"""


def test_import_pauses_the_collector_and_puts_it_back():
    """``import graphpass`` runs no collection (its ~65k objects all stay alive) and leaves the
    collector as it found it: on, off, or with the caller's objects frozen (then what the import
    made stays young: one young collection at most, once the collector is back on)."""
    for before, runs, enabled in (("enabled", "0", "True"), ("disabled", "0", "False"), ("frozen", "1", "True")):
        p = subprocess.run([sys.executable, "-c", _IMPORT, before], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        out = p.stdout.split()
        assert int(out[0]) <= int(runs) and out[1:] == [enabled, "True"], (before, p.stdout)


def _parse(parser, argv, capsys):
    try:
        out = ("ok", vars(parser.parse_args(argv)))
    except SystemExit as e:
        out = ("exit", e.code)
    captured = capsys.readouterr()
    return out, captured.out, captured.err


def test_the_optimize_parser_alone_parses_helps_and_refuses_as_the_whole_one(capsys):
    """main builds only the optimize verb's parser for a command line that starts with it."""
    from graphpass.cli import build_parser

    cases = [["optimize", "m.onnx", "-o", "o.onnx"],
             ["optimize", "a.onnx", "b.onnx", "-o", "out", "-q", "--profile", "--input-shape", "x:1,3", "--dim", "N=2",
              "--disable", "fold_constants", "--layout", "greedy", "--explain=", "--emit", "device", "-vv"],
             ["optimize", "m.onnx", "-o", "o.onnx", "--mixed-precision", "must_keep_origin_dtype", "--keep-fp32", "auto"],
             ["optimize", "--help"], ["optimize"], ["optimize", "m.onnx"], ["optimize", "m.onnx", "-o", "o", "--bogus"],
             ["optimize", "m.onnx", "-o", "o", "--layout", "sideways"], ["optimize", "m.onnx", "-o", "o", "--max-rounds", "0"],
             ["optimize", "m.onnx", "-o", "o", "--mixed-precision", "no_such_mode"]]
    for argv in cases:
        whole = _parse(build_parser(), argv, capsys)
        alone = _parse(build_parser("optimize"), argv, capsys)
        assert alone == whole, argv
    assert "usage: graphpass optimize" in _parse(build_parser("optimize"), ["optimize", "--help"], capsys)[1]
