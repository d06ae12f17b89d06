"""Generalised-mean (GeM) pooling for the re-id output (Radenović, Tolias and Chum, "Fine-tuning CNN
image retrieval with no human annotation", TPAMI 2018)."""

from __future__ import annotations

import torch
from torch import nn

GEM_INITIAL_POWER = 3.0


class GeneralizedMeanPooling(nn.Module):
    """Pools a map to (mean over positions of x^p)^(1/p) per channel, with the power p learned.

    p = 1 is average pooling and a large p approaches max pooling: the network learns how much the
    strongest responses of a crop (a bag, a logo) should outweigh the rest, which re-id baselines that
    transfer across datasets (fast-reid, AGW) adopted over plain averaging. The power needs positive
    inputs, so the map is clamped at `eps` first: negative activations (PReLU) count as (almost) zero. The
    powers run in at least fp32, since x^3 of a bf16 map loses most of its digits.
    """

    def __init__(self, power: float = GEM_INITIAL_POWER, eps: float = 1e-6):
        super().__init__()
        self.power = nn.Parameter(torch.tensor(power))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        power = self.power.to(dtype)
        pooled = x.to(dtype).clamp(min=self.eps).pow(power).mean(dim=(-2, -1), keepdim=True)
        return pooled.pow(1.0 / power).to(x.dtype)

    def extra_repr(self) -> str:
        return f"power={float(self.power.detach()):.3f}, eps={self.eps}"
