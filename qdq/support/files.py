"""Writing output files safely: fail before any work when a path cannot be written, never
overwrite an input, and replace files atomically so a reader sees the old or the new file, never half.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Callable, Iterable

from qdq.support.errors import OutputError


def check_writable(path: Path, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Fail early, before any work, when an output path cannot be written or is one of `inputs`."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputError(f"{path}: output path is a directory")
    if not parent.exists():
        raise OutputError(f"{path}: output folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"{path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{path}: output folder {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{path}: output file is not writable")
    for source in inputs:
        if same_file(path, Path(source)):
            raise OutputError(f"{path}: output would overwrite the input {source}; choose another path")


def atomic_write_bytes(path: Path, data: bytes, check: Callable[[Path], None] | None = None) -> None:
    """Write to a temporary file in the same folder, then rename: readers see old or new, never half.

    The new file gets the mode of the file it replaces, or the umask's default for a new file
    (not mkstemp's 0600). `check` is called with the complete temporary file before the rename;
    if it raises, nothing is written. An OSError becomes an OutputError; the temporary file
    never survives.
    """
    path = Path(path)
    check_writable(path)
    mode = new_file_mode(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"{path}: cannot write: {exc.strerror or exc}") from None
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()


def new_file_mode(path: Path) -> int:
    """The permission bits for a file written at `path`: those of the file it replaces, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_dir(folder: Path) -> None:
    """Make a rename durable (best effort: not every platform can open a folder)."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
