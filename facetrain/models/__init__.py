"""Backbones: images (B, 3, H, W) to embeddings (B, D), built by name from `model.backbone`.

Every backbone is a `Backbone`, an ordered chain of named top-level modules, so pipeline parallelism
can split it from outside. Model code never imports torch.distributed.
"""

from __future__ import annotations

from facetrain.config.schema import ModelConfig
from facetrain.errors import FacetrainError
from facetrain.models import face_resnet, reid_resnet, small  # noqa: F401  (fill the registry)
from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.registry import BACKBONES

__all__ = ["BACKBONES", "Backbone", "ConvStage", "build_backbone"]


def build_backbone(cfg: ModelConfig, image_size: tuple[int, int] | list[int] | None = None) -> Backbone:
    """The backbone `cfg.backbone` for `image_size` (height, width); None: the backbone's own default
    (112x112 for faces, 256x128 for re-id)."""
    if cfg.embedding_size < 1:
        raise FacetrainError(f"model.embedding_size must be positive, got {cfg.embedding_size}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise FacetrainError(f"model.dropout must be in [0, 1), got {cfg.dropout}")
    size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    if size is not None and min(size) < 8:
        raise FacetrainError(f"image size {size[0]}x{size[1]} is too small for a backbone; use at least 8x8")
    backbone = BACKBONES.build(cfg.backbone, cfg.embedding_size, cfg.dropout, size)
    backbone.set_activation_checkpointing(cfg.activation_checkpointing)
    backbone.set_channels_last(cfg.channels_last)
    return backbone
