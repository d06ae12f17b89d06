"""Batch-hard triplet loss (Hermans et al., "In Defense of the Triplet Loss", 2017).

Each image of a PK batch is an anchor paired with its farthest same-identity image and its nearest
other-identity image, so the loss works on the mistakes that matter without mining a triplet list.
Distances are Euclidean on the raw features (before the BN neck, as the "Bag of Tricks" baseline
measures them), in fp32 whatever the autocast.
"""

from __future__ import annotations

import torch
from torch.nn import functional


def pairwise_distances(features: torch.Tensor) -> torch.Tensor:
    squared = features.pow(2).sum(1)
    distances = squared[:, None] + squared[None, :] - 2 * features @ features.T
    # the clamp keeps the square root's gradient finite where an image meets itself
    return distances.clamp_min(1e-12).sqrt()


def batch_hard_triplet_loss(
    features: torch.Tensor, labels: torch.Tensor, margin: float | None = 0.3
) -> torch.Tensor:
    """Mean over anchors with a positive of `relu(d(a, hardest p) - d(a, hardest n) + margin)`;
    margin None is the soft margin `log(1 + exp(d_ap - d_an))`. Zero when no anchor has both."""
    distances = pairwise_distances(features.float())
    same = labels[:, None] == labels[None, :]
    itself = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    positives, negatives = same & ~itself, ~same
    usable = positives.any(1) & negatives.any(1)
    if not usable.any():
        return distances.sum() * 0  # keeps the graph, so every rank's backward runs alike
    hardest_positive = distances.masked_fill(~positives, float("-inf")).amax(1)[usable]
    hardest_negative = distances.masked_fill(~negatives, float("inf")).amin(1)[usable]
    gap = hardest_positive - hardest_negative
    if margin is None:
        return functional.softplus(gap).mean()
    return functional.relu(gap + margin).mean()
