"""Re-id evaluation between two PID_CAM sets: the protocol by hand, the folders, the CLI's report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.retrieval import evaluate_reid, retrieval_metrics
from tests.support.eval_sets import ColourMean
from tests.support.reid_helpers import reid_config, write_cuhk03_style
from tests.support.train_helpers import run_cli


def test_hand_computed_cross_camera_protocol():
    """Two queries from camera 1. Gallery, ranked by similarity to either query (angles from [1, 0]):
    g0 pid 7 cam 1, g1 pid 8 cam 2, g2 pid 7 cam 2, g3 pid 9 cam 2, g4 pid 7 cam 2, g5 pid 8 cam 2.

    Query pid 7: g0 is the same person from the same camera, removed; left [8, 7, 9, 7, 8]: first hit at
    rank 2, AP = (1/2 + 2/4) / 2 = 0.5. Query pid 8: nothing removed ([7, 8, 7, 9, 7, 8]), hits at 2 and
    6, AP = (1/2 + 2/6) / 2 = 5/12. rank-1 0, rank-5 1, mAP (0.5 + 5/12) / 2.
    """
    angles = np.linspace(0, 1.0, 6)
    gallery = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    queries = np.tile([1.0, 0.0], (2, 1))
    metrics = retrieval_metrics(
        queries, np.array([7, 8]), np.array([1, 1]),
        gallery, np.array([7, 8, 7, 9, 7, 8]), np.array([1, 2, 2, 2, 2, 2]),
    )  # fmt: skip
    assert metrics.cmc == {1: 0.0, 5: 1.0, 10: 1.0}
    assert metrics.mean_ap == pytest.approx((0.5 + 5 / 12) / 2)
    assert metrics.cmc_curve == pytest.approx((0.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    # the same ranking without the camera removal would have matched query 7 at rank 1
    same_camera_kept = retrieval_metrics(
        queries, np.array([7, 8]), np.array([3, 3]),
        gallery, np.array([7, 8, 7, 9, 7, 8]), np.array([1, 2, 2, 2, 2, 2]),
    )  # fmt: skip
    assert same_camera_kept.cmc[1] == 0.5


def test_query_and_gallery_folders_cut_by_camera(tmp_path: Path):
    folder = write_cuhk03_style(tmp_path / "val", range(4), shots_per_camera=2, size=(32, 16))
    result = evaluate_reid(
        ColourMean(), f"{folder}@1", f"{folder}@2", EmbedSettings((32, 16), batch_size=8, progress=False)
    )
    assert result.metrics.num_queries == 8 and result.metrics.num_gallery == 8
    assert result.name == "reid_val_cam2"
    # the whole folder against itself: each image finds its own camera's shots removed, not itself
    whole = evaluate_reid(ColourMean(), folder, folder, EmbedSettings((32, 16), batch_size=8, progress=False))
    assert whole.metrics.num_queries == 16 and whole.metrics.num_gallery == 16 and whole.name == "reid_val"


def test_eval_cli_reid_writes_table_json_and_cmc_plot(tmp_path: Path):
    folder = write_cuhk03_style(tmp_path / "val", range(3), shots_per_camera=2, size=(32, 16))
    model = tmp_path / "run"
    config = reid_config(tmp_path, folder, steps=2, data={"images_per_identity": 2}, train={"batch_size": 6})
    trained = run_cli("train", "-c", str(config))
    assert trained.returncode == 0, trained.stderr
    out = tmp_path / "report"
    args = [
        "eval",
        str(model),
        "--reid",
        f"{folder}@1",
        f"{folder}@2",
        "--rerank",
        "--out",
        str(out),
        "--quiet",
    ]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert "rank-1" in result.stdout and "mAP" in result.stdout and "k-reciprocal" in result.stdout
    figures = json.loads((out / "reid_val_cam2.json").read_text())
    assert figures["rerank"] is True and figures["num_queries"] == 6 and 0 <= figures["rank1"] <= 1
    assert len(figures["cmc"]) == 6 and figures["cmc"][-1] == 1.0
    assert (out / "reid_val_cam2_cmc.png").read_bytes().startswith(b"\x89PNG")
    again = run_cli(*args)
    assert again.returncode != 0 and "--overwrite" in again.stderr
