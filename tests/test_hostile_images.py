"""Images whose size facetrain cannot check before decoding (#38, medium): a TIFF decompression bomb
passed the 268-megapixel guard because only PNG, JPEG, BMP, WebP and PNM headers were sized. Now only
those formats are decoded, each only when its header gives a size within the limit."""

from __future__ import annotations

import os
import re
import struct
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from facetrain.data.decode import BadImageError, decode_image, image_file_problem
from facetrain.data.image_header import MAX_IMAGE_PIXELS

TIFF_REFUSED = (
    "which facetrain does not decode (its size cannot be checked before decoding); convert it to PNG or JPEG"
)


def tiff_header(width: int, height: int) -> bytes:
    """A little-endian TIFF of one 1-bit PackBits strip whose IFD announces width x height."""
    entries = [
        (256, 4, 1, width),  # ImageWidth
        (257, 4, 1, height),  # ImageLength
        (258, 3, 1, 1),  # BitsPerSample
        (259, 3, 1, 32773),  # Compression: PackBits
        (262, 3, 1, 1),  # PhotometricInterpretation: black is zero
        (273, 4, 1, 8 + 2 + 12 * 9 + 4),  # StripOffsets: right after the IFD
        (277, 3, 1, 1),  # SamplesPerPixel
        (278, 4, 1, height),  # RowsPerStrip
        (279, 4, 1, 2),  # StripByteCounts
    ]
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        ifd += struct.pack("<HHII", tag, kind, count, value)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + b"\x81\x00"


@pytest.mark.timeout(20)
def test_a_tiff_bomb_named_png_is_refused_without_decoding(tmp_path: Path) -> None:
    """20000x20000 in 130 bytes: before, OpenCV's own limit (2**30 pixels) let it through to decoding."""
    bomb = tmp_path / "face.png"
    bomb.write_bytes(tiff_header(20000, 20000))
    start = time.monotonic()
    assert image_file_problem(bomb) == f"image {bomb} is a TIFF, {TIFF_REFUSED}"
    with pytest.raises(BadImageError, match=f"^image {bomb} is a TIFF, "):
        decode_image(bomb)
    assert time.monotonic() - start < 2


def test_even_a_small_real_tiff_is_not_decoded(tmp_path: Path) -> None:
    ok, encoded = cv2.imencode(".tiff", np.zeros((8, 8, 3), np.uint8))
    assert ok
    with pytest.raises(BadImageError, match=f"^image small.tif is a TIFF, {re.escape(TIFF_REFUSED)}$"):
        decode_image(encoded.tobytes(), "small.tif")


def test_a_jpeg_size_behind_stray_bytes_is_still_checked(tmp_path: Path) -> None:
    """libjpeg skips stray bytes between segments; the header reader stopped there, leaving the size
    to OpenCV. A start-of-frame of 20000x20000 behind one stray byte is refused by size."""
    frame = b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", 20000, 20000) + b"\x03" + b"\x01\x11\x00" * 3
    data = b"\xff\xd8" + b"\xff\xe0\x00\x04ab" + b"\x00" + frame + b"\xff\xda" + bytes(64)
    with pytest.raises(
        BadImageError, match=r"^image stray.jpg is 20000x20000 pixels \(400 megapixels\), over"
    ):
        decode_image(data, "stray.jpg")
    assert 20000 * 20000 > MAX_IMAGE_PIXELS


@pytest.mark.parametrize(
    "data",
    [b"", b"GIF89a" + bytes(20), b"\x89PNG\r\n\x1a\n" + bytes(8) + b"XXXX", b"\xff\xd8\xff\xda" + bytes(20)],
    ids=["empty", "gif", "png without IHDR", "jpeg without a frame"],
)
def test_files_without_a_size_are_corrupt_without_decoding(data: bytes) -> None:
    with pytest.raises(BadImageError, match="^image x is corrupt or not an image$"):
        decode_image(data, "x")


def test_a_png_with_a_damaged_chunk_is_refused_before_libpng_prints(capfd) -> None:
    """Found by the fuzzer: libpng inflates a damaged IDAT before it reaches the chunk's CRC and prints
    `libpng error: bad adaptive filter value` to stderr itself, beside facetrain's line."""
    ok, encoded = cv2.imencode(".png", np.random.default_rng(0).integers(0, 256, (12, 12, 3), dtype=np.uint8))
    data = bytearray(encoded.tobytes())
    data[data.index(b"IDAT") + 6] ^= 0xFF
    with pytest.raises(BadImageError, match="^image damaged.png is corrupt or not an image$"):
        decode_image(bytes(data), "damaged.png")
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(20)
def test_a_named_pipe_among_the_images_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """Before, reading its bytes waited for a writer for ever (embed, compare, training, pairs)."""
    fifo = tmp_path / "face.png"
    os.mkfifo(fifo)
    expected = f"image {fifo} is a named pipe, not a file; pass the file itself"
    assert image_file_problem(fifo) == expected
    with pytest.raises(BadImageError, match=f"^{re.escape(expected)}$"):
        decode_image(fifo)


@pytest.mark.timeout(20)
def test_a_named_pipe_as_a_verification_bin_is_one_line(tmp_path: Path) -> None:
    from facetrain.errors import FacetrainError
    from facetrain.eval.insightface_bin import read_insightface_bin

    fifo = tmp_path / "lfw.bin"
    os.mkfifo(fifo)
    with pytest.raises(FacetrainError, match="is a named pipe, not a file; pass the file itself"):
        read_insightface_bin(fifo)
