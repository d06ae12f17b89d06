"""Output files checked before a command's work: a folder (or a pipe, a device) standing where a file
is to be written was an IsADirectoryError traceback after the work, naming a temporary file, with the
command's other outputs already replaced."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from facetrain.errors import FacetrainError


def refuse_what_is_no_file(paths: Iterable[Path], option: str = "-o") -> None:
    """One line naming the first of `paths` that exists and is not a regular file (or a link to one)."""
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise FacetrainError(
                f"{option}: {path} is {kind}, where a file of that name is written; move it or choose another {option}"
            )
