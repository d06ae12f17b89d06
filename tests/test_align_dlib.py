"""`facetrain align --template dlib`: chips cut where dlib's own `get_face_chip(image, shape, 150, 0.25)`
cuts them, so dlib's face ResNet sees what it was trained on."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from facetrain.align.aligner import FaceAligner
from facetrain.align.dlib_chip import DLIB_CHIP_SIZE, dlib_chip_matrix, dlib_chip_points
from facetrain.cli import main
from facetrain.data.decode import decode_image
from facetrain.errors import FacetrainError

PHOTOS = 6


def test_chip_matrix_puts_the_landmarks_on_dlibs_positions_sampled_corner_to_corner():
    """Landmarks already at the chip positions: dlib's sampling rectangle is the chip's side times the
    fitted scale, with the first and last pixels on its corners, so positions shrink by (side - 1) / side
    about the centre."""
    side = DLIB_CHIP_SIZE[0]
    points = dlib_chip_points(DLIB_CHIP_SIZE)
    matrix = dlib_chip_matrix(points, DLIB_CHIP_SIZE)
    mapped = points @ matrix[:, :2].T + matrix[:, 2]
    expected = (points - side / 2) * (side - 1) / side + (side - 1) / 2
    np.testing.assert_allclose(mapped, expected, atol=1e-9)
    angle = np.deg2rad(20)
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    photo = points @ (2 * rotation).T + [40, 10]
    np.testing.assert_allclose(
        dlib_chip_matrix(photo, DLIB_CHIP_SIZE)[:, :2], rotation.T / 2 * (side - 1) / side
    )
    with pytest.raises(FacetrainError, match="square"):
        dlib_chip_matrix(points, (150, 120))


@pytest.mark.shared_data
def test_chips_match_dlibs_get_face_chip(shared_data):
    dlib = pytest.importorskip("dlib", reason="dlib (dlib-bin) is not installed")
    from facetrain.align.dlib_models import model_file

    recognizer = dlib.face_recognition_model_v1(str(model_file("dlib_face_recognition_resnet_model_v1.dat")))
    aligner = FaceAligner(None, template="dlib")
    assert aligner.size == DLIB_CHIP_SIZE
    photos = sorted((shared_data / "lfw_raw").glob("*/*_0001.jpg"))[:PHOTOS]
    compared = 0
    for path in photos:
        image = decode_image(path)
        aligned = aligner.align(image)
        if aligned is None:
            continue
        shape = dlib.full_object_detection(
            dlib.rectangle(0, 0, image.shape[1], image.shape[0]),
            [dlib.point(int(x), int(y)) for x, y in aligned.landmarks],
        )
        theirs = dlib.get_face_chip(image, shape, size=DLIB_CHIP_SIZE[0], padding=0.25)
        assert aligned.crop.shape == theirs.shape == (*DLIB_CHIP_SIZE, 3)
        assert np.abs(aligned.crop.astype(float) - theirs).mean() < 4  # bilinear sampling differs slightly
        ours_descriptor = np.array(recognizer.compute_face_descriptor(aligned.crop))
        their_descriptor = np.array(recognizer.compute_face_descriptor(theirs))
        assert np.linalg.norm(ours_descriptor - their_descriptor) < 0.1  # dlib's same-person threshold: 0.6
        compared += 1
    assert compared >= PHOTOS - 1


@pytest.mark.shared_data
def test_cli_writes_150x150_chips(shared_data, tmp_path):
    pytest.importorskip("dlib", reason="dlib (dlib-bin) is not installed")
    source = shared_data / "lfw_raw"
    person = sorted(source.iterdir())[0]
    result = CliRunner().invoke(
        main,
        [
            "align",
            str(person),
            "-o",
            str(tmp_path / "chips"),
            "--template",
            "dlib",
            "--workers",
            "1",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    chips = sorted((tmp_path / "chips").glob("*.jpg"))
    assert chips and all(decode_image(chip).shape == (*DLIB_CHIP_SIZE, 3) for chip in chips)
