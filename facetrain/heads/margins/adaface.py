"""AdaFace (Kim, Jain and Liu, CVPR 2022): a margin that adapts to image quality, read from the
embedding's norm relative to the norms of recent batches.

As the authors' head does (mk-minchul/AdaFace, head.py): the norms are clipped to [0.001, 100] and
detached (no gradient flows through them); the running mean and std of the norms advance by t_alpha
from the batch's mean and unbiased std *before* the step uses them; the normalised norm
(norm - mean) / (std + eps) times h, clipped to [-1, 1], scales an angular part -m x scaler and an
additive part m + m x scaler: cos(clip(theta - m scaler, eps, pi - eps)) - (m + m scaler), with the
target cosine clipped to [-1 + eps, 1 - eps], eps = 1e-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from facetrain.heads.margins.base import MARGINS, Margin, Rows, check_positive

EPS = 1e-3
NORM_RANGE = (0.001, 100.0)


@MARGINS.register("adaface")
@dataclass(frozen=True)
class AdaFace(Margin):
    """cos(theta - m g) - m (1 + g), g = clip(h (|x| - mean) / (std + eps), -1, 1) from running norms."""

    m: float = 0.4
    h: float = 0.333
    t_alpha: float = 0.01  # the running statistics' momentum

    def __post_init__(self):
        check_positive("adaface", m=self.m, h=self.h, t_alpha=self.t_alpha)

    def initial_state(self) -> dict[str, float]:
        return {"batch_mean": 20.0, "batch_std": 100.0}  # the authors' starting values

    def updated(self, rows: Rows, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        norm = rows.norm.clamp(*NORM_RANGE)
        count = rows.valid.sum()
        mean = rows.mean(norm)
        variance = torch.where(rows.valid, (norm - mean).square(), 0.0).sum() / (count - 1).clamp_min(1)
        # a lone row has no std (the authors' torch.std gives nan and poisons the state): keep the old
        std = torch.where(count > 1, variance.sqrt(), state["batch_std"])
        alpha = self.t_alpha
        return {
            "batch_mean": alpha * mean + (1 - alpha) * state["batch_mean"],
            "batch_std": alpha * std + (1 - alpha) * state["batch_std"],
        }

    def scaler(self, norm: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        normalised = (norm.detach().clamp(*NORM_RANGE) - state["batch_mean"]) / (state["batch_std"] + EPS)
        return (normalised * self.h).clamp(-1.0, 1.0)

    def target(self, cos, norm, rows, state):
        scaler = self.scaler(norm, state)
        theta = torch.acos(cos.clamp(-1 + EPS, 1 - EPS))
        angular = torch.cos((theta - self.m * scaler).clamp(EPS, math.pi - EPS))
        return angular - (self.m + self.m * scaler)
