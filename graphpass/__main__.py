"""``python -m graphpass``: the same as the ``graphpass`` command."""

import sys

from graphpass.cli import main

sys.exit(main())
