"""Image decoding shared by every source: one place that turns bytes or a path into RGB pixels.

OpenCV is used because it decodes JPEG/PNG several times faster than PIL on one core, which is what
lets a single DataLoader worker keep up with a training step. Its own log lines (`[ WARN:0@0.1] global
grfmt_png.cpp ... PNG input buffer is incomplete`) are silenced for the whole process: facetrain says
what is wrong with an image in one line of its own, which they would otherwise precede.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np

from facetrain.data.image_header import HEADER_BYTES, image_dimensions, image_format, oversize_problem
from facetrain.errors import FacetrainError
from facetrain.input_files import UnreadableInput, open_regular, read_regular_bytes

cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)

MAX_IMAGE_FILE_BYTES = 1 << 30  # a 268-megapixel image, the decode limit, stored without compression
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".webp")
LEFT_OUT_NAMED = 5  # unreadable images named one by one; the rest are counted

_WORKER_MESSAGE_START = "Caught "
_WORKER_TRACEBACK_MARK = "Original Traceback"


class DataError(FacetrainError):
    """A data problem met while loading samples, possibly inside a DataLoader worker.

    PyTorch re-creates a worker's exception in the main process from a message that embeds the whole
    worker traceback. The CLI prints user errors as one line, so that wrapping is undone here: only the
    traceback's last line, the original message, is kept.
    """

    def __init__(self, message: str):
        super().__init__(_unwrap_worker_message(message))


def _unwrap_worker_message(message: str) -> str:
    if not (message.startswith(_WORKER_MESSAGE_START) and _WORKER_TRACEBACK_MARK in message):
        return message
    last_line = message.rstrip().splitlines()[-1]
    _, separator, original = last_line.partition(": ")
    return original if separator else message


class BadImageError(DataError):
    """One image cannot be read or decoded; the only error `data.skip_bad_images` may skip.

    The message names the image only: what to do about it depends on who reads the image (the
    training set, a pairs set, a folder being aligned), so the caller adds that."""


def read_file_bytes(path: str | Path) -> bytes:
    """The raw bytes of an image file, or a one-line error naming it: missing, unreadable, a named
    pipe (which would hang the reader) or a device, or over MAX_IMAGE_FILE_BYTES."""
    try:
        return read_regular_bytes(path, "image", MAX_IMAGE_FILE_BYTES)
    except UnreadableInput as error:
        if not os.path.lexists(path):
            raise BadImageError(f"image {path} does not exist") from None
        raise BadImageError(str(error)) from None


def decode_image(data: bytes | str | Path, name: str | None = None) -> np.ndarray:
    """uint8 RGB HxWx3 pixels; grayscale is replicated to 3 channels so every model sees the same layout.

    `name` labels the image in errors when `data` is raw bytes (e.g. a RecordIO record).
    """
    if isinstance(data, (str, Path)):
        label = name or str(data)
        data = read_file_bytes(data)
    else:
        label = name or "<image bytes>"
    unchecked = unchecked_format_problem(data, label)
    if unchecked is not None:
        raise BadImageError(unchecked)
    too_large = oversize_problem(data, label)
    if too_large is not None:
        raise BadImageError(too_large)
    if _damaged_png(data):
        raise BadImageError(f"image {label} is corrupt or not an image")
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise BadImageError(f"image {label} is corrupt or not an image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def unchecked_format_problem(data: bytes, label: str) -> str | None:
    """Why an image is refused before OpenCV sees it because its size cannot be checked first, or None.

    OpenCV decodes more formats than the header reader sizes (TIFF, JPEG 2000, OpenEXR, HDR, Sun
    raster, GIF, ...), and its own pixel limit is four times facetrain's: a 72 KB TIFF of 20000x20000
    took 40 s and 3.4 GB. So only the formats whose size is read first are decoded, and of those only
    a file whose header gives its size (a decoder would fail on the others anyway)."""
    found = image_format(data)
    if found == "tiff":
        return (
            f"image {label} is a TIFF, which facetrain does not decode (its size cannot be checked "
            "before decoding); convert it to PNG or JPEG"
        )
    if found is None or image_dimensions(data) is None:
        return f"image {label} is corrupt or not an image"
    return None


def _damaged_png(data: bytes) -> bool:
    """A PNG cut short (no IEND chunk) or with a chunk whose CRC does not match its bytes: refused
    before libpng, which prints a line of its own to stderr that no log level silences (`libpng
    error: bad adaptive filter value`: it inflates a damaged IDAT before it reaches the chunk's CRC).
    Checking every CRC costs a pass of zlib.crc32 over the file, about half a millisecond a megabyte
    (an eighth of decoding a PNG of noise, less for faces)."""
    if image_format(data) != "png":
        return False
    position = 8
    while position + 12 <= len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        end = position + 8 + length
        if end + 4 > len(data):
            return True
        (crc,) = struct.unpack(">I", data[end : end + 4])
        if zlib.crc32(data[position + 4 : end]) != crc:
            return True
        if data[position + 4 : position + 8] == b"IEND":
            return False
        position = end + 4
    return True


def image_file_problem(path: str | Path) -> str | None:
    """Why the file at `path` is not an image facetrain can decode, or None; cheap enough for every file
    of a folder, as only its header is read. A header whose size fields lie past HEADER_BYTES (a JPEG
    behind a huge EXIF segment) passes here; decoding reads the whole file and checks it again."""
    try:
        with open_regular(path, "image") as handle:
            head = handle.read(HEADER_BYTES)
    except UnreadableInput as error:
        return str(error)
    if image_format(head) in (None, "tiff"):
        return unchecked_format_problem(head, str(path))
    return oversize_problem(head, str(path))


def left_out_warnings(problems: list[str]) -> list[str]:
    """Warning lines for images a command left out because they cannot be read: the first few named
    (each problem names its file), the rest counted, so a folder of thousands does not flood the terminal."""
    lines = [f"warning: left out {problem}" for problem in problems[:LEFT_OUT_NAMED]]
    if len(problems) > LEFT_OUT_NAMED:
        lines.append(f"warning: left out {len(problems) - LEFT_OUT_NAMED} more unreadable images")
    return lines
