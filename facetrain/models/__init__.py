"""Backbones: images (B, 3, H, W) to embeddings (B, D), built by name from `model.backbone`.

Every backbone is a `Backbone`, an ordered chain of named top-level modules, so pipeline parallelism
can split it from outside. Model code never imports torch.distributed. The `model` section of a run's
config is `facetrain.models.config.ModelConfig`.
"""

from __future__ import annotations

from facetrain.config import validate_section
from facetrain.models import (  # noqa: F401  (fill the registry)
    dlib_resnet,
    face_resnet,
    iresnet,
    mobilefacenet,
    reid_resnet,
    small,
    timm_backbone,
)
from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.config import ModelConfig, pooled_output_changes
from facetrain.models.registry import BACKBONES, POOLED_OUTPUT_BACKBONES

__all__ = ["BACKBONES", "POOLED_OUTPUT_BACKBONES", "Backbone", "ConvStage", "ModelConfig", "build_backbone"]


def build_backbone(cfg: ModelConfig, image_size: tuple[int, int] | list[int] | None = None) -> Backbone:
    """The backbone `cfg.backbone` for `image_size` (height, width); None: the backbone's own default
    (112x112 for faces, 256x128 for re-id). The model section's field checks run here too, since
    library callers and checkpoints reach this without a validated config; the rules that relate keys
    are the run config's (`facetrain.train.run_config.validate`), and a mismatch reaching here is a caller's ValueError."""
    factory = BACKBONES.get(cfg.backbone)
    validate_section(cfg, "model.")
    size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    if size is not None and min(size) < 8:
        raise ValueError(f"image size {size[0]}x{size[1]} is too small for a backbone; use at least 8x8")
    if cfg.backbone in POOLED_OUTPUT_BACKBONES:
        backbone = factory(cfg.embedding_size, cfg.dropout, size, pooling=cfg.pooling, ibn=cfg.ibn)
    else:
        changed = pooled_output_changes(cfg)
        if changed:
            key, value = changed[0]
            raise ValueError(f"{key}={value} needs a backbone with a pooled output, not {cfg.backbone}")
        backbone = factory(cfg.embedding_size, cfg.dropout, size)
    if not cfg.bn_neck:
        backbone.output.remove_neck()
    backbone.set_activation_checkpointing(cfg.activation_checkpointing)
    backbone.set_channels_last(cfg.channels_last)
    return backbone
