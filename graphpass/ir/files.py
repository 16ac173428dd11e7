"""Files: reading regular files safely, ``.npz`` inputs, output paths, and the one atomic writer.

Every file graphpass writes (models, their external data, reports) goes through
:func:`atomic_output`: it is written in a temp folder beside the target, then renamed into
place, so a reader never sees half a file and a failed write leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from graphpass.errors import BadModelError, UsageError
from graphpass.ir import limits

__all__ = ["atomic_output", "check_output_path", "read_npz", "read_regular_file", "read_regular_file_check",
           "write_text_atomic"]


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, read only if it is a regular file no larger than ``limit``
    (:func:`read_regular_file_check`)."""
    st = read_regular_file_check(path, limit, what)
    try:
        with open(path, "rb") as f:
            data = f.read(st.st_size + 1)
    except OSError as e:
        raise BadModelError(f"{path}: cannot read: {e.strerror}") from e
    if len(data) > st.st_size:
        raise BadModelError(f"{path}: the file grew while it was read")
    return data


def read_npz(path: str | os.PathLike, max_memory: int | str | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (inputs for ``verify``), read safely.

    Only from a regular file; the uncompressed sizes its zip directory declares must fit in
    ``max_memory`` before any array is read; pickled (object) arrays are refused; a corrupt
    archive or array is one :class:`BadModelError` line naming the file (and the array).
    """
    import zipfile

    p = Path(path)
    limit = limits.resolve_max_memory(max_memory)
    read_regular_file_check(p, limit, "inputs (.npz)")
    try:
        with zipfile.ZipFile(p) as z:
            members = z.infolist()
            total = sum(m.file_size for m in members)
            if total > limit:
                raise limits.over_memory(
                    f"{p}: the arrays take {total} bytes uncompressed, over the memory limit of {limit}")
    except zipfile.BadZipFile as e:
        raise BadModelError(f"{p}: not a valid .npz file ({e})") from e
    except OSError as e:
        raise BadModelError(f"{p}: cannot read: {e.strerror or e}") from e
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(p, allow_pickle=False) as data:
            for name in data.files:
                try:
                    out[name] = data[name]
                except Exception as e:  # noqa: BLE001 - corrupt member: zlib, header or length errors
                    raise BadModelError(f"{p}: array '{name}' cannot be read: {type(e).__name__}: {e}") from e
    except BadModelError:
        raise
    except Exception as e:  # noqa: BLE001 - anything else numpy raises on a damaged archive
        raise BadModelError(f"{p}: not a valid .npz file ({type(e).__name__}: {e})") from e
    return out


def read_regular_file_check(path: Path, limit: int, what: str) -> os.stat_result:
    """Refuse ``path`` unless it is a regular file no larger than ``limit``; its ``os.stat``.

    A FIFO would block forever and a device (``/dev/zero``) never ends: both are refused from
    ``os.stat`` before the file is opened.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadModelError(f"{path}: no such file") from None
    except OSError as e:
        raise BadModelError(f"{path}: cannot read: {e.strerror}") from e
    if stat.S_ISDIR(st.st_mode):
        raise BadModelError(f"{path}: is a folder, not " + ("an ONNX model" if what == "model" else f"the {what}"))
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode))
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise BadModelError(f"{path}: is {kind}, not a regular file; graphpass reads the {what} only from a regular file")
    if st.st_size > limit:
        raise limits.over_memory(
            f"{path}: the {what} is {st.st_size} bytes, over the memory limit of {limit}")
    return st


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path whose folder does not exist or that is a folder (before any work)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"output folder '{parent}' does not exist")
    if p.is_dir():
        raise UsageError(f"output path '{p}' is a folder")
    return p



@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """A temp folder beside ``path`` to write into; on success its files move into place.

    Write the main file as ``<tmp>/<path.name>`` and any companion (e.g. ``<name>.data``) beside
    it: on leaving the block without an error, companions are renamed into ``path``'s folder
    first and the main file last (``os.replace``: atomic on one file system). On an error
    nothing is moved and the temp folder is removed.
    """
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=folder))
    try:
        yield tmpdir
        main = tmpdir / out.name
        for f in sorted(tmpdir.iterdir()):
            if f != main:
                os.replace(f, folder / f.name)
        if main.exists():
            os.replace(main, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_output`; OSError propagates."""
    out = Path(path)
    with atomic_output(out) as tmp:
        with open(tmp / out.name, "w", encoding="utf-8") as f:
            f.write(text)
    return out

