"""Bad input: one-line errors naming the file and line or record, and bad images skipped only when asked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from facetrain.data.dataset import FaceDataset
from facetrain.data.decode import BadImageError, DataError, decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.listfile import scan_list_file
from facetrain.errors import FacetrainError
from tests.support.images import random_rgb, write_image


def label_only(image: np.ndarray) -> torch.Tensor:
    return torch.tensor(image.shape[0])


def assert_one_line(error: BaseException, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.fixture
def folder_with_bad_files(tmp_path: Path) -> tuple[Path, list[str]]:
    """Ten images over two identities; two of them corrupt (garbage bytes, and an empty file)."""
    rng = np.random.default_rng(0)
    root = tmp_path / "faces"
    for number in range(10):
        write_image(root / ("a" if number < 5 else "b") / f"{number}.png", random_rgb(rng))
    (root / "a" / "3.png").write_bytes(b"this is not a png")
    (root / "b" / "7.png").write_bytes(b"")
    return root, [str(root / "a" / "3.png"), str(root / "b" / "7.png")]


def test_corrupt_image_names_the_file(folder_with_bad_files):
    root, bad = folder_with_bad_files
    dataset = FaceDataset(scan_image_folder(root), label_only)
    with pytest.raises(BadImageError) as caught:
        dataset[3]
    assert_one_line(caught.value, bad[0], "skip_bad_images")
    with pytest.raises(BadImageError) as caught:
        decode_image(bad[1])
    assert_one_line(caught.value, bad[1])


def test_missing_image_names_the_file(tmp_path):
    with pytest.raises(BadImageError) as caught:
        decode_image(tmp_path / "gone.jpg")
    assert_one_line(caught.value, str(tmp_path / "gone.jpg"), "does not exist")


def error_of_epoch(loader: DataLoader) -> BaseException | None:
    """The error an epoch raises, with its traceback dropped so that the workers stop at once.

    A traceback keeps the loader's iterator alive in a reference cycle; when the garbage collector
    finally ends it, PyTorch waits seconds for each worker to exit.
    """
    iterator = iter(loader)
    try:
        for _ in iterator:
            pass
    except Exception as error:
        error.__traceback__ = None
        return error
    finally:
        del iterator
    return None


def test_corrupt_image_in_a_worker_stays_one_line(folder_with_bad_files):
    root, bad = folder_with_bad_files
    dataset = FaceDataset(scan_image_folder(root), label_only)
    error = error_of_epoch(DataLoader(dataset, batch_size=5, num_workers=2))
    assert isinstance(error, BadImageError)
    assert_one_line(error, bad[0])


def test_skip_bad_images_skips_and_counts(folder_with_bad_files):
    root, _ = folder_with_bad_files
    dataset = FaceDataset(scan_image_folder(root), label_only, skip_bad_images=True)
    labels = [dataset[index][1] for index in range(len(dataset))]
    assert len(labels) == 10 and dataset.bad_images == 2
    # a bad image is replaced by the next readable one: index 3 gives index 4's sample
    assert labels[3] == labels[4] == 0 and labels[7] == labels[8] == 1
    dataset.reset_bad_images()
    assert dataset.bad_images == 0


def test_skip_bad_images_counts_across_two_workers(folder_with_bad_files):
    root, _ = folder_with_bad_files
    dataset = FaceDataset(scan_image_folder(root), label_only, skip_bad_images=True)
    loader = DataLoader(dataset, batch_size=2, num_workers=2)
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == 10
    assert dataset.bad_images == 2


def test_every_image_unreadable_is_an_error_even_when_skipping(tmp_path):
    for name in ("a/1.jpg", "a/2.jpg"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"junk")
    dataset = FaceDataset(scan_image_folder(tmp_path), label_only, skip_bad_images=True)
    with pytest.raises(DataError, match="every image"):
        dataset[0]
    with pytest.raises(IndexError):
        dataset[2]


def test_missing_folder_empty_dataset_and_empty_identity(tmp_path):
    with pytest.raises(FacetrainError) as caught:
        scan_image_folder(tmp_path / "nowhere")
    assert_one_line(caught.value, str(tmp_path / "nowhere"), "does not exist")
    with pytest.raises(FacetrainError) as caught:
        scan_image_folder(tmp_path)
    assert_one_line(caught.value, str(tmp_path), "no identity folders")
    write_image(tmp_path / "alice" / "1.png", random_rgb(np.random.default_rng(1)))
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "readme.txt").write_text("no faces yet")
    with pytest.raises(FacetrainError) as caught:
        scan_image_folder(tmp_path)
    assert_one_line(caught.value, str(tmp_path / "bob"), "has no images")


@pytest.mark.parametrize(
    "lines, fragments",
    [
        (["path,label", "a.png,0", "missing.png,1"], ["line 3", "missing.png", "does not exist"]),
        (["path,label", "a.png,0", "a.png,seven"], ["line 3", "label 'seven' is not an integer"]),
        (["a.png,0", "a.png,1.5"], ["line 2", "not an integer"]),
        (["a.png,0", "", "a.png"], ["line 3", "label '' is not an integer"]),
        (["path,label", "a.png,0", ",4"], ["line 3", "the path is empty"]),
        (["path,label,camera", "a.png,0,c1"], ["line 2", "camera 'c1' is not an integer"]),
        (["path,label"], ["lists no images"]),
        ([""], ["is empty"]),
    ],
)
def test_list_file_errors_name_the_line(tmp_path, lines, fragments):
    write_image(tmp_path / "a.png", random_rgb(np.random.default_rng(2)))
    list_path = tmp_path / "train.csv"
    list_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FacetrainError) as caught:
        scan_list_file(list_path)
    assert_one_line(caught.value, str(list_path), *fragments)


def test_missing_list_file(tmp_path):
    with pytest.raises(FacetrainError) as caught:
        scan_list_file(tmp_path / "none.csv")
    assert_one_line(caught.value, str(tmp_path / "none.csv"))
