"""Output layers that turn the last feature map into the embedding."""

from __future__ import annotations

import torch
from torch import nn

from facetrain.models.gem import GeneralizedMeanPooling

POOLINGS = ("avg", "gem")


def downsampled(size: int, times: int) -> int:
    """The side of a feature map after `times` stride-2 3x3 convolutions with padding 1."""
    for _ in range(times):
        size = (size + 1) // 2
    return size


class _WeightPrecision:
    """Runs the layer outside autocast on inputs cast to its weights' dtype.

    The embedding's last two layers decide its scale, which reduced precision would round; insightface
    keeps them in fp32 for the same reason.
    """

    weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.amp.is_autocast_available(x.device.type):  # the meta device of shape estimates
            return super().forward(x.to(self.weight.dtype))
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.to(self.weight.dtype))


class WeightPrecisionLinear(_WeightPrecision, nn.Linear):
    """`nn.Linear` that ignores autocast (same parameters and keys)."""


class WeightPrecisionBatchNorm1d(_WeightPrecision, nn.BatchNorm1d):
    """`nn.BatchNorm1d` that ignores autocast (same parameters, buffers and keys)."""


class FlattenedEmbedding(nn.Sequential):
    """IResNet's output layer: BN over the whole feature map, dropout, FC over it flattened, BN.

    Flattening (rather than pooling) keeps where on the face a feature fired, which aligned face
    crops make meaningful; the final BN keeps embedding scales even for the margin head. The FC and
    the final BN run in their weights' precision under autocast, as in IResNet.
    """

    def __init__(self, channels: int, spatial: tuple[int, int], embedding_size: int, dropout: float):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.dropout = nn.Dropout(dropout)
        self.flatten = nn.Flatten()
        self.fc = WeightPrecisionLinear(channels * spatial[0] * spatial[1], embedding_size)
        self.features = WeightPrecisionBatchNorm1d(embedding_size)


class PooledEmbedding(nn.Sequential):
    """The re-id output: global pooling (average, or generalised-mean with `pooling="gem"`), then a BN
    neck.

    Pedestrian crops are not aligned, so position is pooled away; the BN neck separates the space the
    metric losses shape from the one the classifier sees (Luo et al., "Bag of Tricks" for re-id): the
    triplet loss pulls and pushes the features before the neck, the identity loss and retrieval use
    them after it. With `metric_features` on, a training forward returns both, `(embeddings,
    features)`, for a loss that needs the features (`facetrain.train.losses`); evaluation and export
    always get the embeddings alone.
    """

    def __init__(self, channels: int, embedding_size: int, dropout: float, pooling: str = "avg"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.pool = GeneralizedMeanPooling() if pooling == "gem" else nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(dropout)
        self.reduce = (
            nn.Identity() if embedding_size == channels else nn.Linear(channels, embedding_size, bias=False)
        )
        self.neck = nn.BatchNorm1d(embedding_size)
        self.neck.bias.requires_grad_(False)
        self.metric_features = False

    def remove_neck(self) -> None:
        """Embed with the pooled features themselves (the BN-neck ablation)."""
        self.neck = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        features = self.reduce(self.dropout(self.flatten(self.pool(x))))
        embeddings = self.neck(features)
        if self.metric_features and self.training:
            return embeddings, features
        return embeddings
