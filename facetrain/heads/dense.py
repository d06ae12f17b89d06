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
    """normalize + linear + margin + cross_entropy over the full weight, with autograd doing the rest.

    With `sub_centers` K > 1 the weight has K rows a class (class-major) and a class's cosine is the
    largest of its K.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        sub_centers: int = 1,
        **margin_params: float,
    ):
        rows = num_classes * sub_centers
        super().__init__(num_classes, embedding_size, rows, margin, scale, **margin_params)
        self.sub_centers = sub_centers

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        cos = F.linear(F.normalize(embeddings), F.normalize(self.weight))
        cos = cos.view(cos.shape[0], self.num_classes, self.sub_centers).max(dim=2).values
        cos = cos.to(torch.promote_types(cos.dtype, torch.float32))  # statistics never below fp32
        logits = margin_logits(cos, labels, self.margin, self.scale)
        accuracy = (cos.argmax(dim=1) == labels).float().mean().detach()
        return HeadOutput(F.cross_entropy(logits, labels), accuracy)
