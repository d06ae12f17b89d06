"""Small image files and sets for the data tests: pixels written in the format a suffix names, smooth
random colours that lossy formats keep, and a Market-1501 tree (no tests here)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np


def write_image(path: Path, rgb: np.ndarray) -> None:
    """Writes RGB (or 2-D grayscale) pixels in the format the suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rgb[:, :, ::-1] if rgb.ndim == 3 else rgb
    assert cv2.imwrite(str(path), np.ascontiguousarray(pixels))


def random_rgb(rng: np.random.Generator, height: int = 20, width: int = 16) -> np.ndarray:
    """Smooth random colours, so that lossy formats keep them closely (noise would not survive JPEG)."""
    coarse = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    return cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)


MARKET_FILES = {
    "bounding_box_train": ["0002_c1s1_000451_03.jpg", "0002_c2s1_000551_01.jpg", "0007_c3s3_012345_02.jpg"],
    "bounding_box_test": [
        "-1_c1s1_000401_03.jpg",
        "0000_c2s1_000301_01.jpg",
        "0002_c4s2_000801_02.jpg",
        "0009_c6s4_001201_01.jpg",
    ],
    "query": ["0002_c5s1_000901_00.jpg", "0009_c1s1_001001_00.jpg"],
}


def write_market_tree(root: Path) -> Path:
    """MARKET_FILES as 32x16 images, plus a Thumbs.db in every split as real copies often have."""
    rng = np.random.default_rng(3)
    for folder, names in MARKET_FILES.items():
        for name in names:
            write_image(root / folder / name, random_rgb(rng, 32, 16))
        (root / folder / "Thumbs.db").write_bytes(b"\0")
    return root
