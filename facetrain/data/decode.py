"""Image decoding shared by every source: one place that turns bytes or a path into RGB pixels.

OpenCV is used because it decodes JPEG/PNG several times faster than PIL on one core, which is what
lets a single DataLoader worker keep up with a training step.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from facetrain.errors import FacetrainError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".webp")

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
    """The raw bytes of an image file, or a one-line error naming it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise BadImageError(f"image {path} does not exist") from None
    except OSError as error:
        raise BadImageError(f"cannot read image {path}: {error.strerror}") from None


def decode_image(data: bytes | str | Path, name: str | None = None) -> np.ndarray:
    """uint8 RGB HxWx3 pixels; grayscale is replicated to 3 channels so every model sees the same layout.

    `name` labels the image in errors when `data` is raw bytes (e.g. a RecordIO record).
    """
    if isinstance(data, (str, Path)):
        label = name or str(data)
        data = read_file_bytes(data)
    else:
        label = name or "<image bytes>"
    buffer = np.frombuffer(data, dtype=np.uint8)
    image = cv2.imdecode(buffer, cv2.IMREAD_COLOR) if buffer.size else None
    if image is None:
        raise BadImageError(f"image {label} is corrupt or not an image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
