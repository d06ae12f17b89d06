"""insightface .bin sets: genuine ones load (Python 2 and 3 pickles), anything executable is refused unrun."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from facetrain.errors import FacetrainError
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
    assert pairs.issame.tolist() == ISSAME and pairs.folds is None


def test_malicious_bin_is_refused_without_running(tmp_path: Path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    path.write_bytes(pickle.dumps((IMAGES, [CreatesFileWhenUnpickled(marker), False])))
    with pytest.raises(
        FacetrainError, match=r"evil.bin: refused to load: the pickle asks for (posix|nt|os)\.system"
    ):
        read_insightface_bin(path)
    assert not marker.exists()


def test_numpy_arrays_are_refused(tmp_path: Path):
    path = tmp_path / "numpy.bin"
    path.write_bytes(pickle.dumps((IMAGES, np.array(ISSAME))))
    with pytest.raises(FacetrainError, match="refused to load: the pickle asks for numpy"):
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
