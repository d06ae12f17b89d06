"""Data folders that cannot be walked (#38, medium): a symlink that loops and an identity folder that
cannot be listed are one line naming them in `data`, `pairs` and `eval --folder`, where they were
OSError and PermissionError tracebacks (and `train` blamed free space)."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.support.hostile_helpers import one_line_error


def image_folder(root: Path) -> Path:
    for identity in ("ann", "bob"):
        (root / identity).mkdir(parents=True)
        for index in range(2):
            cv2.imwrite(str(root / identity / f"{index}.png"), np.full((16, 16, 3), index * 60, np.uint8))
    return root


COMMANDS = {
    "data": lambda root, out: ["data", root, "--quiet"],
    "pairs": lambda root, out: ["pairs", root, "-o", out / "pairs.csv"],
    "eval --folder": lambda root, out: [
        "eval",
        out / "no_model_needed",
        "--folder",
        root,
        "-o",
        out / "report",
    ],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_symlink_loop_among_the_identities_is_one_line(tmp_path: Path, command: str) -> None:
    root = image_folder(tmp_path / "faces")
    os.symlink("carl", root / "carl")  # a link to itself
    line = one_line_error(*COMMANDS[command](root, tmp_path))
    assert (
        line
        == f"error: cannot follow {root / 'carl'}: Too many levels of symbolic links; fix or remove the link"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["faces"]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_identity_folder_that_cannot_be_listed_is_one_line(tmp_path, monkeypatch, command: str) -> None:
    """Simulated (the tests may run as root, who can list any folder): scandir refuses bob/."""
    root = image_folder(tmp_path / "faces")
    scandir = os.scandir

    def refusing(path):
        if Path(path).name == "bob":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    line = one_line_error(*COMMANDS[command](root, tmp_path))
    assert (
        line
        == f"error: cannot list identity folder {root / 'bob'}: Permission denied; make it readable or remove it"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["faces"]
