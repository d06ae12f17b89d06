"""`facetrain import dlib`: dlib's face ResNet read without dlib gives dlib's own descriptors.

The reference is dlib itself: `face_recognition_model_v1.compute_face_descriptor` on the same 150x150
chips. The imported model gets them through facetrain's own pixel path (decode, normalize), as
`eval`, `embed` and `compare` feed it. Skipped when dlib or face-recognition-models is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.data.decode import decode_image
from facetrain.data.transforms import EvalTransform
from facetrain.errors import FacetrainError
from facetrain.export.exporter import export_model
from facetrain.interop.dlib_format import read_dlib_network
from facetrain.interop.dlib_import import import_dlib
from facetrain.interop.loading import load_model
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.models.dlib_resnet import MIN_INPUT_SIDE, dlib_layer_sequence, padded_sum
from facetrain.train.resume import load_initial_backbone

CHIP = (150, 150)
TOLERANCE = 1e-4
REAL_CHIPS = 50


@pytest.fixture(scope="module")
def dlib_model() -> tuple[object, Path]:
    """dlib's recognizer and the network file it reads."""
    dlib = pytest.importorskip("dlib", reason="dlib (dlib-bin) is not installed")
    from facetrain.interop.dlib_import import default_dlib_model

    try:
        path = default_dlib_model()
    except FacetrainError as error:
        pytest.skip(f"face-recognition-models is not installed: {error}")
    return dlib.face_recognition_model_v1(str(path)), path


@pytest.fixture(scope="module")
def imported(dlib_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dlib") / "model"
    result = import_dlib(None, out, progress=False)
    assert result.embedding_size == 128 and result.architecture == "dlib_resnet"
    return out


def descriptors(recognizer, chips: list[np.ndarray]) -> np.ndarray:
    return np.array([np.array(recognizer.compute_face_descriptor(chip)) for chip in chips], dtype=np.float64)


def facetrain_embeddings(model_dir: Path, chips: list[np.ndarray]) -> np.ndarray:
    loaded = load_model(model_dir)
    assert loaded.image_size == CHIP
    transform = EvalTransform(loaded.image_size)
    with torch.no_grad():
        return loaded.module(torch.stack([transform(chip) for chip in chips])).double().numpy()


def test_random_chips_give_dlibs_descriptors(dlib_model, imported):
    recognizer, _ = dlib_model
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, (*CHIP, 3), dtype=np.uint8) for _ in range(4)]
    ramp = np.linspace(0, 255, CHIP[1], dtype=np.float64)
    gradients = [
        np.stack([np.tile(ramp, (CHIP[0], 1)).astype(np.uint8)] * 3, axis=2),
        np.full((*CHIP, 3), 200, np.uint8),
    ]
    chips = noise + gradients
    theirs, ours = descriptors(recognizer, chips), facetrain_embeddings(imported, chips)
    assert np.abs(theirs - ours).max() <= TOLERANCE
    assert np.linalg.norm(theirs, axis=1).min() > 0.5  # dlib's descriptors are not unit vectors


@pytest.mark.shared_data
def test_real_face_chips_give_dlibs_descriptors(dlib_model, imported, shared_data):
    """dlib's own example chips (johns/, cut by get_face_chip at 150x150) and LFW photos centre-resized
    to 150x150, grayscale as LFW stores them."""
    recognizer, _ = dlib_model
    johns = sorted((shared_data / "johns").glob("*/*.jpg"))
    lfw = sorted((shared_data / "lfw_raw").glob("*/*.jpg"))[::10]
    if len(johns) + len(lfw) < REAL_CHIPS:
        pytest.skip(f"fewer than {REAL_CHIPS} face images under {shared_data}/johns and lfw_raw")
    chips = [decode_image(path) for path in johns]
    chips += [_centre_chip(decode_image(path)) for path in lfw]
    assert all(chip.shape == (*CHIP, 3) for chip in chips) and len(chips) >= REAL_CHIPS
    theirs, ours = descriptors(recognizer, chips), facetrain_embeddings(imported, chips)
    difference = np.abs(theirs - ours).max()
    print(f"max abs difference over {len(chips)} real chips: {difference:.3g}")
    assert difference <= TOLERANCE
    same = np.linalg.norm(theirs[0] - theirs[1])  # two photos of John Salley
    assert same < 0.6, "dlib's own threshold: the first two johns chips are the same person"


def _centre_chip(image: np.ndarray) -> np.ndarray:
    side = min(image.shape[:2])
    top, left = (image.shape[0] - side) // 2, (image.shape[1] - side) // 2
    square = image[top : top + side, left : left + side]
    return cv2.resize(square, (CHIP[1], CHIP[0]), interpolation=cv2.INTER_AREA)


def test_reader_lists_dlibs_layers_in_the_backbones_order(dlib_model):
    _, path = dlib_model
    network = read_dlib_network(path)
    assert network.input_size == CHIP
    np.testing.assert_allclose(network.input_mean, (122.782, 117.001, 104.298), atol=1e-4)
    backbone = build_backbone(ModelConfig(backbone="dlib_resnet", embedding_size=128))
    assert [layer.kind for layer in network.layers] == [kind for kind, _ in dlib_layer_sequence(backbone)]
    assert sum(layer.kind == "con" for layer in network.layers) == 29


def test_cli_import_is_refused_over_existing_files_and_replaces_with_overwrite(dlib_model, tmp_path):
    runner = CliRunner()
    out = tmp_path / "dlib"
    first = runner.invoke(main, ["import", "dlib", "-o", str(out), "--quiet"])
    assert first.exit_code == 0, first.output
    assert "128-d embeddings" in first.output
    again = runner.invoke(main, ["import", "dlib", "-o", str(out), "--quiet"])
    assert again.exit_code != 0 and "--overwrite" in again.output
    replaced = runner.invoke(main, ["import", "dlib", "-o", str(out), "--quiet", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    meta = json.loads((out / "meta.json").read_text())["imported_from"]
    assert meta["architecture"] == "dlib_resnet" and meta["input"]["scale"] == 256.0


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_damaged_files_are_one_line_errors_that_write_nothing(dlib_model, tmp_path, cut):
    _, path = dlib_model
    data = path.read_bytes()
    damaged = tmp_path / "damaged.dat"
    damaged.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(FacetrainError, match="damaged.dat") as error:
        import_dlib(damaged, tmp_path / "out", progress=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_other_files_are_refused(tmp_path):
    other = tmp_path / "other.dat"
    other.write_bytes(b"\x01\x01\x01\x0aloss_mmod_")
    with pytest.raises(FacetrainError, match="not dlib's metric loss"):
        read_dlib_network(other)
    other.write_bytes(b"PK\x03\x04 not dlib")
    with pytest.raises(FacetrainError, match="other.dat"):
        read_dlib_network(other)


def test_export_and_fine_tuning_start_take_the_import(imported, tmp_path):
    exported = export_model(imported, tmp_path / "export", formats=["safetensors"], progress=False)
    assert exported.card["architecture"] == "dlib_resnet"
    assert exported.card["imported_from"]["input"]["mean"][0] == pytest.approx(122.782, abs=1e-4)
    rng = np.random.default_rng(1)
    chips = [rng.integers(0, 256, (*CHIP, 3), dtype=np.uint8) for _ in range(2)]
    np.testing.assert_allclose(
        facetrain_embeddings(tmp_path / "export", chips), facetrain_embeddings(imported, chips), atol=1e-6
    )
    fresh = build_backbone(ModelConfig(backbone="dlib_resnet", embedding_size=128), CHIP)
    load_initial_backbone(imported, fresh, "dlib_resnet")
    theirs = load_model(imported).module.state_dict()
    assert all(torch.equal(value, theirs[key]) for key, value in fresh.state_dict().items())


def test_padded_sum_zero_fills_the_smaller_tensor_at_the_far_end():
    big = torch.ones(1, 2, 4, 4)
    small = torch.full((1, 3, 3, 3), 2.0)
    total = padded_sum(small, big)
    assert total.shape == (1, 3, 4, 4)
    assert torch.all(total[:, :2, :3, :3] == 3) and torch.all(total[:, 2, :3, :3] == 2)
    assert torch.all(total[:, :2, 3, :] == 1) and torch.all(total[:, 2, 3, :] == 0)


def test_backbone_rejects_inputs_its_strided_convolutions_cannot_take():
    with pytest.raises(FacetrainError, match="too small for dlib_resnet"):
        build_backbone(ModelConfig(backbone="dlib_resnet", embedding_size=128), (112, 112))
    backbone = build_backbone(ModelConfig(backbone="dlib_resnet", embedding_size=16), (MIN_INPUT_SIDE,) * 2)
    assert backbone(torch.zeros(1, 3, MIN_INPUT_SIDE, MIN_INPUT_SIDE)).shape == (1, 16)
