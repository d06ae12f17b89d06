"""The classic angular margins, by name: each maps the target class's cosine to the logit that
replaces it, and needs nothing else from the head (`base.Margin.__call__`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from facetrain.errors import FacetrainError
from facetrain.heads.margins.base import MARGINS, Margin, NegativeModulation, Rows, angle


@MARGINS.register("arcface")
@dataclass(frozen=True)
class ArcFace(Margin):
    """cos(theta + m); past theta + m > pi it continues as cos(theta) - m sin(m), staying monotonic."""

    m: float = 0.5

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        theta = angle(cos)
        penalised = torch.cos(theta + self.m)
        fallback = cos - self.m * math.sin(self.m)
        return torch.where(theta + self.m <= math.pi, penalised, fallback)


@MARGINS.register("cosface", "am_softmax")
@dataclass(frozen=True)
class CosFace(Margin):
    """cos(theta) - m: an additive cosine margin (CosFace, AM-Softmax)."""

    m: float = 0.35

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        return cos - self.m


@MARGINS.register("sphereface")
@dataclass(frozen=True)
class SphereFace(Margin):
    """A-Softmax's psi(theta) = (-1)^k cos(m theta) - 2k for theta in [k pi/m, (k+1) pi/m].

    The piecewise extension keeps the target logit monotonically decreasing in theta for any m >= 1,
    including non-integer m such as the default 1.7, on normalised embeddings.
    """

    m: float = 1.7

    def __post_init__(self):
        if self.m < 1:
            raise FacetrainError(f"sphereface margin m must be >= 1, got {self.m} (head.margin_params.m)")

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        m_theta = self.m * angle(cos)
        k = torch.floor(m_theta / math.pi).detach()
        sign = 1.0 - 2.0 * torch.remainder(k, 2.0)
        return sign * torch.cos(m_theta) - 2.0 * k


@MARGINS.register("combined")
@dataclass(frozen=True)
class Combined(Margin):
    """cos(m1 theta + m2) - m3: SphereFace, ArcFace and CosFace margins in one (insightface's form)."""

    m1: float = 1.0
    m2: float = 0.3
    m3: float = 0.2

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        return torch.cos(self.m1 * angle(cos) + self.m2) - self.m3


@MARGINS.register("softmax")
@dataclass(frozen=True)
class NormalizedSoftmax(Margin):
    """No margin: normalised softmax with the scale alone."""

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        return cos


@dataclass(frozen=True)
class WarmingMargin(Margin):
    """`full` applied at a fraction `factor` of its strength: factor 0 is no margin, 1 the full margin.

    The penalised logit is blended rather than the parameters scaled, so the same ramp fits every
    margin, including SphereFace and the combined margin whose parameters have no "none" value (m1 = 1
    is no margin there, not 0). For CosFace the blend is exactly cos(theta) - factor m. The modulated
    negatives are blended alike (z + factor (z (t + z) - z) is again in `NegativeModulation`'s family),
    and a regulariser is weighted by the factor; the running state keeps advancing as the full one's.
    """

    full: Margin
    factor: float

    @property
    def needs_target_cos(self) -> bool:
        return self.full.needs_target_cos

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        return cos + self.factor * (self.full(cos) - cos)

    def initial_state(self) -> dict[str, float]:
        return self.full.initial_state()

    def updated(self, rows: Rows, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.full.updated(rows, state)

    def target(self, cos, norm, rows, state):
        return cos + self.factor * (self.full.target(cos, norm, rows, state) - cos)

    def negatives(self, rows: Rows, state: dict[str, torch.Tensor]) -> NegativeModulation | None:
        full = self.full.negatives(rows, state)
        if full is None:
            return None
        linear = 1.0 - self.factor + self.factor * full.linear
        return NegativeModulation(full.threshold, linear, self.factor * full.quadratic)

    def regulariser(self, norm: torch.Tensor) -> torch.Tensor | None:
        full = self.full.regulariser(norm)
        return None if full is None else self.factor * full


def margin_at_step(full: Margin, step: int, warmup_steps: int) -> Margin:
    """The margin for the optimizer step after `step` completed ones (head.margin_warmup_steps).

    A margin on a network that cannot yet tell the identities apart mostly pushes every embedding
    around; starting from plain normalised softmax lets the classes form first. The ramp is a pure
    function of the step, so a resumed run uses the margins a straight one would.
    """
    if step >= warmup_steps:
        return full
    return WarmingMargin(full, step / warmup_steps)
