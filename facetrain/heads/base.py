"""What every margin head shares: its settings, its class weight, and what a step returns."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.heads.margins import build_margin


class HeadOutput(NamedTuple):
    """A step's mean loss over the global batch and its top-1 accuracy, both 0-dim device tensors."""

    loss: torch.Tensor
    accuracy: torch.Tensor


class MarginHead(nn.Module):
    """A margin-softmax classifier over `weight_rows` of `num_classes` classes (all of them, or a shard).

    `fused_optimizer` is None unless the head updates its own weight inside the backward (the tiled
    sharded head); a trainer's optimizer then leaves the head's weight alone.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        weight_rows: int,
        margin: str = "arcface",
        scale: float = 64.0,
        dtype: torch.dtype = torch.float32,
        **margin_params: float,
    ):
        super().__init__()
        if scale <= 0:
            raise FacetrainError(f"head scale must be > 0, got {scale} (head.scale)")
        if embedding_size < 1:
            raise FacetrainError(f"embedding size must be >= 1, got {embedding_size}")
        self.num_classes = num_classes
        self.embedding_size = embedding_size
        self.margin = build_margin(margin, **margin_params)
        # the margin's running state: 0-dim buffers, the same on every rank, checkpointed with the head
        # (fp32 whatever the weight's storage dtype; int64 for counters)
        self.margin_state = nn.Module()
        for name, value in self.margin.initial_state().items():
            kind = torch.int64 if isinstance(value, int) else torch.float32
            self.margin_state.register_buffer(name, torch.tensor(value, dtype=kind))
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.empty(weight_rows, embedding_size, dtype=dtype))
        self.fused_optimizer = None  # a FusedOptimizer, set by fuse_optimizer
        nn.init.normal_(self.weight, std=0.01)

    def margin_buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.margin_state.named_buffers())

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        raise NotImplementedError


def regulariser_mean(margin, norm: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
    """The margin's regulariser of the norms (MagFace's g), averaged over the valid rows; None if none."""
    per_row = margin.regulariser(norm)
    if per_row is None:
        return None
    return torch.where(valid, per_row, 0.0).sum() / valid.sum()
