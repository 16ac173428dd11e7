"""Issue 23: one progress display (rich) for every verb, on stderr, only on a terminal and on
long runs; never with -q or in CI; stdout carries the report alone."""

import argparse
import io
from pathlib import Path

import pytest

from graphpass import cli
from graphpass.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "models" / "shufflenet_v2_x0_5.onnx")


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("quiet,env,tty,wanted", [
    (False, {}, True, True),
    (True, {}, True, False),
    (False, {"CI": "true"}, True, False),
    (False, {"TERM": "dumb"}, True, False),
    (False, {}, False, False),
])
def test_progress_only_on_a_terminal_without_quiet_or_ci(quiet, env, tty, wanted, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(cli.sys, "stderr", _Tty() if tty else io.StringIO())
    assert cli._progress_wanted(argparse.Namespace(quiet=quiet)) is wanted


@pytest.mark.parametrize("verb", ["optimize", "cost"])
def test_the_progress_goes_to_stderr_and_stdout_holds_the_report_alone(verb, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)  # every run is long
    err = _Tty()
    monkeypatch.setattr(cli.sys, "stderr", err)
    argv = ["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx")] if verb == "optimize" else ["cost", EXAMPLE]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "0:00:0" not in out  # no spinner, no elapsed time, no control code
    assert out.startswith("graphpass optimize" if verb == "optimize" else "cost estimate")
    assert "0:00:0" in err.getvalue()  # the elapsed-time column was drawn on stderr


def test_quiet_shows_no_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)
    err = _Tty()
    monkeypatch.setattr(cli.sys, "stderr", err)
    assert main(["optimize", EXAMPLE, "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    assert capsys.readouterr().out == "" and err.getvalue() == ""


def test_the_display_ends_before_the_first_line_of_the_report(monkeypatch, capsys):
    import time

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)
    err = _Tty()
    monkeypatch.setattr(cli.sys, "stderr", err)
    with cli._Progress(argparse.Namespace(quiet=False), "cost") as p:
        for _ in range(100):  # the timer thread starts the display
            if p._progress.live.is_started:
                break
            time.sleep(0.01)
        assert p._progress.live.is_started
        print("report line")
        assert not p._progress.live.is_started  # stopped by the write, before it reached stdout
        drawn = err.getvalue()
        print("second line")
    assert capsys.readouterr().out == "report line\nsecond line\n"
    assert err.getvalue() == drawn  # nothing drawn after the report began
