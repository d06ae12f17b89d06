"""Writing user-visible files safely: atomically, and never over an existing file unless asked.

An interrupted export, report or benchmark never leaves a half-written file where a good one was. The
new file's bytes and its name are flushed to disk before the call returns, so even a power cut after
it leaves the new file whole (checkpoints rely on this for their `last` pointer).
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from facetrain.errors import FacetrainError


@cache
def _new_file_mode() -> int:
    """The mode `open()` gives new files under this process's umask (read once: reading resets it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write into; it replaces `path` only if the block succeeds.

    The file gets ordinary permissions: some writers (safetensors) create private 0600 files. An
    OSError that names no file (a full disk met by `write()`) is raised naming `path`.
    """
    tmp = path.with_name(
        f".{path.name}.tmp-{os.getpid()}{path.suffix}"
    )  # keeps the suffix for writers that read it
    try:
        yield tmp
        os.chmod(tmp, _new_file_mode())
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from None  # a write() names no file
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(path: Path) -> None:
    """Flush a directory's entries (a rename into it, a file created in it) to disk."""
    _fsync(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(text)


def write_atomic(path: Path, write: Callable[[Path], Any]) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then move it into place in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_target(path) as tmp:
        write(tmp)


def open_appending(path: Path):
    """`path` opened to append text (created if missing), never through a symlink: a link planted in
    a run folder (`ln -s ~/notes.txt RUN/train.log`) is ELOOP, not a write into the file it names."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o666), "a", newline="")


def append_to_record(path: Path, write: Callable[[Any], object], failing: set[Path]) -> OSError | None:
    """Append to a run's record (train.log, metrics.csv) with `write(handle)`, never raising: a record
    that cannot be written must not stop training. Returns the OSError of the first failed write since
    `path` last took one, for the caller to say once; None otherwise. `failing` holds the paths whose last
    write failed, `path` added before the error is returned: a warning that is logged back into the
    same file is then not said twice."""
    try:
        with open_appending(path) as handle:
            write(handle)
    except OSError as error:
        if path in failing:
            return None
        failing.add(path)
        return error
    failing.discard(path)
    return None


def links_leaving(root: Path) -> Iterator[tuple[Path, str]]:
    """Each symlink under `root` (walked without following any) whose target lies outside it, with
    that target: whatever writes into `root` through one would write outside."""
    top = os.path.realpath(root)
    for folder, folders, files in os.walk(root):  # a linked folder is listed, never entered
        for name in (*folders, *files):
            path = os.path.join(folder, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if os.path.commonpath([top, target]) != top:
                    yield Path(path), target


def file_size_limit() -> int | None:
    """The bytes a file of this process may grow to (RLIMIT_FSIZE, `ulimit -f`), None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


# What the machine, not facetrain, refused on a write, and what to do about it before running the command
# (or resuming the run) again: any command can meet these on any file. The command line's one line
# (`facetrain.cli.user_errors`) and the trainer's and checkpoint writer's read this one table. EFBIG's
# advice depends on its cause (`write_failure_advice`).
WRITE_FAILURE_ADVICE = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space within your quota",
    errno.EFBIG: "choose a file system that holds larger files",
    errno.EROFS: "make its file system writable",
    errno.EACCES: "check the permissions of the file and its folder",
    errno.EPERM: "check the permissions of the file and its folder",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ELOOP: "fix or remove the symlink",
    errno.EIO: "check the disk, which reported an error",
    errno.EISDIR: "move the folder that stands where a file is written, or choose another place",
    errno.ENOTDIR: "choose another place (a file stands where a folder of the path belongs)",
}


def write_failure_advice(error: OSError) -> str:
    """What to do about a write that failed, from its cause (WRITE_FAILURE_ADVICE): "free space" only for
    a full disk or quota; a file too big for this process's file size limit (`ulimit -f`) is EFBIG too,
    and says so."""
    if error.errno == errno.EFBIG and (limit := file_size_limit()) is not None:
        return f"raise the process's file size limit (ulimit -f, {limit} bytes)"
    return WRITE_FAILURE_ADVICE.get(error.errno, "check the disk and the folder")


def refuse_to_overwrite(paths: Iterable[Path], flag: str = "--overwrite") -> None:
    """One-line error naming the first existing file, so user files are only replaced when asked."""
    existing = [path for path in paths if path.exists()]
    if existing:
        raise FacetrainError(f"{existing[0]} already exists; pass {flag} to replace it")


def make_output_folder(path: Path, option: str) -> None:
    """Create the output folder `path` (given as `option`), or say in one line why it cannot be: a file
    of that name, a file where a parent folder belongs, no permission."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FacetrainError(f"{option} {path} is a file, not a folder; choose another {option}") from None
    except OSError as error:
        raise FacetrainError(
            f"cannot create {option} {path}: {error.strerror or error}; choose another {option}"
        ) from None


NAME_MAX = 255  # bytes in one file name on Linux file systems
PATH_MAX = 4096  # bytes in a path the kernel takes, its terminating NUL included


def output_path_problem(path: Path, option: str) -> str | None:
    """Why `path` cannot be written to as `option`, found before any work is done, or None: a name
    or path longer than the system takes (ENAMETOOLONG, a traceback wherever it was first touched)
    or a symlink to nothing (written through, or left half-done, by each command its own way)."""
    encoded = os.fsencode(path)
    if len(encoded) >= PATH_MAX:
        return f"{option} {_cut(str(path))} is {len(encoded)} bytes long, more than the {PATH_MAX - 1} a path can have; choose a shorter one"
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"{option} {_cut(str(path))}: the name {_cut(part)} is {len(os.fsencode(part))} bytes, more than the {NAME_MAX} a file name can have; choose a shorter one"
    if path.is_symlink() and not path.exists():
        return f"{option} {path} is a symlink to {os.readlink(path)}, which does not exist; remove the link or choose another {option}"
    return None


def check_output_path(path: Path, option: str) -> None:
    problem = output_path_problem(path, option)
    if problem is not None:
        raise FacetrainError(problem)


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."
