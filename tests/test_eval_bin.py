"""insightface .bin sets: every form genuine files take loads (Python 2 and 3 pickles of byte strings or
of cv2.imencode arrays); anything executable, and any misuse of the few allowed globals, is refused unrun."""

from __future__ import annotations

import codecs
import os
import pickle
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest

from facetrain.errors import FacetrainError
from facetrain.eval.folds import FOLDS_IN_FILE_ORDER
from facetrain.eval.insightface_bin import read_insightface_bin
from facetrain.eval.pairs import load_pairs

IMAGES = [b"\xff\xd8jpeg-one", b"\xff\xd8jpeg-two", b"png-three", b"png-four"]
ISSAME = [True, False]


def python2_style_pickle(images: list[bytes], issame: list[bool]) -> bytes:
    """What Python 2's pickle (protocol 2) writes for (list of str, list of bool): byte strings as
    SHORT_BINSTRING/BINSTRING, which only load as bytes with encoding="bytes"."""
    out = bytearray(b"\x80\x02]q\x00(")
    for image in images:
        if len(image) < 256:
            out += b"U" + bytes([len(image)]) + image
        else:
            out += b"T" + struct.pack("<I", len(image)) + image
    out += b"e]q\x01("
    out += b"".join(b"\x88" if flag else b"\x89" for flag in issame)
    out += b"e\x86q\x02."
    return bytes(out)


class CreatesFileWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_python2_bin_loads_as_bytes(tmp_path: Path):
    path = tmp_path / "lfw.bin"
    path.write_bytes(python2_style_pickle(IMAGES + [b"x" * 300, b"y" * 300], ISSAME + [True]))
    images, issame = read_insightface_bin(path)
    assert images[:4] == IMAGES and images[4] == b"x" * 300
    assert issame.tolist() == [True, False, True]


def test_python3_bin_becomes_a_pair_set(tmp_path: Path):
    path = tmp_path / "agedb_30.bin"
    path.write_bytes(pickle.dumps((IMAGES, ISSAME), protocol=pickle.HIGHEST_PROTOCOL))
    pairs = load_pairs(path)
    assert pairs.images == IMAGES
    assert pairs.left.tolist() == [0, 2] and pairs.right.tolist() == [1, 3]
    assert pairs.issame.tolist() == ISSAME
    assert pairs.folds.tolist() == [0, 1] and pairs.folds_source == FOLDS_IN_FILE_ORDER, (
        "a .bin is in its protocol's fold order: consecutive blocks are its folds"
    )


def test_malicious_bin_is_refused_without_running(tmp_path: Path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    path.write_bytes(pickle.dumps((IMAGES, [CreatesFileWhenUnpickled(marker), False])))
    with pytest.raises(
        FacetrainError, match=r"evil.bin: refused to load: the pickle asks for (posix|nt|os)\.system"
    ):
        read_insightface_bin(path)
    assert not marker.exists()


def encoded_arrays(count: int = 4) -> list[np.ndarray]:
    """What insightface's build_eval_pack.py stores per image: the uint8 array cv2.imencode returns."""
    rng = np.random.default_rng(0)
    return [cv2.imencode(".png", rng.integers(0, 256, (6, 5, 3), dtype=np.uint8))[1] for _ in range(count)]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_imencode_arrays_load_at_every_protocol(tmp_path: Path, protocol: int):
    """Protocols 2-4 pickle an array through numpy's _reconstruct and dtype, 5 through _frombuffer;
    protocol 2 also wraps the raw bytes in _codecs.encode."""
    arrays = encoded_arrays()
    path = tmp_path / "pack.bin"
    path.write_bytes(pickle.dumps((arrays, ISSAME), protocol=protocol))
    images, issame = read_insightface_bin(path)
    assert images == [array.tobytes() for array in arrays]
    assert issame.tolist() == ISSAME
    decoded = cv2.imdecode(np.frombuffer(images[0], dtype=np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(decoded, cv2.imdecode(arrays[0], cv2.IMREAD_COLOR))


def test_python3_protocol2_bytes_load_through_codecs(tmp_path: Path):
    content = pickle.dumps((IMAGES, ISSAME), protocol=2)
    assert b"_codecs\nencode" in content, "Python 3 writes bytes at protocol 2 as _codecs.encode calls"
    path = tmp_path / "lfw.bin"
    path.write_bytes(content)
    images, issame = read_insightface_bin(path)
    assert images == IMAGES and issame.tolist() == ISSAME


def test_fortran_ordered_arrays_come_back_in_c_order(tmp_path: Path):
    array = np.arange(6, dtype=np.uint8).reshape(2, 3).T
    for protocol in (2, 5):
        path = tmp_path / f"fortran{protocol}.bin"
        path.write_bytes(pickle.dumps(([array, array], [True]), protocol=protocol))
        assert read_insightface_bin(path)[0] == [array.tobytes()] * 2


def python2_array_pickle(raw_images: list[bytes], issame: list[bool]) -> bytes:
    """What Python 2's pickle (protocol 2) writes for a list of 1-D uint8 numpy arrays: numpy.core's
    _reconstruct, the dtype by name, and the raw data as a byte string."""
    out = bytearray(b"\x80\x02]q\x00(")
    for raw in raw_images:
        out += b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
        out += b"(K\x01J" + struct.pack("<i", len(raw)) + b"\x85"
        out += (
            b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
        )
        out += b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb"
    out += b"e]q\x01("
    out += b"".join(b"\x88" if flag else b"\x89" for flag in issame)
    out += b"e\x86q\x02."
    return bytes(out)


def test_python2_numpy_arrays_load(tmp_path: Path):
    path = tmp_path / "py2_arrays.bin"
    raw = [array.tobytes() for array in encoded_arrays()]
    path.write_bytes(python2_array_pickle(raw, ISSAME))
    images, issame = read_insightface_bin(path)
    assert images == raw and issame.tolist() == ISSAME


def call(module: str, name: str, args: tuple) -> bytes:
    """Pickle opcodes calling module.name(*args), to splice into a .bin-shaped pickle."""
    return f"c{module}\n{name}\n".encode() + pickle.dumps(args, protocol=2)[2:-1] + b"R"


def bin_shaped(first_image: bytes) -> bytes:
    """A protocol-2 pickle shaped like a genuine .bin whose first image is `first_image`'s opcodes."""
    return b"\x80\x02](" + first_image + b"U\x03two" + b"e](\x88e\x86."


MISUSES = {
    "object array": (
        call("numpy.core.multiarray", "_reconstruct", (np.ndarray, (0,), b"b"))
        + pickle.dumps((1, (2,), np.dtype("u1"), False, [1, 2]), protocol=2)[2:-1]
        + b"b",
        "items are objects",
    ),
    "object dtype": (
        call("numpy._core.numeric", "_frombuffer", (b"ab", np.dtype("O"), (2,), "C")),
        "dtype 'O",
    ),
    "float dtype": (call("numpy", "dtype", ("f8", False, True)), "dtype 'f8'"),
    "buffer not bytes": (
        call("numpy._core.numeric", "_frombuffer", ([1, 2], np.dtype("u1"), (2,), "C")),
        "list",
    ),
    "wrong size": (
        call("numpy._core.numeric", "_frombuffer", (b"abc", np.dtype("u1"), (2,), "C")),
        "3 bytes",
    ),
    "reconstruct other": (
        call("numpy._core.multiarray", "_reconstruct", (codecs.encode, (0,), b"b")),
        "not an ndarray",
    ),
    "state not array": (
        call("numpy._core.multiarray", "_reconstruct", (np.ndarray, (0,), b"b"))
        + pickle.dumps({"data": b"x"}, protocol=2)[2:-1]
        + b"b",
        "unknown state",
    ),
    "codecs other": (call("_codecs", "encode", ("print(1)", "rot13")), "_codecs.encode"),
    "codecs bytes": (call("_codecs", "encode", (b"x", "zlib")), "_codecs.encode"),
    "numpy load": (call("numpy", "load", ("/etc/passwd",)), "numpy.load"),
    "numpy scalar": (
        call("numpy.core.multiarray", "scalar", (np.dtype("u1"), b"\x01")),
        "numpy.core.multiarray.scalar",
    ),
}


@pytest.mark.parametrize("case", list(MISUSES))
def test_misused_allowed_globals_are_refused(tmp_path: Path, case: str):
    opcodes, message = MISUSES[case]
    path = tmp_path / "crafted.bin"
    path.write_bytes(bin_shaped(opcodes))
    with pytest.raises(FacetrainError, match="crafted.bin: refused to load: ") as refused:
        read_insightface_bin(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("opcodes", "asked_for"),
    [
        (
            call("numpy._core.multiarray", "_reconstruct", (codecs.encode, (0,), b"b")),
            "reconstruct _codecs.encode",
        ),
        (
            call("numpy.core.numeric", "_frombuffer", (b"ab", np.ndarray, (2,), "C")),
            "buffer of numpy.ndarray",
        ),
        (call("numpy", "dtype", ((np.dtype, 1), False, True)), "dtype (numpy.dtype, 1)"),
    ],
    ids=["reconstruct", "frombuffer", "dtype"],
)
def test_refusals_name_what_the_file_asked_for(tmp_path: Path, opcodes: bytes, asked_for: str):
    """Never the reader's own stand-in (`<function _latin1_encode at 0x7f...>`)."""
    path = tmp_path / "crafted.bin"
    path.write_bytes(bin_shaped(opcodes))
    with pytest.raises(FacetrainError, match="refused to load") as refused:
        read_insightface_bin(path)
    assert asked_for in str(refused.value)
    assert "0x" not in str(refused.value) and "<" not in str(refused.value)


@pytest.mark.parametrize("protocol", [2, 5])
def test_code_inside_array_forms_is_refused_without_running(tmp_path: Path, protocol: int):
    """An object array whose item runs code, and a protocol-2 (_codecs) pickle carrying os.system."""
    marker = tmp_path / "pwned"
    evil_array = np.array([CreatesFileWhenUnpickled(marker), 1], dtype=object)
    for name, content in {
        "array.bin": (encoded_arrays(3) + [evil_array], ISSAME),
        "codecs.bin": (IMAGES, [CreatesFileWhenUnpickled(marker), False]),
    }.items():
        path = tmp_path / name
        path.write_bytes(pickle.dumps(content, protocol=protocol))
        with pytest.raises(FacetrainError, match="refused to load"):
            read_insightface_bin(path)
    assert not marker.exists()


def test_numpy_flags_are_refused(tmp_path: Path):
    """issame must be plain booleans: a bool array is not a uint8 buffer, numpy booleans are scalars."""
    for name, flags in {"array": np.array(ISSAME), "scalars": [np.bool_(True), np.bool_(False)]}.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(pickle.dumps((IMAGES, flags)))
        with pytest.raises(FacetrainError, match="refused to load: the pickle asks for"):
            read_insightface_bin(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (pickle.dumps([IMAGES]), r"expected a pickled \(images, issame\) pair"),
        (pickle.dumps((["text"] * 4, ISSAME)), "list of encoded images"),
        (pickle.dumps((IMAGES, ["yes", "no"])), "list of booleans"),
        (pickle.dumps((IMAGES, [True])), "4 images cannot form 1 pairs"),
        (b"not a pickle at all", "not a readable insightface .bin"),
        (pickle.dumps((IMAGES, ISSAME))[:-5], "not a readable insightface .bin"),
    ],
)
def test_malformed_bins_are_one_line_errors(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(FacetrainError, match=message):
        read_insightface_bin(path)
