"""Reading a file a user names without trusting it (floor 0: nothing of radixkv, no torch).

What is not a regular file is refused before a byte is read: a FIFO would block the command for
good, /dev/zero or /dev/urandom never end, a socket or a block device is no input. What is read is
bounded: a file larger than its reader's limit is refused from its size, never read into memory.
`check_regular` (a path, without opening it) and `read_bounded` (the bytes) raise UnreadableFile, a
ValueError naming the file; a missing or unreadable file raises the usual OSError.
"""
from __future__ import annotations

import os
import stat

MiB = 1 << 20
GiB = 1 << 30


class UnreadableFile(ValueError):
    """A file refused before it is read: not a regular file, or larger than its reader accepts."""


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB" if n >= MiB else f"{n:,} bytes"


def check_regular(path: str | os.PathLike[str], what: str = "file", *, folder_ok: bool = False) -> os.stat_result:
    """The file's stat (symbolic links followed) when it is a regular file (or, with folder_ok, a
    folder); UnreadableFile naming what it is otherwise. Opens nothing: a FIFO stays unopened."""
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode) or (folder_ok and stat.S_ISDIR(st.st_mode)):
        return st
    raise UnreadableFile(f"{path}: is {_kind(st.st_mode)}, not a regular {what}")


def read_bounded(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, refused (UnreadableFile) when it is something else or
    holds more than `limit` bytes. Opened without blocking and checked on the open descriptor, so a
    FIFO put in the file's place after a check is refused too; at most limit + 1 bytes are read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"{path}: is {_kind(st.st_mode)}, not a regular {what}")
        if st.st_size > limit:
            raise UnreadableFile(f"{path}: {_size(st.st_size)}, more than a {what} may hold ({_size(limit)})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew since, or says a size of 0 (/proc)
        raise UnreadableFile(f"{path}: more than a {what} may hold ({_size(limit)})")
    return data


def read_text_bounded(path: str | os.PathLike[str], limit: int, what: str = "file") -> str:
    """read_bounded as UTF-8 text (UnicodeDecodeError as str.decode raises it)."""
    return read_bounded(path, limit, what).decode("utf-8")


__all__ = ["GiB", "MiB", "UnreadableFile", "check_regular", "read_bounded", "read_text_bounded"]
