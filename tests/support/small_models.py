"""Small models the export, import and hostile-input tests share: a `small` backbone with randomised
batch-norm statistics (fresh ones are the identity in eval mode, which would hide a format that drops
them), wrapped as `load_model` returns a checkpoint's, and BN calibration for deep random nets (no tests
here)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from facetrain.interop.card import build_card
from facetrain.interop.loading import LoadedModel
from facetrain.models import build_backbone
from facetrain.train.run_config import Config

IMAGE_SIZE = (32, 32)
EMBEDDING_SIZE = 16
THRESHOLD = 0.35


def small_config() -> Config:
    config = Config()
    config.model.backbone = "small"
    config.model.embedding_size = EMBEDDING_SIZE
    config.data.image_size = list(IMAGE_SIZE)
    return config


def fresh_backbone(config: Config, seed: int = 0) -> nn.Module:
    """A backbone with randomized batch-norm statistics, in eval mode, the same for the same seed.

    Fresh batch norms are the identity in eval mode, which would hide a format that drops them.
    """
    torch.manual_seed(seed)
    module = build_backbone(config.model, image_size=tuple(config.data.image_size))
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm1d | nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.3, 0.3)
            layer.running_var.uniform_(0.5, 2.0)
    return module.eval()


def fresh_model(threshold: float | None = THRESHOLD, seed: int = 0) -> LoadedModel:
    """A fresh backbone wrapped as `load_model` would return a checkpoint's."""
    config = small_config()
    module = fresh_backbone(config, seed)
    evaluation = {} if threshold is None else {"verification": {"accuracy": 0.9, "threshold": threshold}}
    meta = {"step": 10, "world_size": 2, "num_classes": 7, "evaluation": evaluation}
    card = build_card(module, config, meta, IMAGE_SIZE, Path("fresh"))
    return LoadedModel(module, IMAGE_SIZE, card, Path("fresh"), "checkpoint")


def images(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, *IMAGE_SIZE, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def calibrated(backbone: nn.Module, size: tuple[int, int], seed: int = 0) -> nn.Module:
    """Random affine BN parameters, and running statistics set to one batch's, so that eval-mode
    activations have the magnitudes of a trained model instead of blowing up through 50+ blocks."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in backbone.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                if module.weight.requires_grad:
                    module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
                module.reset_running_stats()
                module.momentum = None
        backbone.train()
        backbone(torch.rand(8, 3, *size, generator=generator) * 2 - 1)
        for module in backbone.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.momentum = 0.1
    return backbone.eval()
