"""Re-id retrieval under the Market-1501 protocol: hand cases, scikit-learn's AP, and a tiny dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.report import retrieval_table
from facetrain.eval.retrieval import evaluate_market1501, retrieval_metrics
from tests.support.eval_sets import ColourMean, write_market


def fan(count: int) -> np.ndarray:
    """Unit vectors ever further from [1, 0], so a [1, 0] query ranks them in order."""
    angles = np.linspace(0, 1.2, count)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


def test_hand_computed_market_protocol():
    gallery_pids = np.array([1, 0, 1, -1, 2, 1])
    gallery_camids = np.array([1, 2, 2, 3, 2, 3])
    queries = np.tile([1.0, 0.0], (3, 1))
    metrics = retrieval_metrics(
        queries, np.array([1, 2, 3]), np.array([1, 1, 1]), fan(6), gallery_pids, gallery_camids
    )
    # query 1 keeps [distractor, hit, wrong, hit] (same-camera match and junk removed): AP (1/2 + 2/4) / 2
    # query 2 keeps [wrong, wrong, wrong, hit, wrong]: AP 1/4; query 3 has no true match and is not scored
    assert metrics.cmc == {1: 0.0, 5: 1.0, 10: 1.0}
    assert metrics.mean_ap == pytest.approx((0.5 + 0.25) / 2)
    assert (metrics.num_queries, metrics.num_unscored_queries, metrics.num_gallery) == (2, 1, 6)


def test_matches_sklearn_average_precision_on_random_data():
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(300, 16))
    gallery /= np.linalg.norm(gallery, axis=1, keepdims=True)
    gallery_pids = rng.integers(-1, 12, 300)
    gallery_camids = rng.integers(1, 4, 300)
    query_pids = rng.integers(1, 12, 40)
    query_camids = rng.integers(1, 4, 40)
    queries = gallery[rng.integers(0, 300, 40)] + rng.normal(scale=0.5, size=(40, 16))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    precisions, first_ranks = [], []
    for query, pid, camid in zip(queries, query_pids, query_camids):
        kept = (gallery_pids != -1) & ~((gallery_pids == pid) & (gallery_camids == camid))
        similarities, relevant = gallery[kept] @ query, gallery_pids[kept] == pid
        if relevant.any():
            precisions.append(average_precision_score(relevant, similarities))
            first_ranks.append(int(np.sum(similarities > similarities[relevant].max())))
    metrics = retrieval_metrics(
        queries, query_pids, query_camids, gallery, gallery_pids, gallery_camids, ranks=(1, 5)
    )
    assert metrics.mean_ap == pytest.approx(np.mean(precisions), abs=1e-6)
    assert metrics.cmc[1] == pytest.approx(np.mean(np.array(first_ranks) < 1))
    assert metrics.cmc[5] == pytest.approx(np.mean(np.array(first_ranks) < 5))
    assert metrics.num_queries == len(precisions)


def test_no_scorable_query_is_a_user_error():
    with pytest.raises(FacetrainError, match="no query has a true match"):
        retrieval_metrics(fan(1), np.array([1]), np.array([1]), fan(2), np.array([1, 2]), np.array([1, 1]))


def test_evaluate_market1501_folders(tmp_path: Path):
    write_market(tmp_path)
    torch.set_num_threads(1)
    result = evaluate_market1501(
        ColourMean(), tmp_path, EmbedSettings((32, 16), batch_size=4, progress=False)
    )
    assert result.metrics.cmc[1] == 1.0 and result.metrics.mean_ap == 1.0
    assert result.metrics.num_queries == 3 and result.metrics.num_gallery == 7
    figures = result.as_dict()
    assert figures["rank1"] == 1.0 and figures["mAP"] == 1.0 and figures["xnorm"] > 0
    # the norms before normalisation of each side: the query's mean is the XNorm
    assert {split: figures["norms"][split]["images"] for split in figures["norms"]} == {
        "query": 3,
        "gallery": 7,
    }
    query = figures["norms"]["query"]
    assert query["min"] <= figures["xnorm"] <= query["max"] and query["normalized_inside"] is False
    assert "norms (gallery)" in retrieval_table(result)
