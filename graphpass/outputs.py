"""Files a command writes: staged in temporaries, moved into place only when the run succeeded.

``graphpass optimize`` writes the model (and its external data), the report and the per-pass
dumps. Each goes first into a hidden staging folder beside its final place (same file system,
so the final move is an atomic ``os.replace``); :meth:`Outputs.commit` moves them all once
verification passed, :meth:`Outputs.discard` removes every temporary. Used as a context manager
the set discards on any exception, so a failed or interrupted run (exit 1, 2, 3, SIGTERM,
Ctrl-C) leaves no file it created behind.

Output paths are checked before any work: an existing path must be a regular file (a FIFO or a
device node is refused, never replaced), the folder must exist and be writable.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

from graphpass.errors import UsageError, write_error  # noqa: F401  (write_error: re-exported)

__all__ = ["Outputs", "check_output_file", "check_output_folder", "write_error", "blocked_signals",
           "write_text_atomic"]

#: Prefix of every staging folder (hidden, so a listing of the output folder shows none).
STAGING_PREFIX = ".graphpass-"


def check_output_folder(folder: Path, what: str = "output folder", may_not_exist: bool = False) -> Path:
    """``folder`` exists, is a folder and is writable, else UsageError (exit 2).

    ``may_not_exist``: a missing folder is fine if the nearest folder above it that exists is
    writable (it is created on commit).
    """
    folder = folder if str(folder) else Path(".")
    if may_not_exist and not folder.exists() and not folder.is_symlink():
        check_output_folder(_nearest_existing(folder), f"folder above {what} '{folder}'")
        return folder
    if not folder.exists():
        raise UsageError(f"{what} '{folder}' does not exist")
    if not folder.is_dir():
        raise UsageError(f"{what} '{folder}' is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what} '{folder}' is not writable")
    return folder


def check_output_file(path: str | os.PathLike, what: str = "output path") -> Path:
    """Refuse an output path graphpass must not replace: a folder, a FIFO, a device, a socket.

    A missing path is fine (its folder must exist and be writable); an existing regular file
    (or a symlink to one) is replaced.
    """
    p = Path(path)
    if not p.name or p.name in (".", ".."):
        raise UsageError(f"{what} '{p}' names no file")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"{what} '{p}': {e.strerror}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} '{p}' is a folder")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} '{p}' exists and is not a regular file (a device, FIFO or socket); "
                             "graphpass does not write to it")
    check_output_folder(p.parent, f"folder of {what} '{p}'")
    return p


class blocked_signals:
    """SIGTERM and SIGINT held back for the duration (the final renames are not interrupted)."""

    SIGNALS = {signal.SIGTERM, signal.SIGINT}

    def __enter__(self):
        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
        return False


class _Stage:
    """One staging folder; its top-level files go to ``target`` (a folder) on commit."""

    def __init__(self, target: Path, parent: Path):
        self.target = target
        self.dir = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))

    def files(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if p.is_file() and not p.name.startswith("."))


class Outputs:
    """The set of files one run writes; nothing appears at a final path before :meth:`commit`.

    Use :meth:`file` for a file (model, report), :meth:`folder` for a folder whose files
    are written one by one (the dumps). Both return a temporary path to write to.
    """

    def __init__(self):
        self._stages: list[_Stage] = []
        self.committed: list[Path] = []

    # -- staging ---------------------------------------------------------------------------

    def file(self, final: str | os.PathLike) -> Path:
        """A temporary path to write ``final`` to; files written beside it (``<name>.data``) follow it."""
        final = check_output_file(final)
        data = final.with_name(final.name + ".data")  # where external data would go
        if data.exists() or data.is_symlink():
            check_output_file(data, "external data path")
        parent = final.parent if str(final.parent) else Path(".")
        try:
            stage = _Stage(parent, parent)
        except OSError as e:
            raise write_error(final, e) from None
        self._stages.append(stage)
        return stage.dir / final.name

    def folder(self, final: str | os.PathLike) -> Path:
        """A temporary folder whose files go into ``final`` (created on commit if missing)."""
        final = Path(final)
        check_output_folder(final, "folder", may_not_exist=True)
        anchor = final if final.exists() else _nearest_existing(final)
        try:
            stage = _Stage(final, anchor)
        except OSError as e:
            raise write_error(final, e) from None
        self._stages.append(stage)
        return stage.dir

    # -- the end of the run ----------------------------------------------------------------

    def commit(self) -> list[Path]:
        """Move every staged file into place (signals held back meanwhile); returns the final paths."""
        with blocked_signals():
            try:
                for stage in self._stages:
                    files = stage.files()
                    if not files:
                        continue
                    stage.target.mkdir(parents=True, exist_ok=True)
                    for f in files:
                        dst = stage.target / f.name
                        if dst.exists() and not dst.is_file():
                            raise UsageError(f"'{dst}' exists and is not a regular file; graphpass does not replace it")
                        os.replace(f, dst)
                        self.committed.append(dst)
            except OSError as e:
                raise write_error(stage.target, e) from None
            finally:
                self.discard()
        return self.committed

    def discard(self) -> None:
        """Remove every staging folder and what is in it."""
        for stage in self._stages:
            shutil.rmtree(stage.dir, ignore_errors=True)
        self._stages = []

    def __enter__(self) -> "Outputs":
        return self

    def __exit__(self, *exc) -> bool:
        self.discard()
        return False


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to a temp file beside ``path``, then rename it into place.

    Over the one atomic writer of graphpass (:func:`graphpass.ir.files.atomic_output`): a reader never sees half a
    file, and a failed write leaves the old file as it was.

    Raises:
        UsageError: the path is not a writable regular file, or the write failed (exit 2).
    """
    from graphpass.ir.files import write_text_atomic as write

    path = Path(path)
    check_output_file(path)
    try:
        write(path, text)
    except OSError as e:
        raise write_error(path, e) from None


def _nearest_existing(p: Path) -> Path:
    for q in [p, *p.parents]:
        if q.exists():
            return q
    return Path(".")
