"""Backbones: images (B, 3, H, W) to embeddings (B, D), built by name from `model.backbone`.

Every backbone is a `Backbone`, an ordered chain of named top-level modules, so pipeline parallelism
can split it from outside. Model code never imports torch.distributed.
"""

from __future__ import annotations

from facetrain.config import validate_section
from facetrain.config.schema import ModelConfig
from facetrain.errors import FacetrainError
from facetrain.models import (  # noqa: F401  (fill the registry)
    dlib_resnet,
    face_resnet,
    iresnet,
    mobilefacenet,
    reid_resnet,
    small,
)
from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import PooledEmbedding
from facetrain.models.registry import BACKBONES

__all__ = ["BACKBONES", "Backbone", "ConvStage", "build_backbone"]


def build_backbone(cfg: ModelConfig, image_size: tuple[int, int] | list[int] | None = None) -> Backbone:
    """The backbone `cfg.backbone` for `image_size` (height, width); None: the backbone's own default
    (112x112 for faces, 256x128 for re-id). The model section is checked as `facetrain.config.validate`
    checks it, since library callers and checkpoints reach this without a validated config."""
    factory = BACKBONES.get(cfg.backbone)
    validate_section(cfg, "model.")
    size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    if size is not None and min(size) < 8:
        raise FacetrainError(f"image size {size[0]}x{size[1]} is too small for a backbone; use at least 8x8")
    backbone = factory(cfg.embedding_size, cfg.dropout, size)
    if not cfg.bn_neck:
        output = getattr(backbone, "output", None)
        if not isinstance(output, PooledEmbedding):
            raise FacetrainError(
                f"model.bn_neck: false needs a backbone with a pooled re-id output (small_pooled, "
                f"reid_r50), not {cfg.backbone}; remove model.bn_neck"
            )
        output.remove_neck()
    backbone.set_activation_checkpointing(cfg.activation_checkpointing)
    backbone.set_channels_last(cfg.channels_last)
    return backbone
