"""The re-id recipe: batch-hard triplet loss and the BN neck's two outputs (the tiny run that learns is
the README's re-id quick start, tests/test_readme.py)."""

from __future__ import annotations

import pytest
import torch

from facetrain.errors import FacetrainError
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.losses import LossConfig, MarginTripletLoss, batch_hard_triplet_loss, build_loss
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config


def naive_batch_hard(features: torch.Tensor, labels: list[int], margin: float | None) -> float:
    losses = []
    for a in range(len(labels)):
        distance = [float(torch.dist(features[a], features[j])) for j in range(len(labels))]
        positives = [distance[j] for j in range(len(labels)) if labels[j] == labels[a] and j != a]
        negatives = [distance[j] for j in range(len(labels)) if labels[j] != labels[a]]
        if positives and negatives:
            gap = max(positives) - min(negatives)
            losses.append(
                float(torch.nn.functional.softplus(torch.tensor(gap)))
                if margin is None
                else max(0.0, gap + margin)
            )
    return sum(losses) / len(losses) if losses else 0.0


@pytest.mark.parametrize("margin", [0.3, 2.0, None])
def test_batch_hard_triplet_matches_a_loop(margin: float | None):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(12, 5, generator=generator)
    labels = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4]  # identity 4 has no positive: not an anchor
    got = batch_hard_triplet_loss(features, torch.tensor(labels), margin)
    assert float(got) == pytest.approx(naive_batch_hard(features, labels, margin), rel=1e-5)


def test_triplet_without_positives_is_zero_with_a_graph():
    features = torch.randn(4, 3, requires_grad=True)
    loss = batch_hard_triplet_loss(features, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(features.grad, torch.zeros(4, 3))


def test_bn_neck_gives_features_to_the_triplet_and_embeddings_to_the_head():
    backbone = build_backbone(ModelConfig(backbone="small_pooled", embedding_size=24), (32, 16))
    seen = {}

    def head(embeddings, labels):
        seen["embeddings"] = embeddings
        return embeddings.pow(2).mean(), torch.tensor(0.5)

    loss_fn = build_loss(LossConfig(name="margin_triplet", triplet_weight=2.0), head, backbone)
    assert isinstance(loss_fn, MarginTripletLoss)
    images, labels = torch.randn(8, 3, 32, 16), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    embeddings, features = backbone(images)
    loss, accuracy = loss_fn((embeddings, features), labels)
    assert seen["embeddings"] is embeddings
    assert torch.allclose(embeddings, backbone.output.neck(features))  # the neck sits between them
    expected = embeddings.pow(2).mean() + 2.0 * batch_hard_triplet_loss(features, labels)
    assert torch.allclose(loss, expected) and float(accuracy) == 0.5
    backbone.eval()  # evaluation and export see the embeddings alone
    assert backbone(images).shape == (8, 24)


def test_bn_neck_off_and_its_errors():
    plain = build_backbone(ModelConfig(backbone="small_pooled", embedding_size=24, bn_neck=False), (32, 16))
    assert isinstance(plain.output.neck, torch.nn.Identity)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in plain.output.modules())
    with pytest.raises(ValueError, match="bn_neck=False needs a backbone with a pooled output"):
        build_backbone(ModelConfig(backbone="small", embedding_size=24, bn_neck=False), (32, 32))
    face = build_backbone(ModelConfig(backbone="small", embedding_size=24), (32, 32))
    with pytest.raises(ValueError, match="margin_triplet loss needs a backbone with a pooled output"):
        build_loss(LossConfig(name="margin_triplet"), lambda e, y: (e.sum(), e.sum()), face)
    cfg = Config(model=ModelConfig(backbone="small", bn_neck=False))
    with pytest.raises(FacetrainError, match="model.bn_neck = False: needs a backbone with a pooled re-id"):
        validate(cfg)  # a user's config meets the one-line error before anything is built
