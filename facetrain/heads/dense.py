"""The plain single-device margin head: the reference the sharded head must equal, and the
"DDP-replicated full FC" baseline of the benchmarks (every rank holds all C classes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from facetrain.heads.base import HeadOutput, MarginHead


def margin_logits(cos: torch.Tensor, labels: torch.Tensor, margin, scale: float) -> torch.Tensor:
    """scale * cos with each row's target cosine replaced by margin(cos), by plain autograd ops."""
    target = cos.gather(1, labels[:, None])
    return cos.scatter(1, labels[:, None], margin(target)) * scale


class DenseMarginHead(MarginHead):
    """normalize + linear + margin + cross_entropy over the full weight, with autograd doing the rest."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        **margin_params: float,
    ):
        super().__init__(num_classes, embedding_size, num_classes, margin, scale, **margin_params)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        cos = F.linear(F.normalize(embeddings), F.normalize(self.weight))
        cos = cos.to(torch.promote_types(cos.dtype, torch.float32))  # statistics never below fp32
        logits = margin_logits(cos, labels, self.margin, self.scale)
        accuracy = (cos.argmax(dim=1) == labels).float().mean().detach()
        return HeadOutput(F.cross_entropy(logits, labels), accuracy)
