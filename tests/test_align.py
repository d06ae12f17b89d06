"""`facetrain align`, `embed --align` and `compare --align` on real unaligned photos (../shared/data).

Measured on all 200 lfw_raw photos and 55 johns crops: 254 faces found (one LFW photo of a face
turned in profile is missed by the HOG detector); re-detecting the aligned crops puts the eye
centres 1.9 px from the template on average (95th percentile 3.9 px, worst 7.9 px).
"""

from __future__ import annotations

import csv
import importlib.util
import shutil
import sys
from pathlib import Path
from unittest.mock import MagicMock

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from facetrain.align.aligner import FaceAligner
from facetrain.align.runner import align_folder
from facetrain.cli import main
from facetrain.data.decode import decode_image
from facetrain.eval.embedding import EmbedSettings, embed_images
from facetrain.export.exporter import export_loaded
from facetrain.interop.card import build_card
from facetrain.interop.loading import LoadedModel, load_model
from facetrain.models import build_backbone
from facetrain.train.run_config import Config

needs_dlib = pytest.mark.skipif(
    importlib.util.find_spec("dlib") is None,
    reason="the align extra is not installed: pip install 'facetrain[align]'",
)
MODEL_SIZE = (64, 64)


@pytest.fixture(scope="module")
def aligner() -> FaceAligner:
    return FaceAligner()


def eye_errors(aligner: FaceAligner, crops: list[Path]) -> np.ndarray:
    """Pixel distance of each re-detected eye centre from the template, over the crops with a face."""
    errors = []
    for crop in crops:
        landmarks, _ = aligner.landmarks(decode_image(crop))
        if landmarks is not None:
            errors.append(np.linalg.norm(landmarks[:2] - aligner.template[:2], axis=1))
    assert len(errors) >= 0.95 * len(crops), "the aligned crops must still look like faces"
    return np.concatenate(errors)


@needs_dlib
@pytest.mark.shared_data
@pytest.mark.parametrize(("subset", "workers"), [("lfw_raw", 2), ("johns", 1)])
def test_faces_are_found_and_eyes_land_on_the_template(
    shared_data: Path, tmp_path: Path, aligner: FaceAligner, subset: str, workers: int
):
    summary = align_folder(shared_data / subset, tmp_path / "out", workers=workers, progress=False)
    assert summary.images == {"lfw_raw": 200, "johns": 55}[subset]
    assert summary.counts["aligned"] >= 0.97 * summary.images
    with summary.report.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == summary.images and rows == sorted(rows, key=lambda row: row["path"])
    crops = sorted((tmp_path / "out").rglob("*.jpg"))
    assert len(crops) == summary.counts["aligned"]
    assert {crop.parent.name for crop in crops} == {path.name for path in (shared_data / subset).iterdir()}
    assert all(cv2.imread(str(crop)).shape == (112, 112, 3) for crop in crops[:10])
    errors = eye_errors(aligner, crops[:: 4 if subset == "lfw_raw" else 1])
    assert errors.mean() <= 3.0 and np.percentile(errors, 95) <= 5.0, (errors.mean(), errors.max())


def small_source(shared_data: Path, root: Path) -> Path:
    """Two real photos of one person, a noise image without a face and a file that is not an image."""
    person = root / "src" / "Bill_McBride"
    person.mkdir(parents=True)
    for index in (1, 2):
        shutil.copy(shared_data / "lfw_raw/Bill_McBride" / f"Bill_McBride_{index:04d}.jpg", person)
    noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)
    cv2.imwrite(str(person / "noise.png"), noise)
    (person / "broken.jpg").write_bytes(b"not a jpeg")
    return root / "src"


def run(*args: object):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def read_report(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as handle:
        return {row["path"]: row for row in csv.DictReader(handle)}


@needs_dlib
@pytest.mark.shared_data
def test_a_photo_without_a_face_is_reported_and_the_run_goes_on(shared_data: Path, tmp_path: Path):
    source = small_source(shared_data, tmp_path)
    result = run("align", source, "-o", tmp_path / "dst", "--quiet", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("aligned 2 of 4 images into")  # the warning is on stderr
    assert "1 without a face skipped" in result.output and "1 unreadable skipped" in result.output
    report = read_report(tmp_path / "dst" / "align_report.csv")
    assert report["Bill_McBride/noise.png"]["status"] == "no_face"
    assert report["Bill_McBride/broken.jpg"]["status"] == "unreadable"
    assert report["Bill_McBride/Bill_McBride_0001.jpg"]["status"] == "aligned"
    assert sorted(path.name for path in (tmp_path / "dst/Bill_McBride").iterdir()) == [
        "Bill_McBride_0001.jpg",
        "Bill_McBride_0002.jpg",
    ]


@needs_dlib
@pytest.mark.shared_data
def test_fallback_center_writes_a_centre_crop(shared_data: Path, tmp_path: Path):
    source = small_source(shared_data, tmp_path)
    result = run(
        "align", source, "-o", tmp_path / "dst", "--fallback", "center", "--size", "112x96", "--quiet"
    )
    assert result.exit_code == 0, result.output
    assert "1 without a face centre-cropped" in result.output
    report = read_report(tmp_path / "dst" / "align_report.csv")
    assert report["Bill_McBride/noise.png"]["status"] == "center"
    assert cv2.imread(str(tmp_path / "dst/Bill_McBride/noise.png")).shape == (112, 96, 3)
    assert cv2.imread(str(tmp_path / "dst/Bill_McBride/Bill_McBride_0001.jpg")).shape == (112, 96, 3)


@needs_dlib
@pytest.mark.shared_data
def test_nothing_in_dst_is_overwritten_without_asking(shared_data: Path, tmp_path: Path):
    source = small_source(shared_data, tmp_path)
    destination = tmp_path / "dst"
    assert run("align", source, "-o", destination, "--quiet").exit_code == 0
    crop = destination / "Bill_McBride/Bill_McBride_0001.jpg"
    crop.write_bytes(b"user's own file")
    result = run("align", source, "-o", destination, "--quiet")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {crop} already exists; pass --overwrite to replace it"
    assert crop.read_bytes() == b"user's own file"
    assert run("align", source, "-o", destination, "--quiet", "--overwrite").exit_code == 0
    assert cv2.imread(str(crop)).shape == (112, 112, 3)


@needs_dlib
@pytest.mark.shared_data
def test_destination_inside_the_source_is_refused(shared_data: Path, tmp_path: Path):
    source = small_source(shared_data, tmp_path)
    result = run("align", source, "-o", source / "aligned", "--quiet")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "inside SRC" in result.output


def test_without_the_extra_align_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "src/a").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "src/a/x.png"), np.zeros((8, 8, 3), np.uint8))
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "dlib", None)  # import dlib now raises ImportError
        result = run("align", tmp_path / "src", "-o", tmp_path / "dst")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "pip install 'facetrain[align]'" in result.output
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "dlib", MagicMock())  # dlib without its model files
        patch.setattr("facetrain.align.dlib_models.MODELS_PACKAGE", "no_such_face_models")
        result = run("align", tmp_path / "src", "-o", tmp_path / "dst")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "dlib's face models" in result.output
    assert "pip install 'facetrain[align]'" in result.output
    assert not (tmp_path / "dst").exists()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = Config()
    config.model.backbone = "small"
    config.model.embedding_size = 16
    config.data.image_size = list(MODEL_SIZE)
    module = build_backbone(config.model, image_size=MODEL_SIZE).eval()
    meta = {
        "step": 1,
        "evaluation": {"accuracy": 0.9, "threshold": 0.5, "threshold_far": 0.0125, "flip": True},
    }
    card = build_card(module, config, meta, MODEL_SIZE, Path("fresh"))
    out = tmp_path_factory.mktemp("model")
    export_loaded(
        LoadedModel(module, MODEL_SIZE, card, Path("fresh"), "checkpoint"),
        out,
        ["safetensors"],
        progress=False,
    )
    return out


@needs_dlib
@pytest.mark.shared_data
def test_compare_align_takes_two_raw_photos(shared_data: Path, model_dir: Path):
    photos = [shared_data / "lfw_raw/Bill_McBride" / f"Bill_McBride_{index:04d}.jpg" for index in (1, 2)]
    result = run("compare", model_dir, *photos, "--align")
    assert result.exit_code == 0, result.output
    assert "threshold 0.5000" in result.output and "(threshold at FAR 1.25% in evaluation)" in result.output
    model = load_model(model_dir)
    aligner = FaceAligner(MODEL_SIZE)
    crops = [aligner.align(decode_image(photo)).crop for photo in photos]
    vectors = embed_images(model.module, crops, EmbedSettings(MODEL_SIZE, progress=False))
    assert f"similarity {float(vectors[0] @ vectors[1]):.4f}" in result.output


@needs_dlib
@pytest.mark.shared_data
def test_compare_align_on_a_photo_without_a_face_is_one_line(
    shared_data: Path, tmp_path: Path, model_dir: Path
):
    source = small_source(shared_data, tmp_path)
    noise = source / "Bill_McBride/noise.png"
    result = run("compare", model_dir, source / "Bill_McBride/Bill_McBride_0001.jpg", noise, "--align")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {noise}: no face found; pass a photo with a visible face, or an aligned crop without --align"
    )


@needs_dlib
@pytest.mark.shared_data
def test_embed_align_leaves_out_faceless_photos(shared_data: Path, tmp_path: Path, model_dir: Path):
    source = small_source(shared_data, tmp_path)
    (source / "Bill_McBride/broken.jpg").unlink()
    out = tmp_path / "faces.npy"
    result = run("embed", model_dir, source, "-o", out, "--align")
    assert result.exit_code == 0, result.output
    assert "left out 1 images without a face, e.g." in result.output and "noise.png" in result.output
    assert np.load(out).shape == (2, 16)
    assert [Path(line).name for line in (tmp_path / "faces.paths.txt").read_text().splitlines()] == [
        "Bill_McBride_0001.jpg",
        "Bill_McBride_0002.jpg",
    ]


@needs_dlib
@pytest.mark.shared_data
def test_the_cnn_detector_finds_the_turned_face_hog_misses(shared_data: Path, aligner: FaceAligner):
    photo = decode_image(shared_data / "lfw_raw/Richard_Gere/Richard_Gere_0005.jpg")
    assert aligner.align(photo) is None
    found = FaceAligner(detector="cnn").align(photo)
    assert found is not None and found.crop.shape == (112, 112, 3)
