"""Files a hostile or unlucky user hands facetrain, made on the spot for the bad-input sweep and tests.

Each writer returns the path it wrote. The decompression bomb is the issue's: a 30000x30000 one-bit
PNG of about 110 KB whose decode would take 2.7 GB.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from pathlib import Path

import numpy as np


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_png(path: Path, side: int = 30000) -> Path:
    """A side x side one-bit black PNG, compressed to almost nothing."""
    row = b"\0" * (1 + (side + 7) // 8)
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", body)
        + _png_chunk(b"IEND", b"")
    )
    return path


def noise_png(path: Path, size: int = 40, seed: int = 0) -> Path:
    """A small valid RGB PNG of noise (no face in it)."""
    import cv2

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    cv2.imwrite(str(path), pixels)
    return path


def cut_png(path: Path) -> Path:
    """A valid PNG with its second half missing, as a broken download leaves it."""
    whole = noise_png(path).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path


def text_named_like_an_image(path: Path) -> Path:
    path.write_text("these are my notes, not a photo\n")
    return path


def empty_file(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def plain_pickle(path: Path) -> Path:
    """A pickle that is not a weights-only torch file (harmless: a dict of ints)."""
    path.write_bytes(pickle.dumps({"conv1.weight": [1, 2, 3]}))
    return path
