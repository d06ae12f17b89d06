"""The `model` section of a run's config: which backbone, its embedding, and how it runs; the backbone
is checked against the backbones this package registers."""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.config.bounds import FRACTION
from facetrain.config.checks import NotEmpty, Registered, Within, setting
from facetrain.models.registry import BACKBONES


@dataclass
class ModelConfig:
    backbone: str = setting("r50", Registered(BACKBONES))
    embedding_size: int = setting(512, Within(1, 2**16))
    dropout: float = setting(0.0, FRACTION)
    # re-id backbones with a pooled output (small_pooled, reid_r50): a BatchNorm between the features
    # the triplet loss shapes and the embedding the identity loss and retrieval use; false: none
    bn_neck: bool = True
    activation_checkpointing: bool = False
    channels_last: bool = False
    # torch.compile the backbone in place (its state dict keeps its names): the first step compiles
    # (about 30 s for `small` on a CPU, a C++ compiler needed there), later steps run fused kernels
    compile: bool = False
    # exponential moving average of the weights, verified and exported instead of the last step's; 0: off
    ema_decay: float = setting(0.0, FRACTION)
    # start the backbone from an earlier model: a checkpoint (e.g. `facetrain import insightface`'s) or an
    # export directory; the head starts fresh. Ignored when resuming, which restores everything.
    init: str | None = setting(None, NotEmpty(), path=True)
