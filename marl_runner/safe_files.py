"""Opening files that may have been crafted: regular files only, sizes known before reading.

A path handed to a reader can be a symlink to ``/dev/zero`` (endless bytes)
or a FIFO (``open`` blocks until a writer comes). Files are therefore opened
with ``O_NONBLOCK`` (a FIFO opens at once) and checked with ``fstat`` on the
open descriptor (no race with a rename) before one byte is read; the size
read is the size ``fstat`` reported, never more. ``memory_limit_bytes`` is
the memory this process may use at most, for the checks that refuse what
cannot fit.
"""

from __future__ import annotations

import os
import resource
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["FileRefused", "memory_limit_bytes", "open_regular_file", "read_regular_file"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(ValueError):
    """A path that is not a regular file, or one larger than the reader accepts."""


def open_regular_file(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> BinaryIO:
    """``path`` opened for reading, after checking it is a regular file of at most
    ``max_bytes``; symlinks are followed, to a regular file only.

    Raises:
        OSError: the path cannot be opened (missing, permissions).
        FileRefused: not a regular file, or larger than ``max_bytes``.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
            raise FileRefused(f"is not a regular file ({kind})")
        if max_bytes is not None and info.st_size > max_bytes:
            raise FileRefused(f"is {info.st_size:,} bytes, more than the {max_bytes:,} accepted")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file (see ``open_regular_file``), exactly as many as its size
    when opened: a file that grows meanwhile is read to that size only."""
    with open_regular_file(path, max_bytes=max_bytes) as file:
        size = os.fstat(file.fileno()).st_size
        return file.read(size)


def memory_limit_bytes() -> int:
    """The memory this process can have at most: physical RAM, lowered by a cgroup memory
    limit and by ``RLIMIT_AS`` / ``RLIMIT_DATA`` where they are set."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        soft, _ = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    for cgroup_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(cgroup_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits)
