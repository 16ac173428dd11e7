"""``python -m graphpass``: the same as the ``graphpass`` command."""

from graphpass.cli import run

run()
