"""The tiny backbone, batches and head-free loss the pipeline tests split across ranks, and the
unsplit reference step they are compared with (no tests here)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig

SIZE = (16, 16)
BATCH = 8
EMBEDDING = 8
CLASSES = 10
TOLERANCE = 1e-5


def tiny_backbone() -> nn.Module:
    torch.manual_seed(0)
    return build_backbone(ModelConfig(backbone="small", embedding_size=EMBEDDING), SIZE)


def replica_batch(replica: int, count: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + replica)
    images = torch.randn(count, 3, *SIZE, generator=generator)
    return images, torch.randint(0, CLASSES, (count,), generator=generator)


def projected_cross_entropy(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A head-free loss that still uses the labels: cross-entropy through a fixed projection."""
    projection = torch.randn(EMBEDDING, CLASSES, generator=torch.Generator().manual_seed(7))
    return F.cross_entropy(embeddings @ projection.to(embeddings.device), labels)


def projected_head(embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`projected_cross_entropy` shaped like a margin head: (loss, accuracy)."""
    return projected_cross_entropy(embeddings, labels), torch.zeros(())


def reference_step(
    reference: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], microbatches: int
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The unsplit model: each replica's mean loss over its micro-batches, gradients averaged over replicas."""
    reference.zero_grad()
    losses = []
    for images, labels in batches:
        total = 0.0
        for image_mb, label_mb in zip(images.chunk(microbatches), labels.chunk(microbatches)):
            loss = projected_cross_entropy(reference(image_mb), label_mb) / microbatches
            (loss / len(batches)).backward()
            total += loss.item()
        losses.append(total)
    return losses, {name: p.grad.clone() for name, p in reference.named_parameters()}
