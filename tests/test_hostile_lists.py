"""Hostile protocol and list files (#38, medium): IJB image names leading outside loose_crop/ and
landmarks that break the alignment are one line naming the file and line, before any image is read."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from facetrain.errors import FacetrainError
from facetrain.eval.csv_pairs import load_csv_pairs
from facetrain.eval.ijb_meta import read_ijb_meta
from facetrain.eval.lfw_pairs import load_lfw_pairs
from facetrain.eval.set_names import report_file_name

POINTS = "38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2"


def ijb_folder(root: Path, names: list[str], points: list[str]) -> Path:
    """IJB-C meta files for one face per template, templates 1 and 2, one matched and one mismatched pair."""
    meta = root / "meta"
    meta.mkdir(parents=True)
    (root / "loose_crop").mkdir()
    faces = [f"{name} {index % 2 + 1} {index}" for index, name in enumerate(names)]
    (meta / "ijbc_face_tid_mid.txt").write_text("\n".join(faces) + "\n")
    lines = [f"{name} {point} 0.9" for name, point in zip(names, points, strict=True)]
    (meta / "ijbc_name_5pts_score.txt").write_text("\n".join(lines) + "\n")
    (meta / "ijbc_template_pair_label.txt").write_text("1 1 1\n1 2 0\n")
    return root


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a/../../secret.jpg"])
def test_an_ijb_image_outside_loose_crop_is_refused(tmp_path: Path, name: str) -> None:
    """Before, the name was joined to loose_crop/ and opened wherever it led."""
    root = ijb_folder(tmp_path / "IJBC", ["1.jpg", name], [POINTS, POINTS])
    with pytest.raises(FacetrainError) as error:
        read_ijb_meta(root)
    assert str(error.value) == (
        f"{root / 'meta' / 'ijbc_face_tid_mid.txt'} line 2: IMAGE {name!r} leads outside loose_crop/; images "
        "are named relative to it, without '..'"
    )


@pytest.mark.parametrize(
    "points, problem",
    [
        (
            POINTS.replace("38.3", "1e309"),
            "a landmark is inf, not a pixel position in a photo (within +-100000)",
        ),
        (
            POINTS.replace("73.5", "-3e7"),
            "a landmark is -3e+07, not a pixel position in a photo (within +-100000)",
        ),
        (" ".join(["5"] * 10), "the five landmarks are one point, which defines no alignment"),
    ],
    ids=["1e309", "far away", "all equal"],
)
def test_landmarks_that_define_no_alignment_are_refused(tmp_path: Path, points: str, problem: str) -> None:
    """Before: a LinAlgError traceback from the alignment fit, or a RuntimeWarning and a bad crop."""
    root = ijb_folder(tmp_path / "IJBC", ["1.jpg", "2.jpg"], [POINTS, points])
    with pytest.raises(FacetrainError) as error:
        read_ijb_meta(root)
    assert str(error.value) == f"{root / 'meta' / 'ijbc_name_5pts_score.txt'} line 2: {problem}"


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "0\n",
            "line 1: the header must be N (pairs of each kind) or FOLDS N, each a number from 1 to 9999999, got '0'",
        ),
        (
            "5 0\n",
            "line 1: the header must be N (pairs of each kind) or FOLDS N, each a number from 1 to 9999999, got '5 0'",
        ),
        ("Abel 1 \u00b2\n", "line 1: image numbers must be positive integers, got '1' and '\u00b2'"),
        (
            "Abel 1 99999999999999999999\n",
            "line 1: image numbers must be positive integers, got '1' and '99999999999999999999'",
        ),
    ],
    ids=["header 0", "header 5 0", "superscript digit", "endless index"],
)
def test_lfw_pairs_numbers_out_of_range_are_one_line(tmp_path: Path, text: str, problem: str) -> None:
    """Before: IndexError (a header promising no pairs), ValueError (int('²') after isdigit())."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(text, encoding="utf-8")
    with pytest.raises(FacetrainError) as error:
        load_lfw_pairs(pairs, None, True)
    assert str(error.value) == f"{pairs} {problem}"


@pytest.mark.parametrize("fold", ["99999999999999999999", "\u00b9", "-1", "1_0"])
def test_a_csv_fold_that_is_no_small_integer_is_one_line(tmp_path: Path, fold: str) -> None:
    """Before: an OverflowError traceback for the 20-digit fold, and int() took '1_0' as 10."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"a.png,b.png,1,0\na.png,c.png,0,{fold}\n", encoding="utf-8")
    with pytest.raises(FacetrainError) as error:
        load_csv_pairs(pairs, None, True)
    assert str(error.value) == f"{pairs} line 2: 'fold' must be an integer from 0 to 1000000, got {fold!r}"


@pytest.mark.filterwarnings("error::UserWarning")
def test_a_set_of_one_matched_and_one_mismatched_pair_plots_without_warnings(tmp_path: Path) -> None:
    """Low item: the ROC's FAR axis ran from 1/1 to 1, and matplotlib warned of a singular range."""
    from click.testing import CliRunner

    from facetrain.checkpoint.names import BACKBONE
    from facetrain.cli import main
    from facetrain.interop.insightface_import import write_imported_checkpoint
    from tests.support.small_models import EMBEDDING_SIZE, fresh_backbone, small_config

    config = small_config()
    entries = {BACKBONE + key: value for key, value in fresh_backbone(config).state_dict().items()}
    write_imported_checkpoint(entries, {"embedding_size": EMBEDDING_SIZE}, config, [], tmp_path / "model")
    for name in ("a", "b", "c"):
        cv2.imwrite(
            str(tmp_path / f"{name}.png"),
            np.random.default_rng(ord(name)).integers(0, 256, (32, 32, 3), dtype=np.uint8),
        )
    (tmp_path / "pairs.csv").write_text("a.png,b.png,1\na.png,c.png,0\n")
    args = [
        "eval",
        tmp_path / "model",
        "--pairs",
        tmp_path / "pairs.csv",
        "-o",
        tmp_path / "report",
        "--device",
        "cpu",
        "-q",
    ]
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report" / f"{report_file_name(tmp_path / 'pairs.csv')}_roc.png").is_file()
