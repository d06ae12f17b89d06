"""The plain single-device margin head: the reference the sharded head must equal, and the
"DDP-replicated full FC" baseline of the benchmarks (every rank holds all C classes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from facetrain.heads.base import HeadOutput, MarginHead, regulariser_mean
from facetrain.heads.margins import Margin, StepMargin, prepare_step


def margin_logits(
    cos: torch.Tensor, labels: torch.Tensor, margin: Margin | StepMargin, scale: float, norm=None
) -> torch.Tensor:
    """scale * cos with each row's target cosine replaced by the margin's target logit and, where the
    margin says, the negatives modulated, by plain autograd ops. A bare `Margin` is a classic one
    (a function of the cosine alone)."""
    step = margin if isinstance(margin, StepMargin) else StepMargin(margin, None, {}, None)
    target = cos.gather(1, labels[:, None]).squeeze(1)
    penalised = step.margin.target(target, norm, step.rows, step.state)
    if step.negatives is not None:
        cos = step.negatives.apply(cos)[0]
    return cos.scatter(1, labels[:, None], penalised[:, None]) * scale


class DenseMarginHead(MarginHead):
    """normalize + linear + margin + cross_entropy over the full weight, with autograd doing the rest.

    With `sub_centers` K > 1 the weight has K rows a class (class-major) and a class's cosine is the
    largest of its K. `label_smoothing` is torch's, on the margin's logits.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        sub_centers: int = 1,
        label_smoothing: float = 0.0,
        **margin_params: float,
    ):
        rows = num_classes * sub_centers
        super().__init__(num_classes, embedding_size, rows, margin, scale, **margin_params)
        self.sub_centers = sub_centers
        self.label_smoothing = float(label_smoothing)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        cos = F.linear(F.normalize(embeddings), F.normalize(self.weight))
        cos = cos.view(cos.shape[0], self.num_classes, self.sub_centers).max(dim=2).values
        cos = cos.to(torch.promote_types(cos.dtype, torch.float32))  # statistics never below fp32
        norm = torch.linalg.vector_norm(embeddings.to(cos.dtype), dim=1)
        valid = torch.ones_like(labels, dtype=torch.bool)
        plain_target = cos.gather(1, labels[:, None]).squeeze(1)
        target_cos = plain_target if self.margin.needs_target_cos else None
        step = prepare_step(self.margin, self.margin_buffers(), norm, valid, target_cos, self.training)
        logits = margin_logits(cos, labels, step, self.scale, norm)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        regulariser = regulariser_mean(self.margin, norm, valid)
        if regulariser is not None:
            loss = loss + regulariser
        accuracy = (cos.argmax(dim=1) == labels).float().mean().detach()
        return HeadOutput(loss, accuracy)
