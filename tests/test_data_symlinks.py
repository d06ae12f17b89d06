"""Training, `facetrain data` and `facetrain embed` see the same images through symlinked folders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.data.folder import scan_image_folder
from facetrain.export.inputs import collect_images
from tests.support.images import random_rgb, write_image


def linked_faces(tmp_path: Path) -> Path:
    """`faces/` holds one real identity folder and one symlink to a folder kept elsewhere."""
    rng = np.random.default_rng(0)
    root, elsewhere = tmp_path / "faces", tmp_path / "elsewhere" / "bob"
    for number in range(2):
        write_image(root / "alice" / f"{number}.png", random_rgb(rng, 12, 10))
        write_image(elsewhere / f"{number}.png", random_rgb(rng, 12, 10))
    (elsewhere / ".hidden.png").write_bytes(b"not an image")
    os.symlink(elsewhere, root / "bob", target_is_directory=True)
    os.symlink(root, root / "alice" / "loop", target_is_directory=True)  # a cycle is walked once
    return root


def test_embed_training_and_stats_find_the_same_images_through_links(tmp_path):
    root = linked_faces(tmp_path)
    expected = [
        root / "alice" / "0.png",
        root / "alice" / "1.png",
        root / "bob" / "0.png",
        root / "bob" / "1.png",
    ]
    table = scan_image_folder(root)
    assert (
        table.class_names == ["alice", "bob"] and [Path(table.reader.name(i)) for i in range(4)] == expected
    )
    assert collect_images([root]) == expected
    stats = CliRunner().invoke(main, ["data", str(root)])
    assert stats.exit_code == 0, stats.output
    lines = [line.split() for line in stats.output.splitlines()]
    assert ["identities", "2"] in lines and ["images", "4"] in lines
