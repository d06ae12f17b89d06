"""insightface RecordIO: the reader gives back exactly what the writer stored, in one process and in workers."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from facetrain.data.dataset import FaceDataset
from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.recordio import (
    MAGIC,
    RecordIOFile,
    RecordIOWriter,
    pack_image_record,
    scan_recordio,
    unpack_image_record,
    write_recordio,
)
from facetrain.errors import FacetrainError
from tests.support.images import write_image


def pixels_as_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image)


@pytest.fixture
def png_folder(tmp_path: Path) -> Path:
    """Three identities of noise PNGs (lossless, so pixels must match exactly), sizes varying per image."""
    rng = np.random.default_rng(0)
    root = tmp_path / "faces"
    for identity, count in (("carol", 3), ("alice", 4), ("bob", 2)):
        for number in range(count):
            pixels = rng.integers(0, 256, (10 + number, 12, 3), dtype=np.uint8)
            write_image(root / identity / f"{number}.png", pixels)
    return root


@pytest.fixture
def rec_path(png_folder: Path, tmp_path: Path) -> Path:
    return write_recordio(png_folder, tmp_path / "rec" / "train", progress=False)[0]


def expected_samples(folder: Path) -> list[tuple[np.ndarray, int]]:
    table = scan_image_folder(folder)
    return [(decode_image(table.reader.read(i)), int(table.labels[i])) for i in range(len(table.labels))]


def test_reader_returns_the_written_labels_and_pixels(png_folder, rec_path):
    table = scan_recordio(rec_path, progress=False)
    folder_table = scan_image_folder(png_folder)
    assert table.class_names == ["0", "1", "2"] and len(folder_table.class_names) == 3
    assert table.labels.tolist() == folder_table.labels.tolist()
    for index, (pixels, _) in enumerate(expected_samples(png_folder)):
        assert table.reader.read(index) == folder_table.reader.read(index)
        np.testing.assert_array_equal(decode_image(table.reader.read(index)), pixels)


def test_reader_matches_through_a_dataloader_with_two_workers(png_folder, rec_path):
    dataset = FaceDataset(scan_recordio(rec_path, progress=False), pixels_as_tensor)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, shuffle=False)
    received = [(image.numpy(), int(label)) for image, label in loader]
    expected = expected_samples(png_folder)
    assert len(received) == len(expected)
    for (image, label), (pixels, expected_label) in zip(received, expected):
        assert label == expected_label
        np.testing.assert_array_equal(image, pixels)


def test_insightface_bookkeeping_records(png_folder, rec_path):
    records = RecordIOFile(rec_path)
    images = len(scan_image_folder(png_folder).labels)
    header = records.read_header(0)
    assert header.flag == 2 and header.label.tolist() == [images + 1, images + 4]
    ranges = [records.read_header(key).label.tolist() for key in range(images + 1, images + 4)]
    assert ranges == [[1, 5], [5, 7], [7, 10]]  # alice 4, bob 2, carol 3 images, in key order


def test_record_layout_matches_dmlc_byte_for_byte(tmp_path):
    payload = b"abcdefg"  # 7 bytes: one byte of zero padding
    writer = RecordIOWriter(tmp_path / "x.rec", tmp_path / "x.idx")
    writer.write(0, payload)
    writer.write(1, b"12345678")
    writer.close()
    expected = struct.pack("<II", MAGIC, 7) + payload + b"\0" + struct.pack("<II", MAGIC, 8) + b"12345678"
    assert (tmp_path / "x.rec").read_bytes() == expected
    assert (tmp_path / "x.idx").read_text() == f"0\t0\n1\t{8 + 8}\n"


def test_payloads_containing_the_magic_word_are_split_and_restored(tmp_path):
    magic = struct.pack("<I", MAGIC)
    payloads = {
        0: b"head" + magic + b"mid." + magic + b"tail!",  # two aligned occurrences: three parts
        1: magic,  # nothing but the magic word
        2: b"x" + magic + b"yyy",  # unaligned: stored whole
        3: b"",
    }
    writer = RecordIOWriter(tmp_path / "m.rec", tmp_path / "m.idx")
    for key, payload in payloads.items():
        writer.write(key, payload)
    writer.close()
    records = RecordIOFile(tmp_path / "m.rec")
    assert {key: records.read(key) for key in payloads} == payloads
    first_lrecord = struct.unpack_from("<I", (tmp_path / "m.rec").read_bytes(), 4)[0]
    assert first_lrecord >> 29 == 1 and first_lrecord & ((1 << 29) - 1) == 4


def test_label_vectors_and_plain_sets_without_a_header_record(tmp_path):
    write_image(tmp_path / "p.png", np.full((4, 4, 3), 7, np.uint8))
    image = (tmp_path / "p.png").read_bytes()
    writer = RecordIOWriter(tmp_path / "plain.rec", tmp_path / "plain.idx")
    for key, label in ((5, 3.0), (6, [8.0, 1.0]), (9, 3.0)):
        writer.write(key, pack_image_record(label, image, key))
    writer.close()
    table = scan_recordio(tmp_path / "plain.rec", progress=False)
    assert table.class_names == ["3", "8"] and table.labels.tolist() == [0, 1, 0]
    header, body = unpack_image_record(pack_image_record([8.0, 1.0], b"xyz"))
    assert header.flag == 2 and header.class_label == 8.0 and body == b"xyz"


def test_dataset_folder_path_finds_train_rec(png_folder, tmp_path):
    write_recordio(png_folder, tmp_path / "set" / "train", progress=False)
    assert len(scan_recordio(tmp_path / "set", progress=False).labels) == 9


def test_truncated_rec_names_the_record(rec_path):
    data = rec_path.read_bytes()
    rec_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FacetrainError) as caught:
        scan_recordio(rec_path, progress=False)
    message = str(caught.value)
    assert str(rec_path) in message and "record" in message and "\n" not in message


def test_rec_cut_inside_its_last_record_names_it(tmp_path):
    writer = RecordIOWriter(tmp_path / "t.rec", tmp_path / "t.idx")
    writer.write(0, pack_image_record(1.0, b"p" * 64))
    writer.write(1, pack_image_record(1.0, b"q" * 64))
    writer.close()
    data = (tmp_path / "t.rec").read_bytes()
    (tmp_path / "t.rec").write_bytes(data[:-10])
    with pytest.raises(FacetrainError, match=r"record 1 is truncated"):
        RecordIOFile(tmp_path / "t.rec")


def test_index_entry_past_the_end_names_the_line_and_record(rec_path):
    idx_path = rec_path.with_suffix(".idx")
    lines = idx_path.read_text().splitlines()
    idx_path.write_text("\n".join(lines + ["999\t123456789"]) + "\n")
    with pytest.raises(FacetrainError) as caught:
        scan_recordio(rec_path, progress=False)
    message = str(caught.value)
    assert f"line {len(lines) + 1}: record 999 at byte 123456789" in message and "\n" not in message


def test_damaged_record_is_a_bad_image_that_can_be_skipped(rec_path):
    table = scan_recordio(rec_path, progress=False)
    offset = table.reader.records.offsets[3]
    data = bytearray(rec_path.read_bytes())
    data[offset : offset + 4] = b"\0\0\0\0"
    rec_path.write_bytes(bytes(data))
    with pytest.raises(BadImageError, match=r"record 3: no record starts"):
        FaceDataset(table, pixels_as_tensor)[2]
    skipping = FaceDataset(table, pixels_as_tensor, skip_bad_images=True)
    assert [label for _, label in skipping] == table.labels[[0, 1, 3, 3, 4, 5, 6, 7, 8]].tolist()
    assert skipping.bad_images == 1


def test_rec_without_idx_is_exactly_one_line(rec_path):
    """The error, and no 'Exception ignored in __del__' from the half-built reader after it."""
    rec_path.with_suffix(".idx").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "facetrain", "data", str(rec_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: RecordIO index {rec_path.with_suffix('.idx')} does not exist; it must sit beside train.rec"
    ]


def test_writer_refuses_to_replace_existing_files(png_folder, rec_path):
    with pytest.raises(FacetrainError, match="already exists"):
        write_recordio(png_folder, rec_path.with_suffix(""), progress=False)
    write_recordio(png_folder, rec_path.with_suffix(""), overwrite=True, progress=False)
    assert len(scan_recordio(rec_path, progress=False).labels) == 9


def test_orl_round_trips_through_recordio(shared_data, tmp_path):
    folder = scan_image_folder(shared_data / "orl")
    rec_path, _ = write_recordio(shared_data / "orl", tmp_path / "orl", progress=False)
    table = scan_recordio(rec_path, progress=False)
    assert len(table.class_names) == 40 and table.labels.tolist() == folder.labels.tolist()
    assert all(table.reader.read(i) == folder.reader.read(i) for i in range(400))
    np.testing.assert_array_equal(decode_image(table.reader.read(123)), decode_image(folder.reader.read(123)))


def test_insightface_property_file_is_checked_against_the_set(rec_path):
    """insightface's `property` (classes,height,width) beside train.rec; the first image is 10x12."""
    property_file = rec_path.parent / "property"
    property_file.write_text("3,10,12\n")
    assert len(scan_recordio(rec_path, progress=False).class_names) == 3
    for text, message in {
        "85742,112,112": r"says 85742 classes, but .*train.rec holds 3 identities",
        "3,112,112": r"says 112x112 images, but .*train.rec record 1 is 10x12",
        "3;112;112": r"expected insightface's 'classes,height,width'",
    }.items():
        property_file.write_text(text)
        with pytest.raises(FacetrainError, match=message) as error:
            scan_recordio(rec_path, progress=False)
        assert "\n" not in str(error.value)
