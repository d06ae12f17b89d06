"""insightface `.bin` verification sets (lfw.bin, cfp_fp.bin, agedb_30.bin, ...), read without trusting them.

A .bin is a pickle of `(encoded_images, issame)`. Unpickling can call any importable function, so the
unpickler here resolves only the few globals genuine files use, each to a stand-in written here that
checks its arguments, and refuses every other global:

- byte strings, lists, tuples, numbers, booleans and None need none (the published files, written by
  Python 2, whose byte strings load as bytes with `encoding="bytes"`);
- `_codecs.encode(text, "latin1")` is how Python 3 writes bytes at protocol 2;
- numpy's `_reconstruct`, `ndarray` and `dtype` (protocols 2-4) or `_frombuffer` (protocol 5) are how
  a numpy array is pickled, and insightface's own `build_eval_pack.py` stores each image as the uint8
  array `cv2.imencode` returns. Only 1-byte unsigned buffers are accepted, so an object array (whose
  items would be arbitrary pickled objects) or any other dtype is refused before numpy sees it.
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.eval.folds import FOLDS_IN_FILE_ORDER, contiguous_folds
from facetrain.eval.pair_set import PairSet
from facetrain.input_files import read_regular_bytes
from facetrain.pickle_scan import far_memo_index

UINT8_NAMES = ("u1", "uint8", "|u1")
UINT8_BYTE_ORDERS = ("|", "=")
LATIN1_NAMES = ("latin1", "latin-1", "iso-8859-1")


class Refused(Exception):
    """Raised inside the unpickler so the refusal cannot be swallowed by pickle's own error handling."""


def _text(value: object) -> object:
    """Python 2 strings arrive as bytes under `encoding="bytes"`; compare them as text."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


class _NdarrayClass:
    """Stands in for `numpy.ndarray`, which a pickle names only as `_reconstruct`'s first argument."""


class _Uint8Dtype:
    """Stands in for `numpy.dtype("u1")`; pickles restore a dtype's byte order through `__setstate__`."""

    def __setstate__(self, state: object) -> None:
        if not (isinstance(state, tuple) and len(state) >= 2 and _text(state[1]) in UINT8_BYTE_ORDERS):
            raise Refused(f"the pickle asks for a uint8 dtype with the state {_shown(state)}")


class _EncodedImage:
    """Stands in for a uint8 numpy array holding one encoded image; `data` is its bytes."""

    def __init__(self, data: bytes | None = None):
        self.data = data

    def __setstate__(self, state: object) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise Refused("the pickle asks for a numpy array with an unknown state")
        _version, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _Uint8Dtype):
            raise Refused(f"the pickle asks for a numpy array of {_asked_for(dtype)}, not uint8")
        if not isinstance(raw, (bytes, bytearray)):
            raise Refused("the pickle asks for a numpy array whose items are objects, not a uint8 buffer")
        self.data = _sized(bytes(raw), shape, bool(fortran))


def _sized(data: bytes, shape: object, fortran: bool = False) -> bytes:
    """The array's bytes in C order (what `ndarray.tobytes()` gives), after checking they fill `shape`."""
    if not (isinstance(shape, tuple) and all(isinstance(side, int) and side >= 0 for side in shape)):
        raise Refused(f"the pickle asks for a numpy array of shape {_shown(shape)}")
    if math.prod(shape) != len(data):
        raise Refused(f"the pickle asks for a numpy array of shape {_shown(shape)} from {len(data)} bytes")
    if fortran and len(shape) > 1:
        return np.frombuffer(data, dtype=np.uint8).reshape(shape, order="F").tobytes(order="C")
    return data


def _dtype(name: object, align: object = False, copy: object = True) -> _Uint8Dtype:
    if _text(name) not in UINT8_NAMES:
        raise Refused(f"the pickle asks for a numpy array of dtype {_shown(_text(name), 40)}, not uint8")
    return _Uint8Dtype()


def _reconstruct(cls: object, shape: object, typecode: object) -> _EncodedImage:
    if cls is not _NdarrayClass:
        raise Refused(f"the pickle asks numpy to reconstruct {_asked_for(cls)}, not an ndarray")
    return _EncodedImage()


def _frombuffer(buffer: object, dtype: object, shape: object, order: object = "C") -> _EncodedImage:
    if not isinstance(dtype, _Uint8Dtype):
        raise Refused(f"the pickle asks for a numpy buffer of {_asked_for(dtype)}, not uint8")
    if isinstance(buffer, pickle.PickleBuffer):
        buffer = buffer.raw()
    if not isinstance(buffer, (bytes, bytearray, memoryview)):
        raise Refused(f"the pickle asks for a numpy array from {_asked_for(buffer)}, not a byte buffer")
    return _EncodedImage(_sized(bytes(buffer), shape, _text(order) == "F"))


def _latin1_encode(text: object, encoding: object = "utf-8") -> bytes:
    if not isinstance(text, str) or _text(encoding) not in LATIN1_NAMES:
        raise Refused(
            f"the pickle asks for _codecs.encode with {type(text).__name__} as {_shown(encoding, 20)}"
        )
    return text.encode("latin-1")


ALLOWED_GLOBALS: dict[tuple[str, str], Callable | type] = {
    ("_codecs", "encode"): _latin1_encode,
    ("numpy", "ndarray"): _NdarrayClass,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
}


# What the file asked for, by the stand-in that answered: a refusal names the file's request, never
# the function or class written here in its place.
ASKED_FOR = {id(stand_in): f"{module}.{name}" for (module, name), stand_in in ALLOWED_GLOBALS.items()}
STAND_IN_VALUES = {_Uint8Dtype: "numpy.dtype('uint8')", _EncodedImage: "a numpy uint8 array"}


def _asked_for(value: object) -> str:
    """`value` as the pickle named it: an allowed global by its module and name, a value one of them
    built by what it is, anything else by its type."""
    if id(value) in ASKED_FOR:
        return ASKED_FOR[id(value)]
    if type(value) in STAND_IN_VALUES:
        return STAND_IN_VALUES[type(value)]
    return f"a {type(value).__name__}"


def _shown(value: object, limit: int = 80) -> str:
    """`value`'s repr, with any stand-in inside it shown as what the pickle asked for."""
    if id(value) in ASKED_FOR or type(value) in STAND_IN_VALUES:
        text = _asked_for(value)
    elif isinstance(value, (tuple, list)):
        items = ", ".join(_shown(item, limit) for item in value)
        text = f"({items})" if isinstance(value, tuple) else f"[{items}]"
    else:
        text = repr(value)
    return text[:limit]


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise Refused(f"the pickle asks for {module[:80]}.{name[:80]}") from None

    def persistent_load(self, pid):
        raise Refused(f"the pickle asks for persistent id {_shown(pid)}")


MAX_BIN_BYTES = 4 << 30
"""insightface's largest verification .bin (cfp_fp, 14,000 images) is under 300 MB."""


def read_insightface_bin(path: str | Path) -> tuple[list[bytes], np.ndarray]:
    """The encoded images and the issame flags (one per consecutive pair of images)."""
    data = read_regular_bytes(path, "verification .bin", MAX_BIN_BYTES)  # a FIFO would hang the read
    far_memo = far_memo_index(data)
    if far_memo is not None:
        raise FacetrainError(
            f"{path}: refused to load: the pickle stores an object at memo slot {far_memo}, beyond any its "
            f"{len(data)} bytes could fill (C's unpickler would allocate gigabytes for it); do not use this file"
        )
    try:
        content = _DataOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Refused as refused:
        raise FacetrainError(
            f"{path}: refused to load: {refused}, and a verification .bin may only hold "
            "images and flags; do not use this file"
        ) from None
    except Exception as error:
        raise FacetrainError(
            f"{path}: not a readable insightface .bin pickle ({type(error).__name__})"
        ) from None
    return _checked(path, content)


def load_insightface_bin(path: Path, images_root: Path | None, skip_missing: bool) -> PairSet:
    """A PairSet of in-memory images; a .bin has no image files, so the root and skipping do not apply.

    The published .bin files store LFW, CFP and AgeDB pairs in their protocols' fold order, so 10
    consecutive blocks are their folds (insightface scores them the same way).
    """
    images, issame = read_insightface_bin(path)
    left = np.arange(0, len(images), 2, dtype=np.int64)
    return PairSet(
        source=str(path),
        images=images,
        left=left,
        right=left + 1,
        issame=issame,
        folds=contiguous_folds(len(issame)),
        folds_source=FOLDS_IN_FILE_ORDER,
    )


def _checked(path: str | Path, content: object) -> tuple[list[bytes], np.ndarray]:
    if not (isinstance(content, (tuple, list)) and len(content) == 2):
        raise FacetrainError(f"{path}: expected a pickled (images, issame) pair")
    images, issame = content
    if not isinstance(images, (list, tuple)) or not all(
        isinstance(image, (bytes, bytearray)) or (isinstance(image, _EncodedImage) and image.data is not None)
        for image in images
    ):
        raise FacetrainError(
            f"{path}: the first element must be a list of encoded images (bytes or uint8 arrays)"
        )
    if not isinstance(issame, (list, tuple)) or not all(flag in (0, 1) for flag in issame):
        raise FacetrainError(f"{path}: the second element must be a list of booleans")
    if len(images) != 2 * len(issame):
        raise FacetrainError(
            f"{path}: {len(images)} images cannot form {len(issame)} pairs (need exactly twice as many)"
        )
    encoded = [image.data if isinstance(image, _EncodedImage) else bytes(image) for image in images]
    return encoded, np.array(issame, dtype=bool)
