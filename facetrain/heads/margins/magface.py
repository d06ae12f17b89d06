"""MagFace (Meng et al., CVPR 2021): a margin that grows with the embedding's magnitude, and a
regulariser that rewards magnitude, so the norm becomes a quality score.

As the authors' code does (IrvingMeng/MagFace, models/magface.py and run/trainer.py): the norm is
clamped to [l_a, u_a] and keeps its gradient (through the margin and the regulariser); the margin
m(a) = (u_m - l_m) / (u_a - l_a) (a - l_a) + l_m enters as ArcFace's cos(theta + m(a)) with the
"easy margin" (the plain cosine where cos theta <= 0, the code's default); the loss adds
lambda_g x mean(g(a)), g(a) = 1/a + a / u_a^2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from facetrain.errors import FacetrainError
from facetrain.heads.margins.base import MARGINS, Margin, check_positive, sine


@MARGINS.register("magface")
@dataclass(frozen=True)
class MagFace(Margin):
    """cos(theta + m(a)) where cos theta > 0, a = clamp(|x|, l_a, u_a); loss + lambda_g (1/a + a/u_a^2)."""

    l_a: float = 10.0
    u_a: float = 110.0
    l_m: float = 0.45
    u_m: float = 0.8
    lambda_g: float = 35.0

    def __post_init__(self):
        check_positive("magface", l_a=self.l_a, u_a=self.u_a)
        if not self.l_a < self.u_a:
            raise FacetrainError(
                f"magface needs l_a < u_a, got {self.l_a} and {self.u_a} (head.margin_params)"
            )

    def magnitude(self, norm: torch.Tensor) -> torch.Tensor:
        return norm.clamp(self.l_a, self.u_a)

    def target(self, cos, norm, rows, state):
        a = self.magnitude(norm)
        m = (self.u_m - self.l_m) / (self.u_a - self.l_a) * (a - self.l_a) + self.l_m
        penalised = cos * torch.cos(m) - sine(cos) * torch.sin(m)
        return torch.where(cos > 0, penalised, cos)

    def regulariser(self, norm: torch.Tensor) -> torch.Tensor:
        a = self.magnitude(norm)
        return self.lambda_g * (1.0 / a + a / self.u_a**2)
