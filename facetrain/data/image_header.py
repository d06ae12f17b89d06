"""An image's format and size from its first bytes, before anything is decoded.

Decoding allocates width x height x 3 bytes whatever the file's size: a 30000x30000 one-bit PNG of
100 KB becomes 2.7 GB and minutes of work. Reading the size from the header first lets facetrain refuse
such a file at once, naming it. PNG, JPEG, BMP, WebP and PNM headers are read here in a few
microseconds (PIL would cost half a JPEG decode); `facetrain.data.decode` decodes no other format.
"""

from __future__ import annotations

import re
import struct

# 2**28 pixels (268 megapixels, 805 MB decoded): the largest phone photos (200 megapixels) pass
MAX_IMAGE_PIXELS = 2**28
# enough for the size fields of every format below, even behind a JPEG's large EXIF segment
HEADER_BYTES = 256 * 1024

_PNM_SIZE = re.compile(rb"\AP[1-7](?:\s|#[^\n]*\n)+(\d+)(?:\s|#[^\n]*\n)+(\d+)")
# JPEG start-of-frame markers, which hold the size: C0-CF but C4 (DHT), C8 (JPG) and CC (DAC)
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD9)])


def image_format(data: bytes) -> str | None:
    """The format the leading bytes announce, or None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"BM"):
        return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if _PNM_SIZE.match(data[:1024]):
        return "pnm"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def image_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, BMP, WebP or PNM; None when the format is
    another or the header is cut short (the decoder then says what is wrong)."""
    try:
        return _READERS.get(image_format(data) or "", lambda _: None)(data)
    except (struct.error, IndexError):
        return None


def oversize_problem(data: bytes, label: str) -> str | None:
    """Why an image whose header announces more than MAX_IMAGE_PIXELS is refused before decoding,
    or None."""
    size = image_dimensions(data)
    if size is None or size[0] * size[1] <= MAX_IMAGE_PIXELS:
        return None
    width, height = size
    return (
        f"image {label} is {width}x{height} pixels ({width * height / 1e6:,.0f} megapixels), over "
        f"facetrain's limit of {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels; downscale it"
    )


def _png(data: bytes) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def _jpeg(data: bytes) -> tuple[int, int] | None:
    position = 2
    while position + 9 <= len(data):
        if data[position] != 0xFF:  # stray bytes between segments, which libjpeg skips as well
            position = data.find(b"\xff", position)
            if position < 0:
                return None
            continue
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if marker in _JPEG_STANDALONE:
            position += 2
            continue
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[position + 5 : position + 9])
            return width, height
        if marker == 0xDA:  # start of scan: no frame header before the image data
            return None
        position += 2 + struct.unpack(">H", data[position + 2 : position + 4])[0]
    return None


def _bmp(data: bytes) -> tuple[int, int] | None:
    header_size = struct.unpack("<I", data[14:18])[0]
    if header_size == 12:  # OS/2 BITMAPCOREHEADER
        return struct.unpack("<HH", data[18:22])
    width, height = struct.unpack("<ii", data[18:26])
    return abs(width), abs(height)


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        bits = struct.unpack("<I", data[21:25])[0]
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _pnm(data: bytes) -> tuple[int, int] | None:
    found = _PNM_SIZE.match(data[:1024])
    return (int(found.group(1)), int(found.group(2))) if found else None


_READERS = {"png": _png, "jpeg": _jpeg, "bmp": _bmp, "webp": _webp, "pnm": _pnm}
