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
