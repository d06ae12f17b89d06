"""Evaluation reports: the printed tables and the JSON, per-fold CSV and ROC PNG files."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.folds import FOLDS_STRATIFIED
from facetrain.eval.metrics import verification_metrics
from facetrain.eval.norm_summary import PairNorms, summarize_norms
from facetrain.eval.report import (
    norms_figure,
    retrieval_table,
    roc_figure,
    verification_table,
    write_retrieval_report,
    write_verification_report,
)
from facetrain.eval.retrieval import RetrievalMetrics, RetrievalResult
from facetrain.eval.verify_pairs import VerificationResult


@pytest.fixture
def verification_result() -> VerificationResult:
    rng = np.random.default_rng(0)
    issame = rng.random(2000) < 0.5
    scores = np.where(issame, rng.normal(0.6, 0.2, 2000), rng.normal(0.1, 0.2, 2000))
    metrics = verification_metrics(scores, issame)
    return VerificationResult(
        "data/lfw/pairs.txt", metrics, 21.5, True, 3, ["a/x.jpg", "b/y.jpg"], FOLDS_STRATIFIED
    )


def test_roc_draws_the_tar_points_over_a_hollow_threshold_marker(verification_result: VerificationResult):
    """A threshold chosen at FAR 1e-2 sits on the TAR@1e-2 point: both must stay visible."""
    roc_axes = roc_figure(verification_result).axes[0]
    assert roc_axes.get_title() == "ROC" and roc_axes.get_legend() is not None
    lines = {line.get_label(): line for line in roc_axes.get_lines()}
    threshold = next(line for label, line in lines.items() if label.startswith("threshold"))
    tar_points = [line for label, line in lines.items() if label.startswith("TAR")]
    assert threshold.get_markerfacecolor() == "none" and tar_points
    assert all(line.get_zorder() > threshold.get_zorder() for line in tar_points)


def test_the_score_histogram_shows_both_kinds_of_pair_and_the_threshold(
    verification_result: VerificationResult,
):
    metrics = verification_result.metrics
    figure = roc_figure(verification_result, "runs/orl/checkpoints/step_150", 150)
    assert figure.get_suptitle() == (
        f"lfw/pairs.txt: accuracy {100 * metrics.accuracy_mean:.2f} ± {100 * metrics.accuracy_std:.2f} %, "
        "model runs/orl/checkpoints/step_150, step 150"
    )
    histogram_axes = figure.axes[1]
    genuine, impostor = histogram_axes.patches
    num_matched = metrics.num_matched
    assert genuine.get_label() == f"genuine ({num_matched} pairs)"
    assert impostor.get_label() == f"impostor ({2000 - num_matched} pairs)"
    # each a density over the same bins: the genuine hump to the right of the impostor one
    genuine_x, impostor_x = (patch.get_path().vertices[:, 0] for patch in (genuine, impostor))
    genuine_y, impostor_y = (patch.get_path().vertices[:, 1] for patch in (genuine, impostor))
    assert genuine_x[np.argmax(genuine_y)] > impostor_x[np.argmax(impostor_y)]
    (threshold,) = histogram_axes.get_lines()
    assert list(threshold.get_xdata()) == [metrics.operating_point.threshold] * 2
    assert threshold.get_label().startswith("threshold")
    assert histogram_axes.get_title() and histogram_axes.get_legend() is not None
    assert roc_figure(verification_result).get_suptitle().endswith(" %")  # nothing to name


def test_verification_files(verification_result: VerificationResult, tmp_path: Path):
    written = write_verification_report(verification_result, tmp_path / "eval", extra={"model": "runs/m"})
    assert [path.name for path in written] == ["pairs.json", "pairs_folds.csv", "pairs_roc.png"]
    figures = json.loads(written[0].read_text())
    metrics = verification_result.metrics
    assert figures["model"] == "runs/m"
    assert figures["accuracy"] == metrics.accuracy_mean and figures["accuracy_std"] == metrics.accuracy_std
    assert figures["auc"] == metrics.auc and figures["eer"] == metrics.eer
    assert figures["tar_at_far"] == {"0.1": metrics.tar_at_far[0.1], "0.01": metrics.tar_at_far[0.01]}
    assert figures["skipped_pairs"] == 3 and figures["missing_images"] == 2 and figures["xnorm"] == 21.5
    point = metrics.operating_point
    assert figures["threshold"] == point.threshold and figures["threshold_far"] == point.false_accept_rate
    assert (
        figures["threshold_tar"] == point.true_accept_rate and figures["threshold_accuracy"] == point.accuracy
    )
    assert figures["baseline_accuracy"] == metrics.baseline_accuracy
    assert figures["num_mismatched"] == 2000 - metrics.num_matched
    assert figures["folds_source"] == "stratified" and figures["threshold_rule"].startswith("balanced")
    with written[1].open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["fold"]) for row in rows] == list(range(10))
    assert sum(int(row["pairs"]) for row in rows) == 2000
    np.testing.assert_allclose(
        [float(row["accuracy"]) for row in rows], [fold.accuracy for fold in metrics.folds], atol=1e-6
    )
    assert written[2].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(path.name for path in (tmp_path / "eval").iterdir()) == sorted(
        path.name for path in written
    )


def test_running_again_replaces_the_same_files(verification_result: VerificationResult, tmp_path: Path):
    write_verification_report(verification_result, tmp_path)
    (tmp_path / "pairs.json").write_text("stale")
    write_verification_report(verification_result, tmp_path)
    assert json.loads((tmp_path / "pairs.json").read_text())["num_pairs"] == 2000
    assert len(list(tmp_path.iterdir())) == 3


def test_verification_table(verification_result: VerificationResult):
    table = verification_table(verification_result)
    metrics = verification_result.metrics
    assert (
        f"{100 * metrics.accuracy_mean:.2f}% ± {100 * metrics.accuracy_std:.2f}% over 10 folds (stratified)"
        in table
    )
    point = metrics.operating_point
    assert f"{point.threshold:.4f} (balanced): FAR {100 * point.false_accept_rate:.2f}%" in table
    majority = "different" if 2 * metrics.num_matched <= metrics.num_pairs else "same"
    assert f'{100 * metrics.baseline_accuracy:.2f}% by answering "{majority}" every time' in table
    assert "TAR @ FAR=0.01" in table and "TAR @ FAR=0.001" not in table
    assert "missing images  2, e.g. a/x.jpg" in table
    assert "2000 (" in table and "3 skipped" in table


def test_retrieval_table_and_json(tmp_path: Path):
    metrics = RetrievalMetrics({1: 0.9, 5: 0.95, 10: 0.97}, 0.75, 3368, 0, 19732)
    result = RetrievalResult("data/Market-1501", metrics, 18.0, False)
    table = retrieval_table(result)
    assert "rank-1" in table and "90.00%" in table and "mAP" in table and "75.00%" in table
    path, plot = write_retrieval_report(result, tmp_path)
    figures = json.loads(path.read_text())
    assert path.name == "market1501.json" and plot.name == "market1501_cmc.png"
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert figures["rank1"] == 0.9 and figures["rank10"] == 0.97 and figures["mAP"] == 0.75
    assert figures["num_gallery"] == 19732 and figures["flip"] is False


def _with_norms(result: VerificationResult, norms: np.ndarray) -> VerificationResult:
    """`result` with the norms of `len(norms)` images: its matched pairs between images of the upper
    half of `norms`, its mismatched ones of the lower half."""
    rng = np.random.default_rng(1)
    count = result.metrics.num_pairs
    issame = np.arange(count) < result.metrics.num_matched
    half = len(norms) // 2
    left = np.where(issame, rng.integers(half, len(norms), count), rng.integers(0, half, count))
    right = np.where(issame, rng.integers(half, len(norms), count), rng.integers(0, half, count))
    return dataclasses.replace(result, norms=PairNorms.of_pairs(norms, left, right, issame))


def test_the_norms_quantiles_join_the_json_and_the_table(verification_result: VerificationResult, tmp_path):
    norms = np.random.default_rng(2).uniform(5.0, 25.0, 400)
    result = _with_norms(verification_result, norms)
    written = write_verification_report(result, tmp_path, extra={"model": "runs/m", "step": 7})
    assert [path.name for path in written] == [
        "pairs.json",
        "pairs_folds.csv",
        "pairs_roc.png",
        "pairs_norms.png",
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(path.name for path in written)
    figures = json.loads(written[0].read_text())
    expected = np.quantile(norms, [0, 0.05, 0.5, 0.95, 1])
    assert figures["norms"] == {
        "images": 400,
        **dict(zip(["min", "p5", "median", "p95", "max"], expected.tolist())),
        "normalized_inside": False,
    }
    assert figures["norms"]["min"] == norms.min() and figures["norms"]["max"] == norms.max()
    row = next(line for line in verification_table(result).splitlines() if line.startswith("norms"))
    assert row.split(None, 1)[1] == (
        f"min {expected[0]:.2f}, p5 {expected[1]:.2f}, median {expected[2]:.2f}, p95 {expected[3]:.2f}, "
        f"max {expected[4]:.2f}"
    )
    assert written[3].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_norms_histogram_shows_each_kind_of_pair_by_its_lower_norm(
    verification_result: VerificationResult,
):
    norms = np.linspace(5.0, 25.0, 400)
    result = _with_norms(verification_result, norms)
    figure = norms_figure(result.norms, result.name, "runs/m", 7)
    assert figure.get_suptitle() == "pairs, model runs/m, step 7"
    axes = figure.axes[0]
    matched, mismatched = axes.patches
    num_matched = result.metrics.num_matched
    assert matched.get_label() == f"matched ({num_matched} pairs)"
    assert mismatched.get_label() == f"mismatched ({2000 - num_matched} pairs)"
    # matched pairs join images of the upper half: their lower norm is at least the median image's
    assert matched.get_path().vertices[:, 0].min() >= result.norms.lower[~result.norms.issame].min()
    assert result.norms.lower[result.norms.issame].min() >= norms[200]
    assert result.norms.lower[~result.norms.issame].max() <= norms[199]
    (fifth,) = axes.get_lines()
    assert fifth.get_xdata()[0] == pytest.approx(np.quantile(norms, 0.05))
    assert axes.get_title() == "embedding norms before normalisation"


def test_a_model_normalising_inside_says_so(verification_result: VerificationResult, tmp_path):
    """Every norm 1 (within fp16 rounding): no quantiles worth a row, the table and the plot say why."""
    norms = 1 + np.random.default_rng(3).uniform(-5e-4, 5e-4, 400)
    result = _with_norms(verification_result, norms)
    summary = summarize_norms(norms)
    assert summary.unit and summary.as_dict()["normalized_inside"] is True
    row = next(line for line in verification_table(result).splitlines() if line.startswith("norms"))
    assert row.split(None, 1)[1] == "1 for every image: the model normalises its embedding inside"
    assert norms_figure(result.norms, result.name).axes[0].get_title().startswith("normalised inside")
    assert not summarize_norms(np.array([1.0, 1.0, 1.01])).unit
    with pytest.raises(ValueError):
        summarize_norms(np.zeros(0))


def test_verify_measures_the_norms_of_every_image_of_the_pairs(tmp_path):
    """`verify` keeps each image's raw norm (of the image, not its flip sum) and each pair's lower one;
    a backbone ending in an L2 normalisation is reported as normalising inside."""
    from torch import nn

    from facetrain.eval.pair_set import PairSet
    from facetrain.eval.verify_pairs import verify

    rng = np.random.default_rng(4)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(6)]
    left, right = np.array([0, 1, 2, 3]), np.array([1, 2, 4, 5])
    issame = np.array([True, False, True, False])
    pairs = PairSet("x.txt", images, left, right, issame, folds=np.array([0, 0, 1, 1]))
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 8))
    result = verify(pairs, backbone, EmbedSettings((16, 16), progress=False))
    with torch.no_grad():
        from facetrain.data.transforms import build_eval_transform

        transform = build_eval_transform((16, 16))
        expected = backbone(torch.stack([transform(image) for image in images])).norm(dim=1).numpy()
    np.testing.assert_allclose(result.norms.images, expected, rtol=1e-5)
    np.testing.assert_allclose(result.norms.lower, np.minimum(expected[left], expected[right]), rtol=1e-5)
    assert result.as_dict()["norms"]["normalized_inside"] is False

    class Unit(nn.Module):
        def forward(self, x):
            return nn.functional.normalize(backbone(x), dim=1)

    assert (
        verify(pairs, Unit(), EmbedSettings((16, 16), progress=False)).as_dict()["norms"]["normalized_inside"]
        is True
    )
