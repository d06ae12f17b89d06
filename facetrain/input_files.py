"""Opening the files a user names without hanging on a named pipe or reading without end.

`open()` on a FIFO blocks until a writer comes (forever, when none does), and a device such as
/dev/zero never ends. Input files are opened non-blocking, so opening a FIFO returns at once, and the
open descriptor (not the path, which could be swapped between a check and the open) must be a
regular file; what is read is bounded by what the format can need. A file another process rewrites
in place while it is read is refused (`unchanged_while_read`), as a model's files are.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from facetrain.errors import FacetrainError

_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFSOCK: "a socket",
}


class UnreadableInput(FacetrainError):
    """An input that is missing, unreadable, not a regular file or too big; `reason` says which,
    for callers that name the file their own way."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """`path` opened for binary reading, or a one-line error naming `what` it is (e.g. "config")
    when it is missing, unreadable or anything but a regular file (a symlink to one is fine)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        reason = error.strerror or str(error)
        raise UnreadableInput(f"cannot read {what} {path}: {reason}", reason) from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            reason = f"{_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, not a file"
            raise UnreadableInput(f"{what} {path} is {reason}; pass the file itself", reason)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _read_up_to(handle: BinaryIO, size: int, limit: int) -> bytes:
    """The file's bytes, asking for its size first (read(n) allocates n bytes up front, so asking for
    `limit` would take gigabytes for a small file), then more while it grows, up to `limit` + 1."""
    data = handle.read(size + 1)
    while size < len(data) <= limit:
        more = handle.read(min(1 << 20, limit + 1 - len(data)))
        if not more:
            break
        data += more
    return data


def read_regular_bytes(path: str | Path, what: str, limit: int) -> bytes:
    """The whole regular file `path`, refused in one line when it holds more than `limit` bytes."""
    with open_regular(path, what) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = b"" if size > limit else _read_up_to(handle, size, limit)
    if size > limit or len(data) > limit:
        reason = f"{max(size, len(data))} bytes, more than the {limit} a {what} can need"
        raise UnreadableInput(f"{what} {path} holds {reason}; check that it is the right file", reason)
    return data


def _version(path: Path) -> tuple[int, ...] | None:
    """What changes when a file is written in place or replaced: its inode, size and modification time."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def files_in(folder: Path) -> list[Path]:
    """The regular files directly in `folder` ([] for one that cannot be listed)."""
    try:
        return [path for path in folder.iterdir() if path.is_file()]
    except OSError:
        return []


@contextmanager
def unchanged_while_read(paths: Iterable[Path], what: str) -> Iterator[None]:
    """Refuse in one line what the block read from `paths` when one of them changed meanwhile: another
    process writing it in place (facetrain's own writers replace a file whole, but not every program
    does) leaves a mix of old and new bytes, which may load without any error. Checked from each
    file's inode, size and modification time, before and after, so it costs two `stat`s a file; an
    error the block raised is replaced by this one when a file changed, since the change is its cause."""
    paths = list(paths)
    before = [_version(path) for path in paths]
    try:
        yield
    except Exception:
        _check_unchanged(paths, before, what)
        raise
    _check_unchanged(paths, before, what)


def _check_unchanged(paths: list[Path], before: list[tuple[int, ...] | None], what: str) -> None:
    for path, version in zip(paths, before):
        if _version(path) != version:
            raise FacetrainError(
                f"{what} {path} changed while it was read (another process is writing it); run this again "
                "when its writer is done"
            ) from None
