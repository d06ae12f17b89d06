"""Every data source on small fixtures made here, and the image folder on the real ORL faces when present."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from facetrain.data import SOURCES, build_train_dataset, build_train_loader
from facetrain.data.config import DataConfig
from facetrain.data.dataset import FaceDataset
from facetrain.data.decode import decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.listfile import scan_list_file
from facetrain.data.market1501 import (
    DISTRACTOR_PID,
    JUNK_PID,
    load_market1501_split,
    parse_market1501_name,
    scan_market1501_train,
)
from facetrain.data.transforms import build_eval_transform
from facetrain.errors import FacetrainError

LOSSLESS = (".png", ".bmp", ".pgm")


def write_image(path: Path, rgb: np.ndarray) -> None:
    """Writes RGB (or 2-D grayscale) pixels in the format the suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rgb[:, :, ::-1] if rgb.ndim == 3 else rgb
    assert cv2.imwrite(str(path), np.ascontiguousarray(pixels))


def random_rgb(rng: np.random.Generator, height: int = 20, width: int = 16) -> np.ndarray:
    """Smooth random colours, so that lossy formats keep them closely (noise would not survive JPEG)."""
    coarse = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    return cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)


@pytest.fixture
def mixed_folder(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Identities named out of order, every supported format, a grayscale PGM, and files to ignore."""
    rng = np.random.default_rng(0)
    written: dict[str, np.ndarray] = {}
    for identity, suffixes in {"zoe": (".jpg", ".png"), "adam": (".bmp", ".webp"), "mia": (".png",)}.items():
        for number, suffix in enumerate(suffixes):
            path = tmp_path / "faces" / identity / f"{number}{suffix}"
            pixels = random_rgb(rng)
            write_image(path, pixels)
            written[str(path)] = pixels
    gray = rng.integers(0, 256, (20, 16), dtype=np.uint8)
    write_image(tmp_path / "faces" / "mia" / "gray.pgm", gray)
    written[str(tmp_path / "faces" / "mia" / "gray.pgm")] = np.repeat(gray[:, :, None], 3, axis=2)
    (tmp_path / "faces" / "mia" / "notes.txt").write_text("not an image")
    (tmp_path / "faces" / "mia" / "._0.png").write_bytes(b"macOS metadata")
    return tmp_path / "faces", written


def test_folder_labels_come_from_sorted_identity_names(mixed_folder):
    root, written = mixed_folder
    table = scan_image_folder(root)
    assert table.class_names == ["adam", "mia", "zoe"]
    names = [table.reader.name(i) for i in range(len(table.reader))]
    assert sorted(names) == sorted(written)
    for name, label in zip(names, table.labels):
        assert table.class_names[label] == Path(name).parent.name


def test_folder_decodes_every_format_to_rgb_with_three_channels(mixed_folder):
    root, written = mixed_folder
    table = scan_image_folder(root)
    for index in range(len(table.reader)):
        name = table.reader.name(index)
        decoded = decode_image(table.reader.read(index), name=name)
        expected = written[name]
        assert decoded.shape == expected.shape and decoded.dtype == np.uint8
        if name.endswith(LOSSLESS):
            np.testing.assert_array_equal(decoded, expected)
        else:
            error = np.abs(decoded.astype(int) - expected).mean()
            swapped = np.abs(decoded[:, :, ::-1].astype(int) - expected).mean()
            assert error < 8 and error < swapped, name  # lossy, but the same picture in RGB order
    gray = decode_image(root / "mia" / "gray.pgm")
    assert (gray[:, :, 0] == gray[:, :, 1]).all() and (gray[:, :, 1] == gray[:, :, 2]).all()


def test_dataset_resizes_and_normalizes_every_sample(mixed_folder):
    root, written = mixed_folder
    dataset = FaceDataset(scan_image_folder(root), build_eval_transform([12, 10]))
    for index in range(len(dataset)):
        image, label = dataset[index]
        assert image.shape == (3, 12, 10) and image.dtype == torch.float32
        assert -1.0 <= image.min() and image.max() <= 1.0
        assert label == dataset.labels[index]
    assert dataset.num_classes == 3


@pytest.mark.parametrize("separator, suffix, header", [(",", ".csv", True), ("\t", ".tsv", False)])
def test_list_file_resolves_relative_paths_and_remaps_labels(tmp_path, separator, suffix, header):
    rng = np.random.default_rng(1)
    rows = [("images/a.png", 7, 1), ("images/sub/b.png", 3, 2), (None, 7, 1)]
    absolute = tmp_path / "elsewhere" / "c.png"
    lines = ["path,label,camera".replace(",", separator)] if header else []
    for relative, label, camera in rows:
        path = tmp_path / "lists" / relative if relative else absolute
        write_image(path, random_rgb(rng))
        lines.append(separator.join([relative or str(absolute), str(label), str(camera)]))
    list_path = tmp_path / "lists" / f"train{suffix}"
    list_path.write_text("\n".join(lines) + "\n\n")
    table = scan_list_file(list_path)
    assert [table.reader.name(i) for i in range(3)] == [
        str(tmp_path / "lists" / "images/a.png"),
        str(tmp_path / "lists" / "images/sub/b.png"),
        str(absolute),
    ]
    assert table.class_names == ["3", "7"]
    assert table.labels.tolist() == [1, 0, 1]
    assert table.cameras.tolist() == [1, 2, 1]


def test_list_file_without_camera_column(tmp_path):
    write_image(tmp_path / "a.png", random_rgb(np.random.default_rng(2)))
    (tmp_path / "list.csv").write_text("path,label\na.png,0\n")
    table = scan_list_file(tmp_path / "list.csv")
    assert table.labels.tolist() == [0] and table.cameras.tolist() == [-1]


MARKET_FILES = {
    "bounding_box_train": ["0002_c1s1_000451_03.jpg", "0002_c2s1_000551_01.jpg", "0007_c3s3_012345_02.jpg"],
    "bounding_box_test": [
        "-1_c1s1_000401_03.jpg",
        "0000_c2s1_000301_01.jpg",
        "0002_c4s2_000801_02.jpg",
        "0009_c6s4_001201_01.jpg",
    ],
    "query": ["0002_c5s1_000901_00.jpg", "0009_c1s1_001001_00.jpg"],
}


def write_market_tree(root: Path) -> Path:
    """MARKET_FILES as 32x16 images, plus a Thumbs.db in every split as real copies often have."""
    rng = np.random.default_rng(3)
    for folder, names in MARKET_FILES.items():
        for name in names:
            write_image(root / folder / name, random_rgb(rng, 32, 16))
        (root / folder / "Thumbs.db").write_bytes(b"\0")
    return root


@pytest.fixture
def market_root(tmp_path: Path) -> Path:
    return write_market_tree(tmp_path / "market")


def test_market1501_names_parse_to_person_and_camera():
    assert parse_market1501_name("0002_c1s1_000451_03.jpg") == (2, 1)
    assert parse_market1501_name("/x/bounding_box_test/-1_c3s2_000101_01.jpg") == (JUNK_PID, 3)
    assert parse_market1501_name("0000_c6s4_002202_04.jpg") == (DISTRACTOR_PID, 6)
    with pytest.raises(FacetrainError, match="Market-1501 image name"):
        parse_market1501_name("Thumbs.db")


def test_market1501_training_split_relabels_real_people(market_root):
    table = scan_market1501_train(market_root)
    assert table.class_names == ["0002", "0007"]
    assert table.labels.tolist() == [0, 0, 1]
    assert table.cameras.tolist() == [1, 2, 3]


def test_market1501_training_split_drops_junk_and_distractors(market_root):
    write_image(
        market_root / "bounding_box_train" / "0000_c1s1_000001_01.jpg", random_rgb(np.random.default_rng(4))
    )
    write_image(
        market_root / "bounding_box_train" / "-1_c1s1_000002_01.jpg", random_rgb(np.random.default_rng(5))
    )
    table = scan_market1501_train(market_root)
    assert table.class_names == ["0002", "0007"] and len(table.labels) == 3


def test_market1501_test_splits_keep_junk_and_distractors_for_the_protocol(market_root):
    gallery = load_market1501_split(market_root, "gallery")
    assert gallery["pid"].tolist() == sorted(
        parse_market1501_name(name)[0] for name in MARKET_FILES["bounding_box_test"]
    )
    assert {JUNK_PID, DISTRACTOR_PID} <= set(gallery["pid"])
    query = load_market1501_split(market_root, "query")
    assert query[["pid", "camid"]].values.tolist() == [[2, 5], [9, 1]]
    with pytest.raises(FacetrainError, match="unknown Market-1501 split"):
        load_market1501_split(market_root, "val")


def test_every_source_builds_a_training_dataset(tmp_path, mixed_folder, market_root):
    root, _ = mixed_folder
    from facetrain.data.recordio import write_recordio

    rec_path, _ = write_recordio(root, tmp_path / "rec" / "train", progress=False)
    (root / "list.csv").write_text("path,label\nzoe/0.jpg,4\nadam/0.bmp,9\n")
    paths = {"folder": root, "list": root / "list.csv", "recordio": rec_path, "market1501": market_root}
    assert set(paths) <= set(SOURCES.names())
    for source, path in paths.items():
        dataset = build_train_dataset(DataConfig(source=source, path=str(path), image_size=[16, 16]))
        image, label = dataset[0]
        assert image.shape == (3, 16, 16), source
        assert 0 <= label < dataset.num_classes


def test_orl_faces_read_as_40_identities_of_10_images(shared_data):
    table = scan_image_folder(shared_data / "orl")
    assert len(table.class_names) == 40 and len(table.labels) == 400
    assert np.bincount(table.labels).tolist() == [10] * 40
    assert table.class_names == sorted(f"s{n}" for n in range(1, 41))
    dataset = FaceDataset(table, build_eval_transform([112, 92]))
    for index in (0, 199, 399):
        image = decode_image(table.reader.read(index))
        assert image.shape == (112, 92, 3)
        assert (image[:, :, 0] == image[:, :, 2]).all()
        tensor, label = dataset[index]
        assert tensor.shape == (3, 112, 92) and label == table.labels[index]


def test_training_loader_with_worker_processes(mixed_folder):
    root, _ = mixed_folder
    cfg = DataConfig(
        source="folder",
        path=str(root),
        image_size=[8, 8],
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=1,
    )
    dataset = build_train_dataset(cfg)
    loader, sampler = build_train_loader(dataset, cfg, batch_size=2, rank=0, world_size=1, seed=0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        shapes = [images.shape for images, _ in loader]
        assert len(shapes) == len(dataset) // 2
        assert all(shape == (2, 3, 8, 8) for shape in shapes)
