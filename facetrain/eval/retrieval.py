"""Person re-identification retrieval: CMC and mAP under the standard Market-1501 protocol.

For each query the gallery is ranked by cosine similarity, then gallery images of the query's own
identity taken by the query's own camera are removed (finding them is trivial), junk images (pid -1)
are removed, and distractors (pid 0) stay in as wrong matches. Queries left with no true match are
not scored. AP is the mean of the precision at each true match, as in open-reid and torchreid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from facetrain.data.market1501 import load_market1501_split
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import compute_embeddings

JUNK_PID = -1
CMC_RANKS = (1, 5, 10)
QUERY_CHUNK = 256


@dataclass(frozen=True)
class RetrievalMetrics:
    cmc: dict[int, float]
    mean_ap: float
    num_queries: int
    num_unscored_queries: int
    num_gallery: int


REPORT_NAME = "market1501"  # names the report file


@dataclass(frozen=True)
class RetrievalResult:
    root: str
    metrics: RetrievalMetrics
    xnorm: float
    flip: bool

    @property
    def name(self) -> str:
        return REPORT_NAME

    def as_dict(self) -> dict[str, Any]:
        metrics = self.metrics
        return {
            "dataset": self.root,
            "num_queries": metrics.num_queries,
            "num_unscored_queries": metrics.num_unscored_queries,
            "num_gallery": metrics.num_gallery,
            "flip": self.flip,
            **{f"rank{rank}": rate for rank, rate in metrics.cmc.items()},
            "mAP": metrics.mean_ap,
            "xnorm": self.xnorm,
        }


def retrieval_metrics(
    query_features: np.ndarray,
    query_pids: np.ndarray,
    query_camids: np.ndarray,
    gallery_features: np.ndarray,
    gallery_pids: np.ndarray,
    gallery_camids: np.ndarray,
    ranks: tuple[int, ...] = CMC_RANKS,
) -> RetrievalMetrics:
    """CMC at `ranks` and mAP from L2-normalized features, ranking by cosine similarity."""
    query_pids, query_camids = np.asarray(query_pids), np.asarray(query_camids)
    gallery_pids, gallery_camids = np.asarray(gallery_pids), np.asarray(gallery_camids)
    gallery = torch.from_numpy(np.ascontiguousarray(gallery_features, dtype=np.float32))
    first_match_ranks, average_precisions = [], []
    for start in range(0, len(query_pids), QUERY_CHUNK):
        queries = torch.from_numpy(
            np.ascontiguousarray(query_features[start : start + QUERY_CHUNK], dtype=np.float32)
        )
        orders = torch.argsort(queries @ gallery.T, dim=1, descending=True, stable=True).numpy()
        for offset, order in enumerate(orders):
            pid, camid = query_pids[start + offset], query_camids[start + offset]
            ranked_pids = gallery_pids[order]
            kept = (ranked_pids != JUNK_PID) & ~((ranked_pids == pid) & (gallery_camids[order] == camid))
            hits = np.flatnonzero(ranked_pids[kept] == pid)
            if len(hits):
                first_match_ranks.append(hits[0])
                average_precisions.append(float(np.mean(np.arange(1, len(hits) + 1) / (hits + 1))))
    if not first_match_ranks:
        raise FacetrainError(
            "no query has a true match in the gallery from another camera; check the query and gallery sets"
        )
    first = np.array(first_match_ranks)
    return RetrievalMetrics(
        cmc={rank: float(np.mean(first < rank)) for rank in ranks},
        mean_ap=float(np.mean(average_precisions)),
        num_queries=len(first),
        num_unscored_queries=len(query_pids) - len(first),
        num_gallery=len(gallery_pids),
    )


def evaluate_market1501(
    module: nn.Module,
    root: str | Path,
    image_size: tuple[int, int],
    batch_size: int = 128,
    flip: bool = True,
    device: torch.device | str | None = None,
    progress: bool = True,
    num_workers: int = 0,
) -> RetrievalResult:
    """Embed Market-1501's `query` and `bounding_box_test` folders and score the retrieval."""
    query = load_market1501_split(root, "query")
    gallery = load_market1501_split(root, "gallery")
    embedded = {
        split: compute_embeddings(
            module,
            list(frame["path"]),
            image_size,
            batch_size,
            flip,
            device,
            progress,
            num_workers,
            label=split,
        )
        for split, frame in (("query", query), ("gallery", gallery))
    }
    metrics = retrieval_metrics(
        embedded["query"].vectors,
        query["pid"].to_numpy(),
        query["camid"].to_numpy(),
        embedded["gallery"].vectors,
        gallery["pid"].to_numpy(),
        gallery["camid"].to_numpy(),
    )
    return RetrievalResult(str(root), metrics, embedded["query"].xnorm, flip)
