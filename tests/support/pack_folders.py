"""The small identity folder the `facetrain pack` tests pack: noise PNGs (lossless, so the pixels read
back from the .rec must match exactly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.images import write_image

IDENTITIES = {"carol": 3, "alice": 2, "bob": 2}


def write_noise_folder(root: Path) -> Path:
    """7 noise PNGs of 12x10 in 3 identity folders under `root`."""
    rng = np.random.default_rng(0)
    for identity, count in IDENTITIES.items():
        for index in range(count):
            write_image(root / identity / f"{index}.png", rng.integers(0, 256, (12, 10, 3), dtype=np.uint8))
    return root
