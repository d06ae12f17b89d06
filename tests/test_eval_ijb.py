"""IJB-B / IJB-C 1:1 verification as insightface's eval_ijbc.py runs it, on a small set written in the
release's exact layout: alignment by the five landmarks, flip-summed features, detector-score
weighting, media-then-template pooling, TAR at FAR by eval_ijbc.py's nearest-FPR rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from sklearn.metrics import roc_curve

from facetrain.align.five_points import FivePointCrop
from facetrain.align.template import reference_points
from facetrain.align.transform import similarity_transform
from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.eval.ijb_faces import AlignedFaces
from facetrain.eval.ijb_meta import read_ijb_meta
from facetrain.eval.ijb_roc import IJB_FALSE_ACCEPT_RATES, ijb_roc
from facetrain.eval.template_pooling import template_features, template_pair_scores
from facetrain.export.exporter import export_loaded
from facetrain.interop.card import build_card
from facetrain.interop.loading import LoadedModel, load_model
from facetrain.models import build_backbone
from facetrain.train.run_config import Config
from tests.support.ijb_set import write_ijb_set

SIZE = (112, 112)


@pytest.fixture(scope="module")
def ijb(tmp_path_factory: pytest.TempPathFactory):
    return write_ijb_set(tmp_path_factory.mktemp("ijb") / "IJBC")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = Config()
    config.model.backbone = "small"
    config.model.embedding_size = 16
    config.data.image_size = list(SIZE)
    module = build_backbone(config.model, image_size=SIZE).eval()
    card = build_card(module, config, {"step": 1}, SIZE, Path("fresh"))
    out = tmp_path_factory.mktemp("model")
    export_loaded(
        LoadedModel(module, SIZE, card, Path("fresh"), "checkpoint"), out, ["safetensors"], progress=False
    )
    return out


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["eval", *(str(arg) for arg in args)])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_template_pooling_by_hand():
    """Template 7: a photo (3, 4) and a video of two frames (1, 0), (3, 0) -> media means (3, 4) and
    (2, 0), summed (5, 4), normalized (5, 4) / sqrt(41). Template 3: one face (0, 2) -> (0, 1)."""
    features = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    templates = np.array([7, 7, 3, 7])
    medias = np.array([10, 11, 30, 11])
    ids, pooled = template_features(features, templates, medias)
    assert ids.tolist() == [3, 7]
    np.testing.assert_allclose(
        pooled, [[0.0, 1.0], [5 / math.sqrt(41), 4 / math.sqrt(41)]], rtol=0, atol=1e-15
    )
    scores = template_pair_scores(ids, pooled, np.array([[7, 3], [3, 3], [7, 7]]))
    np.testing.assert_allclose(scores, [4 / math.sqrt(41), 1.0, 1.0], rtol=0, atol=1e-15)
    with pytest.raises(FacetrainError, match="template 5 of a verification pair has no face"):
        template_pair_scores(ids, pooled, np.array([[7, 5]]))


def eval_ijbc_tar(labels: np.ndarray, scores: np.ndarray, far: float) -> float:
    """eval_ijbc.py's selection in its own steps: scikit-learn's ROC reversed, then the first point of
    least distance to the target FPR."""
    fpr, tpr, _ = roc_curve(labels, scores)
    fpr, tpr = np.flipud(fpr), np.flipud(tpr)
    _, index = min(zip(np.abs(fpr - far), range(len(fpr))))
    return float(tpr[index])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tar_at_far_is_eval_ijbc_rule_on_scikit_learn_roc(seed: int):
    rng = np.random.default_rng(seed)
    labels = rng.random(20000) < 0.1
    scores = np.round(rng.normal(labels * 1.5, 1.0), 2)  # rounded: many ties, collinear ROC runs
    roc = ijb_roc(labels, scores)
    fpr, tpr, _ = roc_curve(labels, scores)
    np.testing.assert_array_equal(roc.false_positive_rate, fpr)
    np.testing.assert_array_equal(roc.true_positive_rate, tpr)
    for far in IJB_FALSE_ACCEPT_RATES:
        assert roc.tar_at_far[far] == eval_ijbc_tar(labels, scores, far), far


def test_aligned_faces_give_the_rendered_faces_back(ijb):
    meta = read_ijb_meta(ijb.root, "IJBC")
    crops = AlignedFaces(meta.image_paths, meta.landmarks, FivePointCrop(SIZE))
    assert len(crops) == len(ijb.faces) and crops[0].shape == (112, 112, 3)
    shifted = AlignedFaces(meta.image_paths, meta.landmarks + np.float32([3, 0]), FivePointCrop(SIZE))
    inner = (slice(8, 104), slice(8, 104))  # the loose crop's replicated border changed the corners
    for index, face in enumerate(ijb.faces):
        error = np.abs(crops[index][inner].astype(float) - face[inner]).mean()
        misaligned = np.abs(shifted[index][inner].astype(float) - face[inner]).mean()
        assert error < 7.0 and error < 0.8 * misaligned, (index, error, misaligned)  # JPEG and two warps


def reference_scores(module: torch.nn.Module, root: Path) -> np.ndarray:
    """eval_ijbc.py's pipeline written out step by step: BGR photo warped onto the template, RGB, raw
    features of the crop and of its mirror summed, times the detector score; per template, frames of a
    media averaged and media summed, in a loop; normalized; dot products of the pairs."""
    meta = root / "meta"
    faces = [line.split() for line in (meta / "ijbc_face_tid_mid.txt").read_text().splitlines()]
    points = [line.split() for line in (meta / "ijbc_name_5pts_score.txt").read_text().splitlines()]
    pairs = [line.split() for line in (meta / "ijbc_template_pair_label.txt").read_text().splitlines()]
    features = []
    for fields in points:
        photo = cv2.imread(str(root / "loose_crop" / fields[0]))
        landmarks = np.array(fields[1:11], dtype=np.float32).reshape(5, 2)
        crop = cv2.warpAffine(
            photo, similarity_transform(landmarks, reference_points(SIZE)), (112, 112), borderValue=0.0
        )
        crop = cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)
        batch = torch.from_numpy(np.stack([crop, np.fliplr(crop)]).transpose(0, 3, 1, 2).copy()).float()
        with torch.no_grad():
            raw = module(batch.div(255).sub(0.5).div(0.5)).double().numpy()
        features.append((raw[0] + raw[1]) * float(fields[11]))
    features = np.array(features)
    templates = np.array([int(fields[1]) for fields in faces])
    medias = np.array([int(fields[2]) for fields in faces])
    pooled = {}
    for template in np.unique(templates):
        (in_template,) = np.where(templates == template)
        media_features = []
        for media in np.unique(medias[in_template]):
            media_features.append(features[in_template][medias[in_template] == media].mean(axis=0))
        summed = np.sum(media_features, axis=0)
        pooled[template] = summed / np.linalg.norm(summed)
    return np.array([pooled[int(a)] @ pooled[int(b)] for a, b, _ in pairs])


def test_facetrain_eval_ijb_reports_the_tar_table(ijb, model_dir: Path, tmp_path: Path):
    code, output = run(model_dir, "--ijb", ijb.root, "--ijb-target", "IJBC", "--out", tmp_path, "--quiet")
    assert code == 0, output
    report = json.loads((tmp_path / "ijbc.json").read_text())
    assert list(report["tar_at_far"]) == ["1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1"]
    matched = sum(
        1 for a in ijb.identities for b in ijb.identities if a < b and ijb.identities[a] == ijb.identities[b]
    )
    assert (
        report["num_pairs"] == 28 and report["num_matched"] == matched == 4 and report["num_templates"] == 8
    )
    assert report["num_images"] == len(ijb.faces) and report["flip"] is True
    lines = output.splitlines()
    header, row = lines[-3].split(), lines[-2].split()  # then "wrote ..."
    assert header == ["FAR", "1e-06", "1e-05", "1e-04", "1e-03", "1e-02", "1e-01"]
    assert row[:2] == ["TAR", "IJBC"] and [float(v) for v in row[2:]] == [
        round(100 * tar, 2) for tar in report["tar_at_far"].values()
    ]
    assert (tmp_path / "ijbc_roc.png").read_bytes().startswith(b"\x89PNG")
    scores = np.load(tmp_path / "ijbc_scores.npy")
    reference = reference_scores(load_model(model_dir).module, ijb.root)
    np.testing.assert_allclose(scores, reference, rtol=0, atol=2e-5)
    code, output = run(model_dir, "--ijb", ijb.root, "--out", tmp_path, "--quiet")
    assert (
        code == 2
        and output.strip()
        == f"error: {tmp_path / 'ijbc.json'} already exists; pass --overwrite to replace it"
    )


def broken_copy(ijb, tmp_path: Path, name: str, edit) -> Path:
    root = tmp_path / "IJBC"
    (root / "meta").mkdir(parents=True)
    (root / "loose_crop").symlink_to(ijb.root / "loose_crop")
    for path in (ijb.root / "meta").iterdir():
        text = path.read_text()
        (root / "meta" / path.name).write_text(edit(text) if path.name == name else text)
    return root


def first_line_edit(new_first: str):
    return lambda text: "\n".join([new_first, *text.splitlines()[1:]]) + "\n"


@pytest.mark.parametrize(
    "name, edit, message",
    [
        (
            "ijbc_name_5pts_score.txt",
            first_line_edit("2.jpg 1 2 3 4 5 6 7 8 9 10 0.9"),
            "ijbc_name_5pts_score.txt line 1 names '2.jpg' where ijbc_face_tid_mid.txt line 1 names '1.jpg'",
        ),
        (
            "ijbc_name_5pts_score.txt",
            first_line_edit("1.jpg 1 2 3 4 5 6 7 8 9 ten 0.9"),
            "ijbc_name_5pts_score.txt line 1: expected IMAGE X1 Y1 ... X5 Y5 SCORE (12 fields), got",
        ),
        (
            "ijbc_face_tid_mid.txt",
            first_line_edit("1.jpg 101"),
            "ijbc_face_tid_mid.txt line 1: expected IMAGE",
        ),
        ("ijbc_template_pair_label.txt", first_line_edit("100 999 0"), "line 1: template 999 has no face in"),
        (
            "ijbc_template_pair_label.txt",
            first_line_edit("100 101 2"),
            "line 1: LABEL must be 1 (same person) or 0",
        ),
        (
            "ijbc_face_tid_mid.txt",
            lambda text: text.replace("1.jpg", "gone.jpg", 1),
            "face images are missing",
        ),
    ],
)
def test_broken_protocol_files_are_one_line_errors_before_the_model_loads(ijb, tmp_path, name, edit, message):
    root = broken_copy(ijb, tmp_path, name, edit)
    if "missing" in message:
        (root / "meta" / "ijbc_name_5pts_score.txt").write_text(
            (root / "meta" / "ijbc_name_5pts_score.txt").read_text().replace("1.jpg", "gone.jpg", 1)
        )
    code, output = run(tmp_path / "no_model_needed_yet", "--ijb", root, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and message in output, output
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output


def test_a_missing_meta_file_names_the_target(ijb, tmp_path: Path):
    with pytest.raises(FacetrainError) as caught:
        read_ijb_meta(ijb.root, "IJBB")
    assert str(caught.value).startswith(f"{ijb.root / 'meta' / 'ijbb_face_tid_mid.txt'} does not exist;")
    assert "--ijb-target IJBB reads meta/ijbb_*.txt" in str(caught.value)


def test_ijbb_layout_is_read(tmp_path: Path):
    written = write_ijb_set(tmp_path / "IJBB", target="IJBB", identities=2, templates_per_identity=2)
    meta = read_ijb_meta(written.root, "IJBB")
    assert meta.pair_templates.shape == (6, 2) and meta.labels.sum() == 2
    assert meta.landmarks.shape == (len(written.faces), 5, 2) and (meta.detector_scores >= 0.5).all()
