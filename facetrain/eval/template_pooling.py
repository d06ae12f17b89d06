"""Template features for set-to-set verification (IJB-B / IJB-C), pooled as insightface's
eval_ijbc.py pools them.

A template is a set of photos and video frames of one person. Face features (already weighted, e.g.
by the detector's score) are averaged within each media (the frames of one video, or one photo),
the media averages are summed over the template, and the sum is L2-normalized; a template whose sum is
zero stays zero, as sklearn's `normalize` leaves it. Two templates are compared by the dot product of
their features. Grouping sorts once and sums with `np.add.reduceat`, which takes seconds on IJB-C's
469,375 faces where a loop over templates takes minutes.
"""

from __future__ import annotations

import numpy as np

from facetrain.errors import FacetrainError

# pairs scored at once: IJB-C's 15.7 million pairs of 512-d features gathered at once would take 128 GB
PAIR_CHUNK = 100_000


def template_features(
    face_features: np.ndarray, templates: np.ndarray, medias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(template ids in increasing order, their L2-normalized features (T, D) float64)."""
    face_features = np.asarray(face_features, dtype=np.float64)
    templates, medias = np.asarray(templates), np.asarray(medias)
    if not (len(face_features) == len(templates) == len(medias)):
        raise ValueError(f"{len(face_features)} features, {len(templates)} templates, {len(medias)} medias")
    groups, group_of_face = np.unique(np.stack([templates, medias], axis=1), axis=0, return_inverse=True)
    group_of_face = group_of_face.reshape(-1)
    order = np.argsort(group_of_face, kind="stable")
    starts = _run_starts(group_of_face[order])
    counts = np.diff(np.r_[starts, len(order)])
    media_means = np.add.reduceat(face_features[order], starts, axis=0) / counts[:, None]
    template_starts = _run_starts(groups[:, 0])  # `np.unique` sorted the groups by template first
    sums = np.add.reduceat(media_means, template_starts, axis=0)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return groups[template_starts, 0], np.divide(sums, norms, out=np.zeros_like(sums), where=norms > 0)


def template_pair_scores(
    template_ids: np.ndarray, features: np.ndarray, pair_templates: np.ndarray
) -> np.ndarray:
    """The cosine similarity of each (template_1, template_2) row of `pair_templates`."""
    rows = np.searchsorted(template_ids, pair_templates)
    found = (rows < len(template_ids)) & (
        template_ids[np.minimum(rows, len(template_ids) - 1)] == pair_templates
    )
    if not found.all():
        missing = pair_templates[~found][0]
        raise FacetrainError(f"template {missing} of a verification pair has no face")
    scores = np.empty(len(rows), dtype=np.float64)
    for start in range(0, len(rows), PAIR_CHUNK):
        chunk = rows[start : start + PAIR_CHUNK]
        scores[start : start + PAIR_CHUNK] = np.einsum(
            "ij,ij->i", features[chunk[:, 0]], features[chunk[:, 1]]
        )
    return scores


def _run_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys begins in a sorted array."""
    return np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
