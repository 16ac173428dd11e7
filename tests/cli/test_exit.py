"""The process entry point (``python -m graphpass``, the ``graphpass`` script) ends without the
interpreter's teardown (graphpass.cli.exit_now): everything a reader can see is out first -
stdout and stderr when piped (Python's buffers and C's), the report, the model, the atexit
functions - and the exit code is main's; under a profiler the ordinary exit is taken."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graphpass.testing import make_model

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
import atexit, ctypes, os, sys
from pathlib import Path

print("x" * 100_000, end="")        # more than a pipe holds: part of it still in sys.stdout's buffer
sys.stderr.write("e" * 20_000)
ctypes.CDLL(None).printf(b"from C\\n")  # C's stdio: fully buffered on a pipe


@atexit.register
def _at_exit():
    Path({mark!r}).write_text("atexit ran")
    ctypes.CDLL(None).printf(b"from C at exit\\n")  # after anything that flushed C's stdio on the way


class _Teardown:
    def __del__(self, write=os.write):
        write(2, b"teardown ran\\n")


_keep = _Teardown()
'''

ORDINARY = "import sys; from graphpass.cli import main; sys.exit(main())"
#: the plugin's code run in __main__ before the entry point, not as a --plugin (a loaded plugin
#: takes the ordinary exit: test_a_plugin_s_teardown_still_runs)
_PRELUDE = "import sys; exec(open(sys.argv.pop(1)).read()); "
FAST = _PRELUDE + "from graphpass.cli import run; run()"
ORDINARY_AFTER_PRELUDE = _PRELUDE + ORDINARY


def _python_text(out: str) -> str:
    """What Python printed: C's lines taken out (the two buffers reach the pipe in either order), timings blanked."""
    return re.sub(r"\(\d+\.\d+ s\)", "(s)", out.replace("from C at exit\n", "").replace("from C\n", ""))


def _model(path: Path) -> None:
    w = np.linspace(-1, 1, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    onnx.save(make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]}, {"w": w}), path)


def _run(tmp_path: Path, head: list[str], out: str, *extra: str, prelude: bool = False) -> subprocess.CompletedProcess:
    """``head`` run on a small model with the plugin's code: as a --plugin, or (``prelude``) run
    in __main__ first, its path the first argument (FAST, ORDINARY_AFTER_PRELUDE)."""
    src = tmp_path / "m.onnx"
    if not src.exists():
        _model(src)
    (tmp_path / "plug.py").write_text(PLUGIN.format(mark=str(tmp_path / f"{out}.atexit")))
    plugin = [str(tmp_path / "plug.py")] if prelude else []
    cmd = [*head, *plugin, "optimize", str(src), "-o", str(tmp_path / f"{out}.onnx"), "--report",
           str(tmp_path / f"{out}.json"), *([] if prelude else ["--plugin", str(tmp_path / "plug.py")]), *extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as for a user
    return subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_fast_exit_leaves_every_output_complete(tmp_path):
    fast = _run(tmp_path, ["-c", FAST], "fast", prelude=True)
    ordinary = _run(tmp_path, ["-c", ORDINARY_AFTER_PRELUDE], "ordinary", prelude=True)
    assert fast.returncode == ordinary.returncode == 0, fast.stderr[-2000:]
    # the teardown ran in the ordinary exit and not in the fast one (the fast path was taken)
    assert "teardown ran" in ordinary.stderr and "teardown ran" not in fast.stderr
    # the same bytes on both streams otherwise: Python's buffers and C's were flushed
    assert "x" * 100_000 in fast.stdout and "e" * 20_000 in fast.stderr
    assert "from C\n" in fast.stdout and fast.stdout.endswith("from C at exit\n")
    assert _python_text(fast.stdout.replace(str(tmp_path / "fast"), str(tmp_path / "ordinary"))) == _python_text(
        ordinary.stdout)
    assert fast.stderr == ordinary.stderr.replace("teardown ran\n", "")
    assert f"wrote {tmp_path / 'fast.onnx'}\n" in fast.stdout
    for name in ("fast", "ordinary"):
        assert (tmp_path / f"{name}.atexit").read_text() == "atexit ran"
        assert json.loads((tmp_path / f"{name}.json").read_text())["passes"]
        onnx.checker.check_model(onnx.load(tmp_path / f"{name}.onnx"), full_check=True)
    assert (tmp_path / "fast.onnx").read_bytes() == (tmp_path / "ordinary.onnx").read_bytes()


def test_fast_exit_keeps_the_exit_code_and_the_one_line_error(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    p = subprocess.run([sys.executable, "-m", "graphpass", "optimize", str(tmp_path / "bad.onnx"), "-o",
                        str(tmp_path / "o.onnx")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("graphpass: error: "), p.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


def test_a_profiler_gets_the_ordinary_exit(tmp_path):
    """cProfile writes its file at exit: the fast exit would lose it."""
    prof = tmp_path / "prof.out"
    p = _run(tmp_path, ["-m", "cProfile", "-o", str(prof), "-m", "graphpass"], "profiled", "-q")
    assert p.returncode == 0, p.stderr[-2000:]
    assert prof.stat().st_size > 0 and "teardown ran" in p.stderr


def test_a_reader_that_goes_away(tmp_path):
    """``graphpass passes | head -1``: exit 0, nothing on stderr, as before."""
    p = subprocess.Popen([sys.executable, "-m", "graphpass", "passes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0 and err == b""


TEARDOWN_PLUGIN = '''
import tempfile

_log = open({log!r}, "w")  # never closed: the interpreter's teardown flushes and closes it
_log.write("written by the plugin, flushed at exit")
_tmp = tempfile.NamedTemporaryFile(dir={tmp!r})  # removed when finalized at exit
'''


def test_a_plugin_s_teardown_still_runs(tmp_path):
    """A user's plugin may leave work to the interpreter's teardown (an unclosed file's buffer, a
    NamedTemporaryFile removed when finalized): with a plugin loaded, the process takes the
    ordinary exit, or that data is lost and the temporary file left behind (main before the
    fast exit wrote and removed them)."""
    _model(tmp_path / "m.onnx")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / "plugin.log"
    (tmp_path / "tear.py").write_text(TEARDOWN_PLUGIN.format(log=str(log), tmp=str(tmp)))
    p = subprocess.run([sys.executable, "-m", "graphpass", "optimize", str(tmp_path / "m.onnx"), "-o",
                        str(tmp_path / "o.onnx"), "-q", "--plugin", str(tmp_path / "tear.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert log.read_text() == "written by the plugin, flushed at exit"
    assert os.listdir(tmp) == []
