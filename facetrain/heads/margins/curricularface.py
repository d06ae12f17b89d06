"""CurricularFace (Huang et al., CVPR 2020): ArcFace on the target, and hard negatives weighted by
an adaptive t that follows training from easy samples to hard ones.

As the authors' head does (HuangYG123/CurricularFace, head/metrics.py): cosines clamped to [-1, 1];
the target logit is cos(theta + m) where cos theta > cos(pi - m), else cos theta - m sin(pi - m); a
negative is hard where its cosine exceeds the row's cos(theta + m) (the unfolded one, also where the
fallback gives the target logit) and becomes cos (t + cos); t, the running mean of the batch's target
cosines with momentum 0.01, advances *before* the step uses it and carries no gradient; neither does
the hardness mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from facetrain.heads.margins.base import MARGINS, Margin, NegativeModulation, Rows, check_positive, sine


@MARGINS.register("curricularface")
@dataclass(frozen=True)
class CurricularFace(Margin):
    """Target cos(theta + m); negatives with cos > cos(theta_y + m) become cos (t + cos)."""

    m: float = 0.5
    momentum: float = 0.01

    needs_target_cos = True

    def __post_init__(self):
        check_positive("curricularface", m=self.m, momentum=self.momentum)

    def initial_state(self) -> dict[str, float]:
        return {"t": 0.0}

    def updated(self, rows: Rows, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mean = rows.mean(rows.target_cos.clamp(-1.0, 1.0))
        return {"t": self.momentum * mean + (1 - self.momentum) * state["t"]}

    def unfolded(self, cos: torch.Tensor) -> torch.Tensor:
        return cos * math.cos(self.m) - sine(cos) * math.sin(self.m)

    def target(self, cos, norm, rows, state):
        cos = cos.clamp(-1.0, 1.0)
        fallback = cos - math.sin(math.pi - self.m) * self.m
        return torch.where(cos > math.cos(math.pi - self.m), self.unfolded(cos), fallback)

    def negatives(self, rows: Rows, state: dict[str, torch.Tensor]) -> NegativeModulation:
        threshold = self.unfolded(rows.target_cos.clamp(-1.0, 1.0))
        t = state["t"].expand_as(threshold)
        return NegativeModulation(threshold, t, torch.ones_like(threshold))
