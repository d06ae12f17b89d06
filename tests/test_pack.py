"""`facetrain pack`: a folder packed into .rec/.idx/property reads back as the folder, and a .rec from an
independent MXNet-format writer is read alike."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.data.decode import decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.recordio import scan_recordio
from tests.support.images import write_image
from tests.support.pack_folders import write_noise_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_noise_folder(tmp_path / "faces")


def pack(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["pack", *(str(arg) for arg in args)])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def assert_same_set(rec_path: Path, folder: Path) -> None:
    packed, original = scan_recordio(rec_path, progress=False), scan_image_folder(folder)
    assert packed.labels.tolist() == original.labels.tolist()
    for index in range(len(original.labels)):
        stored, source = packed.reader.read(index), original.reader.read(index)
        assert stored == source
        assert np.array_equal(decode_image(stored), decode_image(source))


def test_pack_writes_rec_idx_and_property_that_read_back_as_the_folder(folder: Path, tmp_path: Path):
    out = tmp_path / "packed" / "train.rec"
    code, output = pack(folder, "-o", out, "-q")
    assert code == 0, output
    idx, prop = out.with_suffix(".idx"), out.parent / "property"
    assert output.strip() == f"wrote 7 images of 3 identities (12x10) to {out}, {idx} and {prop}"
    assert prop.read_text() == "3,12,10\n"
    assert sorted(path.name for path in out.parent.iterdir()) == ["property", "train.idx", "train.rec"]
    assert_same_set(out, folder)


def test_pack_refuses_to_overwrite_without_overwrite(folder: Path, tmp_path: Path):
    out = tmp_path / "train.rec"
    (tmp_path / "property").write_text("85742,112,112\n")
    code, output = pack(folder, "-o", out, "-q")
    assert code == 2 and output.strip() == (
        f"error: {tmp_path / 'property'} already exists; pass --overwrite to replace it"
    )
    assert not out.exists() and (tmp_path / "property").read_text() == "85742,112,112\n"
    code, output = pack(folder, "-o", out, "-q", "--overwrite")
    assert code == 0, output
    assert (tmp_path / "property").read_text() == "3,12,10\n"
    assert_same_set(out, folder)


def test_images_of_two_sizes_are_refused_and_nothing_is_left(folder: Path, tmp_path: Path):
    write_image(folder / "bob" / "big.png", np.zeros((16, 16, 3), dtype=np.uint8))
    out = tmp_path / "packed" / "train.rec"
    code, output = pack(folder, "-o", out, "-q")
    assert code == 2 and len(output.strip().splitlines()) == 1
    assert f"{folder / 'bob' / 'big.png'} is 16x16 but {folder / 'alice' / '0.png'} is 12x10" in output
    assert list(out.parent.iterdir()) == []  # no .rec, no .idx, no temporary file


def test_an_output_not_named_rec_is_refused(folder: Path, tmp_path: Path):
    code, output = pack(folder, "-o", tmp_path / "train", "-q")
    assert code == 2 and "name the packed file NAME.rec" in output and not any(tmp_path.glob("train*"))


def test_help_has_examples():
    code, output = pack("--help")
    assert code == 0 and "Examples:" in output and "facetrain pack data/" in output


MAGIC = 0xCED7230A


def write_mxnet_rec(rec_path: Path, records: list[tuple[int, bytes]]) -> None:
    """An independent writer of dmlc RecordIO, as mxnet's MXIndexedRecordIO writes it (no facetrain
    code): per record `magic, lrecord` (length, continuation 0), the payload, zero padding to 4 bytes;
    the .idx is `key<TAB>offset` lines."""
    index = []
    with open(rec_path, "wb") as file:
        for key, payload in records:
            assert struct.pack("<I", MAGIC) not in payload[: len(payload) & ~3]  # no split needed
            index.append(f"{key}\t{file.tell()}\n")
            file.write(struct.pack("<II", MAGIC, len(payload)))
            file.write(payload + b"\0" * (-len(payload) % 4))
    rec_path.with_suffix(".idx").write_text("".join(index))


def image_header(label: float | list[float], record_id: int) -> bytes:
    """mxnet.recordio.IRHeader packed as `pack` does: flag, label, id, id2, then flag float labels."""
    if isinstance(label, list):
        return struct.pack("<IfQQ", len(label), 0.0, record_id, 0) + struct.pack(f"<{len(label)}f", *label)
    return struct.pack("<IfQQ", 0, label, record_id, 0)


def test_a_rec_from_an_independent_writer_is_read(folder: Path, tmp_path: Path):
    table = scan_image_folder(folder)
    images = [table.reader.read(index) for index in range(len(table.labels))]
    labels = table.labels.tolist()
    first = len(images) + 1  # insightface's layout: record 0, images, then one record per identity
    starts = [labels.index(label) + 1 for label in range(3)] + [len(images) + 1]
    records = [(0, image_header([float(first), float(first + 3)], 0))]
    records += [(key, image_header(float(labels[key - 1]), key) + images[key - 1]) for key in range(1, first)]
    records += [
        (first + label, image_header([float(starts[label]), float(starts[label + 1])], first + label))
        for label in range(3)
    ]
    write_mxnet_rec(tmp_path / "train.rec", records)
    (tmp_path / "property").write_text("3,12,10\n")
    assert_same_set(tmp_path / "train.rec", folder)
    plain = tmp_path / "plain"  # im2rec's layout: images only, labels read from every record
    plain.mkdir()
    write_mxnet_rec(plain / "train.rec", records[1:first])
    assert_same_set(plain / "train.rec", folder)
