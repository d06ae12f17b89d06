"""Training losses by name (`loss.name`): what the step minimises, given the model's outputs.

`margin` is the sharded margin head alone, the face recipe. `margin_triplet` is re-id's "Bag of
Tricks" recipe: the same head as the identity loss on the BN-neck embeddings, plus a batch-hard
triplet loss on the features before the neck, both on the same PK batch, weighted by
`loss.identity_weight` and `loss.triplet_weight`.

With several data-parallel ranks the triplet loss is per rank: each rank's PK batch holds whole
identities (the identity sampler deals P identities x K images to every rank), so a rank finds its
positives and negatives in its own batch and needs no gather; DDP then averages the gradients, which
makes the objective the mean of the ranks' triplet losses. The identity loss sees the global batch
through the sharded head as always.

The triplet loss is batch-hard (Hermans et al., "In Defense of the Triplet Loss", 2017): each image of
a PK batch is an anchor paired with its farthest same-identity image and its nearest other-identity
image, so the loss works on the mistakes that matter without mining a triplet list. Distances are
Euclidean on the raw features (before the BN neck, as the "Bag of Tricks" baseline measures them), in
fp32 whatever the autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional

from facetrain.config.checks import NotEmpty, OneOf, Registered, above, at_least, setting
from facetrain.models import Backbone
from facetrain.registry import Registry

LossFn = Callable[[object, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
LOSSES: Registry[LossFn] = Registry("loss")


@dataclass
class LossConfig:
    """The `loss` section of a run's config, checked against the losses below.

    margin (the head alone) | margin_triplet (re-id: the head on the BN-neck embeddings plus a
    batch-hard triplet loss on the features before the neck; needs data.sampler identity and a pooled
    backbone). `teacher` adds knowledge distillation beside it (`facetrain.train.distillation`)."""

    name: str = setting("margin", Registered(LOSSES))
    identity_weight: float = setting(1.0, above(0))  # margin_triplet's weights
    triplet_weight: float = setting(1.0, at_least(0))
    triplet_margin: float | None = setting(0.3, above(0))  # null: soft margin, log(1 + exp(d_ap - d_an))
    teacher: str | None = setting(None, NotEmpty(), path=True)  # a model to distil from (load_model)
    teacher_loss: str = setting("cosine", OneOf(("cosine", "l2")))
    teacher_weight: float = setting(1.0, above(0))
    teacher_cache: bool = False  # keep each sample's teacher embedding (distillation.TeacherCache)


def batch_hard_triplet_loss(
    features: torch.Tensor, labels: torch.Tensor, margin: float | None = 0.3
) -> torch.Tensor:
    """Mean over anchors with a positive of `relu(d(a, hardest p) - d(a, hardest n) + margin)`;
    margin None is the soft margin `log(1 + exp(d_ap - d_an))`. Zero when no anchor has both."""
    features = features.float()
    squared = features.pow(2).sum(1)
    # the clamp keeps the square root's gradient finite where an image meets itself
    distances = (squared[:, None] + squared[None, :] - 2 * features @ features.T).clamp_min(1e-12).sqrt()
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


class MarginTripletLoss:
    """Identity loss (the margin head) on the embeddings plus batch-hard triplet on the features."""

    def __init__(self, head: LossFn, identity_weight: float, triplet_weight: float, margin: float | None):
        self.head = head
        self.identity_weight, self.triplet_weight, self.margin = identity_weight, triplet_weight, margin

    def __call__(
        self, outputs: tuple[torch.Tensor, torch.Tensor] | torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(outputs, torch.Tensor):  # a frozen backbone (optim.head_only_steps): the head alone
            return self.head(outputs, labels)
        embeddings, features = outputs
        identity, accuracy = self.head(embeddings, labels)
        triplet = batch_hard_triplet_loss(features, labels, self.margin)
        return self.identity_weight * identity + self.triplet_weight * triplet, accuracy


@LOSSES.register("margin")
def _margin(cfg: LossConfig, head: LossFn, backbone: Backbone) -> LossFn:
    return head


@LOSSES.register("margin_triplet")
def _margin_triplet(cfg: LossConfig, head: LossFn, backbone: Backbone) -> LossFn:
    if not backbone.set_metric_features(True):
        raise ValueError("the margin_triplet loss needs a backbone with a pooled output (its features)")
    return MarginTripletLoss(head, cfg.identity_weight, cfg.triplet_weight, cfg.triplet_margin)


def build_loss(cfg: LossConfig, head: LossFn, backbone: Backbone) -> LossFn:
    """The loss `cfg.name` around `head`; a metric loss switches `backbone` to return its features."""
    return LOSSES.build(cfg.name, cfg, head, backbone)
