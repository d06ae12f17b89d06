"""insightface `.bin` verification sets (lfw.bin, cfp_fp.bin, agedb_30.bin, ...), read without trusting them.

A .bin is a pickle of `(encoded_images, issame)`. Unpickling can call any importable function, so the
unpickler here refuses every global: lists, tuples, bytes, numbers, booleans and None need none, and
those are all a genuine .bin holds. The published files were written by Python 2, whose byte strings
load as bytes with `encoding="bytes"`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.eval.pair_set import PairSet


class RefusedGlobal(Exception):
    """Raised inside the unpickler so the refusal cannot be swallowed by pickle's own error handling."""


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid):
        raise RefusedGlobal(f"persistent id {pid!r}")


def read_insightface_bin(path: str | Path) -> tuple[list[bytes], np.ndarray]:
    """The encoded images and the issame flags (one per consecutive pair of images)."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise FacetrainError(f"cannot read {path}: {error.strerror}") from None
    try:
        content = _DataOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except RefusedGlobal as refused:
        raise FacetrainError(
            f"{path}: refused to load: the pickle asks for {refused}, and a verification .bin may only hold "
            "images and flags; do not use this file"
        ) from None
    except Exception as error:
        raise FacetrainError(
            f"{path}: not a readable insightface .bin pickle ({type(error).__name__})"
        ) from None
    return _checked(path, content)


def load_insightface_bin(path: Path, images_root: Path | None, skip_missing: bool) -> PairSet:
    """A PairSet of in-memory images; a .bin has no image files, so the root and skipping do not apply."""
    images, issame = read_insightface_bin(path)
    left = np.arange(0, len(images), 2, dtype=np.int64)
    return PairSet(source=str(path), images=images, left=left, right=left + 1, issame=issame)


def _checked(path: str | Path, content: object) -> tuple[list[bytes], np.ndarray]:
    if not (isinstance(content, (tuple, list)) and len(content) == 2):
        raise FacetrainError(f"{path}: expected a pickled (images, issame) pair")
    images, issame = content
    if not isinstance(images, (list, tuple)) or not all(
        isinstance(image, (bytes, bytearray)) for image in images
    ):
        raise FacetrainError(f"{path}: the first element must be a list of encoded images (bytes)")
    if not isinstance(issame, (list, tuple)) or not all(flag in (0, 1) for flag in issame):
        raise FacetrainError(f"{path}: the second element must be a list of booleans")
    if len(images) != 2 * len(issame):
        raise FacetrainError(
            f"{path}: {len(images)} images cannot form {len(issame)} pairs (need exactly twice as many)"
        )
    return [bytes(image) for image in images], np.array(issame, dtype=bool)
