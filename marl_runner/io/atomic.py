"""Files that appear complete or not at all: write a hidden temp file, fsync, rename.

``os.replace`` is atomic on one file system, so a reader polling the
directory never sees a half-written file, and a crash leaves at most a stray
``.<name>.*.tmp`` file that the batch readers skip.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: Files are readable by group and others, like the config saved next to them.
FILE_MODE = 0o644


def write_atomically(final_path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Calls ``write(file)`` on a temp file next to ``final_path``, then renames it into place.

    Refuses to replace an existing file (``FileExistsError``): batch files of
    two runs must never mix. The temp file is removed on any failure,
    Ctrl-C included.
    """
    if final_path.exists():
        raise FileExistsError(f"{final_path} already exists; write to an empty directory")
    fd, tmp_name = tempfile.mkstemp(
        dir=final_path.parent, prefix=f".{final_path.stem}.", suffix=".tmp"
    )
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as tmp_file:
            write(tmp_file)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, final_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def fsync_directory(directory: Path) -> None:
    """Makes renames in ``directory`` durable; only POSIX lets a directory be opened for this."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
