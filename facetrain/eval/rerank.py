"""k-reciprocal re-ranking (Zhong et al., "Re-ranking Person Re-identification with k-reciprocal
Encoding", CVPR 2017), the re-ranking re-id papers report as "+RK".

Two images are likely the same person when each is among the other's k nearest neighbours. Each image
(query or gallery) is encoded as a sparse weight vector over its k1-reciprocal neighbours, expanded
with the reciprocal neighbours of those neighbours that mostly agree with it, then averaged over its k2
nearest neighbours (local query expansion). The final distance mixes the Jaccard distance of the
encodings with the original distance: `(1 - lambda) * jaccard + lambda * original`.

The steps and their constants follow the authors' reference code (squared Euclidean distances divided
by each row's largest, the 2/3 overlap rule, k1/2 for the neighbours' own sets), so figures compare
with published ones. The encodings are kept sparse; the dense (Q + G)^2 float32 distance matrix is the
largest thing held (about 2 GB for Market-1501's 23,000 images).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class RerankSettings:
    k1: int = 20
    k2: int = 6
    lambda_value: float = 0.3


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    distances = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    return np.maximum(distances, 0)


def nearest_neighbours(distances: np.ndarray, count: int) -> np.ndarray:
    """Each row's `count` nearest columns, nearest first (ties by column), without a full sort."""
    count = min(count, distances.shape[1])
    if count < distances.shape[1]:
        candidates = np.argpartition(distances, count - 1, axis=1)[:, :count]
    else:
        candidates = np.broadcast_to(np.arange(count), distances.shape).copy()
    rows = np.arange(len(distances))[:, None]
    order = np.lexsort((candidates, distances[rows, candidates]), axis=1)
    return candidates[rows, order]


def _reciprocal(neighbours: np.ndarray, k: int) -> list[np.ndarray]:
    """For each i, the j among its k nearest (itself included) that have i among their k nearest."""
    near = neighbours[:, : k + 1]
    return [row[np.any(near[row] == i, axis=1)] for i, row in enumerate(near)]


def k_reciprocal_distances(
    query: np.ndarray, gallery: np.ndarray, settings: RerankSettings = RerankSettings()
) -> np.ndarray:
    """The re-ranked (Q, G) query-to-gallery distances of feature rows `query` and `gallery`."""
    num_query = len(query)
    features = np.concatenate([query, gallery]).astype(np.float32)
    total = len(features)
    distances = squared_distances(features, features).astype(np.float32)
    distances /= np.maximum(distances.max(axis=1, keepdims=True), np.finfo(np.float32).tiny)
    half = int(np.around(settings.k1 / 2))
    neighbours = nearest_neighbours(distances, max(settings.k1, settings.k2) + 1)
    reciprocal = _reciprocal(neighbours, settings.k1)
    half_reciprocal = _reciprocal(neighbours, half)

    rows, columns, weights = [], [], []
    for i, own in enumerate(reciprocal):
        expansion = [own]
        for candidate in own:
            theirs = half_reciprocal[candidate]
            if len(np.intersect1d(theirs, own)) > 2 / 3 * len(theirs):
                expansion.append(theirs)
        members = np.unique(np.concatenate(expansion))
        weight = np.exp(-distances[i, members])
        rows.append(np.full(len(members), i))
        columns.append(members)
        weights.append(weight / weight.sum())
    encoding = sparse.csr_matrix(
        (np.concatenate(weights), (np.concatenate(rows), np.concatenate(columns))), shape=(total, total)
    )
    if settings.k2 != 1:
        nearest = neighbours[:, : settings.k2]
        averaging = sparse.csr_matrix(
            (
                np.full(nearest.size, 1 / settings.k2),
                (np.repeat(np.arange(total), settings.k2), nearest.ravel()),
            ),
            shape=(total, total),
        )
        encoding = (averaging @ encoding).tocsr()

    by_column = encoding.tocsc()
    jaccard = np.empty((num_query, total), dtype=np.float32)
    for i in range(num_query):
        row = encoding.getrow(i)
        shared = by_column[:, row.indices]
        owner = np.repeat(np.arange(len(row.indices)), np.diff(shared.indptr))
        shared.data = np.minimum(shared.data, row.data[owner])
        overlap = np.asarray(shared.sum(axis=1)).ravel()
        jaccard[i] = 1 - overlap / (2 - overlap)
    final = (1 - settings.lambda_value) * jaccard + settings.lambda_value * distances[:num_query]
    return final[:, num_query:]
