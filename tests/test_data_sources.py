"""Every data source on small fixtures made here, and the image folder on the real ORL faces when present."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.cli.source_names import inspectable_source_names
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
from facetrain.data.sources import inspectable_sources, source_record
from facetrain.data.stats import guess_source
from facetrain.data.transforms import build_eval_transform
from facetrain.errors import FacetrainError
from facetrain.eval.config import EvalConfig
from facetrain.models.config import ModelConfig
from facetrain.train.config_paths import missing_path
from tests.support.images import MARKET_FILES, random_rgb, write_image, write_market_tree

LOSSLESS = (".png", ".bmp", ".pgm")


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


def _recordio_example(tmp_path: Path, folder: Path) -> Path:
    from facetrain.data.recordio import write_recordio

    return write_recordio(folder, tmp_path / "rec" / "train", progress=False)[0]


def _list_example(tmp_path: Path, folder: Path) -> Path:
    (folder / "list.csv").write_text("path,label\nzoe/0.jpg,4\nadam/0.bmp,9\n")
    return folder / "list.csv"


def _synthetic_example(tmp_path: Path, folder: Path) -> Path:
    shutil.copytree(folder, tmp_path / "synth" / "train")
    return tmp_path / "synth"


# a small example of every registered source, made from the mixed image folder in tmp_path
EXAMPLES = {
    "folder": lambda tmp_path, folder: folder,
    "list": _list_example,
    "recordio": _recordio_example,
    "market1501": lambda tmp_path, folder: write_market_tree(tmp_path / "market"),
    "reid": lambda tmp_path, folder: write_market_tree(tmp_path / "market") / "bounding_box_train",
    "synthetic": _synthetic_example,
}


def test_every_registered_source_has_an_example_here():
    assert set(EXAMPLES) == set(SOURCES.names())


@pytest.fixture
def example(request, tmp_path, mixed_folder) -> Path:
    return EXAMPLES[request.param](tmp_path, mixed_folder[0])


@pytest.mark.parametrize("source, example", [(name, name) for name in SOURCES.names()], indirect=["example"])
def test_every_source_builds_a_training_dataset(source, example):
    dataset = build_train_dataset(DataConfig(source=source, path=str(example), image_size=[16, 16]))
    image, label = dataset[0]
    assert image.shape == (3, 16, 16), source
    assert 0 <= label < dataset.num_classes


GUESSED = [name for name in SOURCES.names() if source_record(name).recognise or source_record(name).fallback]


@pytest.mark.parametrize("source, example", [(name, name) for name in GUESSED], indirect=["example"])
def test_facetrain_data_guesses_each_source_from_its_example(source, example):
    assert guess_source(example) == source


def test_the_cli_source_list_is_the_registry():
    """`facetrain data --source` reads the names from the readers' source text (its --help imports no
    reader): the same names, in the registry's order."""
    assert list(inspectable_source_names()) == inspectable_sources()
    assert (
        "synthetic" not in inspectable_source_names()
    )  # the set a run makes: `facetrain data` reads it as a folder


@pytest.mark.parametrize("source", inspectable_sources())
def test_a_missing_data_path_says_what_its_source_reads(tmp_path, source):
    record = source_record(source)
    config = DataConfig(source=source, path=str(tmp_path / "none"))
    problem = missing_path(config, EvalConfig(), ModelConfig())
    assert problem == (
        "data.path",
        config.path,
        f"does not exist; give {record.description}: --set data.path=PATH",
    )
    if record.path_kind is not None:
        other = tmp_path / "other"
        other.mkdir() if record.path_kind == "file" else other.write_text("")
        config = DataConfig(source=source, path=str(other))
        _, _, why = missing_path(config, EvalConfig(), ModelConfig())
        assert why == f"is not a {record.path_kind}; data.source {source!r} reads {record.description}"


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
