"""The `model` section of a run's config: which backbone, its embedding, and how it runs; the backbone
is checked against the backbones this package registers."""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.config.bounds import FRACTION
from facetrain.config.checks import NotEmpty, OneOf, Registered, Within, setting
from facetrain.models.embedding import POOLINGS
from facetrain.models.registry import BACKBONES


@dataclass
class ModelConfig:
    backbone: str = setting("r50", Registered(BACKBONES))
    embedding_size: int = setting(512, Within(1, 2**16))
    dropout: float = setting(0.0, FRACTION)
    # re-id backbones with a pooled output (small_pooled, reid_r50): a BatchNorm between the features
    # the triplet loss shapes and the embedding the identity loss and retrieval use; false: none
    bn_neck: bool = True
    # how those backbones pool their last map: avg, or gem (generalised mean, its power learned)
    pooling: str = setting("avg", OneOf(POOLINGS))
    # IBN-a in those backbones: half instance normalisation in the early stages, for unseen cameras
    ibn: bool = False
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


POOLED_OUTPUT_KEYS = ("bn_neck", "pooling", "ibn")


def pooled_output_changes(cfg: ModelConfig) -> list[tuple[str, object]]:
    """(key, value) of the settings only a pooled re-id output has that `cfg` moves off their defaults:
    any other backbone must leave them alone."""
    defaults = ModelConfig()
    return [
        (key, getattr(cfg, key)) for key in POOLED_OUTPUT_KEYS if getattr(cfg, key) != getattr(defaults, key)
    ]
