"""Person re-identification retrieval: CMC and mAP under the standard Market-1501 protocol.

For each query the gallery is ranked by cosine similarity, then gallery images of the query's own
identity taken by the query's own camera are removed (finding them is trivial), junk images (pid -1)
are removed, and distractors (pid 0) stay in as wrong matches. Queries left with no true match are
not scored. AP is the mean of the precision at each true match, as in open-reid and torchreid.
With re-ranking the gallery is ranked by k-reciprocal distances instead (`facetrain.eval.rerank`),
and the same images are removed.

Two layouts are read: Market-1501's root (`evaluate_market1501`) and any two re-id image sets, a query
and a gallery, named `PID_CAM...` or listed in a CSV (`evaluate_reid`, see `data/reid_images.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from facetrain.data.market1501 import load_market1501_split
from facetrain.data.reid_images import load_reid_selection
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.eval.norm_summary import NormSummary, summarize_norms
from facetrain.eval.rerank import RerankSettings, k_reciprocal_distances

JUNK_PID = -1
CMC_RANKS = (1, 5, 10)
CMC_CURVE_RANKS = 50  # how far the CMC plot goes
QUERY_CHUNK = 256


@dataclass(frozen=True)
class RetrievalMetrics:
    cmc: dict[int, float]
    mean_ap: float
    num_queries: int
    num_unscored_queries: int
    num_gallery: int
    # the share of queries matched within rank 1, 2, ..., up to CMC_CURVE_RANKS (or the gallery's size)
    cmc_curve: tuple[float, ...] = ()
    reranked: bool = False


REPORT_NAME = "market1501"  # names the report file of evaluate_market1501


@dataclass(frozen=True)
class RetrievalResult:
    root: str
    metrics: RetrievalMetrics
    xnorm: float
    flip: bool
    name: str = REPORT_NAME
    # the query's and the gallery's embedding norms before normalisation (`eval.norm_summary`)
    norms: dict[str, NormSummary] | None = None

    def as_dict(self) -> dict[str, Any]:
        metrics = self.metrics
        return {
            "dataset": self.root,
            "num_queries": metrics.num_queries,
            "num_unscored_queries": metrics.num_unscored_queries,
            "num_gallery": metrics.num_gallery,
            "flip": self.flip,
            "rerank": metrics.reranked,
            **{f"rank{rank}": rate for rank, rate in metrics.cmc.items()},
            "mAP": metrics.mean_ap,
            "xnorm": self.xnorm,
            "cmc": list(metrics.cmc_curve),
            **({} if self.norms is None else {"norms": {k: v.as_dict() for k, v in self.norms.items()}}),
        }


def retrieval_metrics(
    query_features: np.ndarray,
    query_pids: np.ndarray,
    query_camids: np.ndarray,
    gallery_features: np.ndarray,
    gallery_pids: np.ndarray,
    gallery_camids: np.ndarray,
    ranks: tuple[int, ...] = CMC_RANKS,
    rerank: RerankSettings | None = None,
) -> RetrievalMetrics:
    """CMC at `ranks` and mAP from L2-normalized features, ranking by cosine similarity (or, with
    `rerank`, by k-reciprocal distance)."""
    query_pids, query_camids = np.asarray(query_pids), np.asarray(query_camids)
    gallery_pids, gallery_camids = np.asarray(gallery_pids), np.asarray(gallery_camids)
    first_match_ranks, average_precisions = [], []
    for start, orders in _gallery_orders(query_features, gallery_features, rerank):
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
    curve_ranks = np.arange(1, min(CMC_CURVE_RANKS, len(gallery_pids)) + 1)
    return RetrievalMetrics(
        cmc={rank: float(np.mean(first < rank)) for rank in ranks},
        mean_ap=float(np.mean(average_precisions)),
        num_queries=len(first),
        num_unscored_queries=len(query_pids) - len(first),
        num_gallery=len(gallery_pids),
        cmc_curve=tuple(float(np.mean(first < rank)) for rank in curve_ranks),
        reranked=rerank is not None,
    )


def _gallery_orders(query_features: np.ndarray, gallery_features: np.ndarray, rerank: RerankSettings | None):
    """(first query, gallery indices best first for each query) in chunks of queries."""
    if rerank is not None:
        distances = k_reciprocal_distances(query_features, gallery_features, rerank)
        yield 0, np.argsort(distances, axis=1, kind="stable")
        return
    gallery = torch.from_numpy(np.ascontiguousarray(gallery_features, dtype=np.float32))
    for start in range(0, len(query_features), QUERY_CHUNK):
        queries = torch.from_numpy(
            np.ascontiguousarray(query_features[start : start + QUERY_CHUNK], dtype=np.float32)
        )
        yield start, torch.argsort(queries @ gallery.T, dim=1, descending=True, stable=True).numpy()


def evaluate_market1501(
    module: nn.Module, root: str | Path, settings: EmbedSettings, rerank: RerankSettings | None = None
) -> RetrievalResult:
    """Embed Market-1501's `query` and `bounding_box_test` folders and score the retrieval."""
    query = load_market1501_split(root, "query")
    gallery = load_market1501_split(root, "gallery")
    return _score(module, query, gallery, settings, rerank, str(root), REPORT_NAME)


def evaluate_reid(
    module: nn.Module,
    query_images: str | Path,
    gallery_images: str | Path,
    settings: EmbedSettings,
    rerank: RerankSettings | None = None,
) -> RetrievalResult:
    """Score retrieval from a query set to a gallery set, each a PID_CAM folder or a CSV, optionally
    cut to some cameras (`val@1`, see `data/reid_images.py`).

    The report is named after the gallery (`reid_<gallery folder>[_cam<cameras>]`), so evaluations on
    several sets can share a report folder.
    """
    query, gallery = load_reid_selection(query_images), load_reid_selection(gallery_images)
    where = f"{query_images} -> {gallery_images}"
    return _score(module, query, gallery, settings, rerank, where, reid_report_name(gallery_images))


def reid_report_name(gallery_images: str | Path) -> str:
    path, _, cameras = str(gallery_images).rpartition("@")
    if not path or Path(gallery_images).exists() or not cameras.replace(",", "").isdigit():
        return f"reid_{Path(gallery_images).resolve().stem}"
    return f"reid_{Path(path).resolve().stem}_cam{cameras.replace(',', '-')}"


def _score(module, query, gallery, settings: EmbedSettings, rerank, where: str, name: str) -> RetrievalResult:
    embedded = {
        split: compute_embeddings(module, list(frame["path"]), settings, label=split)
        for split, frame in (("query", query), ("gallery", gallery))
    }
    metrics = retrieval_metrics(
        embedded["query"].vectors,
        query["pid"].to_numpy(),
        query["camid"].to_numpy(),
        embedded["gallery"].vectors,
        gallery["pid"].to_numpy(),
        gallery["camid"].to_numpy(),
        rerank=rerank,
    )
    norms = {split: summarize_norms(result.norms) for split, result in embedded.items()}
    return RetrievalResult(where, metrics, embedded["query"].xnorm, settings.flip, name, norms)
