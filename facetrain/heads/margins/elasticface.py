"""ElasticFace (Boutros et al., CVPRW 2022): ArcFace's or CosFace's margin drawn afresh for every
sample from N(m, sigma), so the decision boundary is not one fixed line.

As the authors' losses do (fdbtrs/ElasticFace, utils/losses.py): ElasticArcFace is cos(theta + m_i)
with no fallback past pi, ElasticCosFace cos(theta) - m_i, each m_i drawn per row, unclipped. The
authors draw with torch.normal; here each row's draw is a pure function of (seed, training step,
the row's position among the global batch's valid rows), counter-based and device-independent, so a
run draws the same margins on any number of ranks and a resumed run continues the same sequence (the
step count is the margin's running state, in the head's state dict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from facetrain.heads.margins.base import MARGINS, Margin, Rows, angle, check_positive

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two xor-shift-multiply rounds), in int64 arithmetic that never overflows."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & _MASK32
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & _MASK32
    return x ^ (x >> 16)


def _uniform(seed: int, step: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniform in (0, 1) for each position, fp64, from the key (seed, step, position, stream)."""
    key = _mix32(position + _mix32(step * 4 + stream + _mix32(torch.full_like(position, seed))))
    return (key.double() + 0.5) / 2.0**32


def standard_normals(seed: int, step: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """N(0, 1) per position (Box-Muller on two counter-based uniforms): the same values on any device
    and any number of ranks for the same (seed, step, position)."""
    u1, u2 = (_uniform(seed, step, position, stream) for stream in (0, 1))
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class ElasticMargin(Margin):
    m: float
    sigma: float = 0.05
    seed: float = 0.0

    def __post_init__(self):
        check_positive(type(self).__name__.lower(), m=self.m, sigma=self.sigma)

    def initial_state(self) -> dict[str, float]:
        return {"step": 0}

    def updated(self, rows: Rows, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"step": state["step"] + 1}

    def margins(self, rows: Rows, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each row's margin m_i ~ N(m, sigma) for this step."""
        z = standard_normals(int(self.seed), state["step"], rows.position.clamp_min(0))
        return (self.m + self.sigma * z).to(rows.norm.dtype)


@MARGINS.register("elasticface_arc")
@dataclass(frozen=True)
class ElasticArcFace(ElasticMargin):
    """cos(theta + m_i), m_i ~ N(m, sigma) per row and step."""

    m: float = 0.5

    def target(self, cos, norm, rows, state):
        return torch.cos(angle(cos) + self.margins(rows, state))


@MARGINS.register("elasticface_cos")
@dataclass(frozen=True)
class ElasticCosFace(ElasticMargin):
    """cos(theta) - m_i, m_i ~ N(m, sigma) per row and step."""

    m: float = 0.35

    def target(self, cos, norm, rows, state):
        return cos - self.margins(rows, state)
