"""What a margin is to the heads: the interface, the registry, and a step's preparation.

A margin maps each row's target cosine to the logit that replaces it. To express the quality-aware
and curriculum margins (AdaFace, MagFace, CurricularFace, ElasticFace) without giving up the class
sharding, it may also see, per row of the global batch, only what every rank has or can get for the
price of a batch-sized exchange (`Rows`): the embedding norm before normalisation (every rank holds
the gathered embeddings), the row's position among the batch's valid rows, and, where it asks
(`needs_target_cos`), the plain target cosine (one all-reduce of B values). It may keep running
state (`initial_state`, replicated on every rank and stored in the head's state dict), add a
per-row regulariser of the norm to the loss, and modulate the non-target logits elementwise with
per-row parameters of one fixed family (`NegativeModulation`), which is what the tiles and kernels
implement once for every margin.

The target logit is a plain differentiable function of the cosine and the norm: the heads take its
exact derivatives with autograd on B-vectors, and the dense reference differentiates the same
function, so they agree to rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from facetrain.errors import FacetrainError
from facetrain.registry import Registry

# acos has an infinite slope at +-1; keep target cosines a hair inside so gradients stay finite.
COS_LIMIT = 1.0 - 1e-6
# rows of a shard's logits modulated at once (`NegativeModulation.apply_`): 256 MiB of fp32 at c = 1M
MODULATED_ROWS = 64


def angle(cos: torch.Tensor) -> torch.Tensor:
    return torch.acos(cos.clamp(-COS_LIMIT, COS_LIMIT))


def sine(cos: torch.Tensor) -> torch.Tensor:
    """sin(theta) from cos(theta), with the slope kept finite at +-1 as for `angle`."""
    return torch.sqrt(1.0 - cos.clamp(-COS_LIMIT, COS_LIMIT).square())


class Rows(NamedTuple):
    """What a margin sees of the global batch's rows (B-vectors, identical on every rank)."""

    norm: torch.Tensor  # |x| before normalisation, detached (the target may take it with gradient)
    valid: torch.Tensor  # False for the padding rows of a short batch
    position: torch.Tensor  # each valid row's index among the valid rows, whatever the number of ranks
    target_cos: torch.Tensor | None  # the plain target cosine, for margins with needs_target_cos

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of `values` over the valid rows."""
        return torch.where(self.valid, values, 0.0).sum() / self.valid.sum()


def row_blocks(rows: int) -> Iterator[slice]:
    """A shard's rows in blocks of MODULATED_ROWS."""
    return (slice(start, start + MODULATED_ROWS) for start in range(0, rows, MODULATED_ROWS))


class NegativeModulation(NamedTuple):
    """Non-target logits above a per-row threshold become z (linear + quadratic z), elementwise.

    CurricularFace's hard negatives (cos > the target's cos(theta + m) become cos (t + cos)) are
    (threshold, t, 1); a warming margin blends them towards the identity. The family is fixed so the
    untiled buffer, the torch tiles and a kernel can all apply it from three B-vectors; the same
    parameters act on scaled logits after `scaled`.
    """

    threshold: torch.Tensor
    linear: torch.Tensor
    quadratic: torch.Tensor

    def scaled(self, scale: float) -> NegativeModulation:
        """The same modulation of s x cos (logits) instead of cos."""
        return NegativeModulation(self.threshold * scale, self.linear, self.quadratic / scale)

    def hard(self, z: torch.Tensor) -> torch.Tensor:
        """Which entries of `z` (B x c) the modulation changes."""
        return z > self.threshold[:, None]

    def modulated(self, z: torch.Tensor, hard: torch.Tensor) -> torch.Tensor:
        return torch.where(hard, z * (self.linear[:, None] + self.quadratic[:, None] * z), z)

    def slope(self, z: torch.Tensor, hard: torch.Tensor) -> torch.Tensor:
        """d modulated / d z at the plain values `z`."""
        return torch.where(hard, self.linear[:, None] + 2.0 * self.quadratic[:, None] * z, 1.0)

    def apply(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The modulated values of `z` (B x c) and their slopes d value / d z."""
        hard = self.hard(z)
        return self.modulated(z, hard), self.slope(z, hard)

    def rows(self, block: slice) -> NegativeModulation:
        return NegativeModulation(*(parameter[block] for parameter in self))

    def apply_(self, z: torch.Tensor) -> torch.Tensor:
        """Modulates a whole shard's `z` (B x c) in place, a block of rows at a time so that what the
        formula makes beside it stays small, and returns the mask of the changed entries: with the
        plain values recomputed, all that the slopes need (1 byte an entry, where the slopes and the
        modulated copy would take 8 beside the buffer: twice the untiled head's memory at C 1M)."""
        hard = torch.empty(z.shape, dtype=torch.bool, device=z.device)
        for block in row_blocks(z.shape[0]):
            torch.gt(z[block], self.threshold[block, None], out=hard[block])
            z[block] = self.rows(block).modulated(z[block], hard[block])
        return hard


@dataclass(frozen=True)
class Margin:
    """Maps cos(theta) of the target class to the penalised target logit (before scaling).

    The classic margins are functions of the cosine alone (`__call__`); the others override `target`
    and, as they need, the state, the modulation of the negatives and the regulariser.
    """

    needs_target_cos: ClassVar[bool] = False  # Rows.target_cos: one all-reduce of B values a step

    def __call__(self, cos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def initial_state(self) -> dict[str, float]:
        """The running state's names and starting values (0-dim buffers of the head)."""
        return {}

    def updated(self, rows: Rows, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The state after a training step's batch; the step then uses it (the authors update first)."""
        return state

    def target(
        self, cos: torch.Tensor, norm: torch.Tensor, rows: Rows, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The penalised target cosine of each row, differentiable in `cos` and `norm`."""
        return self(cos)

    def negatives(self, rows: Rows, state: dict[str, torch.Tensor]) -> NegativeModulation | None:
        return None

    def regulariser(self, norm: torch.Tensor) -> torch.Tensor | None:
        """A per-row loss term of the norm (differentiable), averaged over the batch and added."""
        return None

    @property
    def of_the_cosine_alone(self) -> bool:
        """Whether this is a classic margin, which a head that gives it no norms, rows or state (the
        naive model-parallel baseline) still computes exactly."""
        kind = type(self)
        overrides = (kind.target, kind.negatives, kind.regulariser) != (
            Margin.target,
            Margin.negatives,
            Margin.regulariser,
        )
        return not (overrides or self.needs_target_cos or self.initial_state())


MARGINS: Registry[Margin] = Registry("margin")


class StepMargin(NamedTuple):
    """A margin with what it needs for one step: the rows, the state it uses, the negatives' modulation."""

    margin: Margin
    rows: Rows
    state: dict[str, torch.Tensor]
    negatives: NegativeModulation | None


def prepare_step(
    margin: Margin,
    buffers: dict[str, torch.Tensor],
    norm: torch.Tensor,
    valid: torch.Tensor,
    target_cos: torch.Tensor | None,
    update: bool,
) -> StepMargin:
    """The margin for this step: with `update` (a training step) the running state in `buffers` (the
    head's) advances in place first, on every rank alike, since every rank sees the same rows."""
    norm = norm.detach()
    position = valid.long().cumsum(0) - 1
    rows = Rows(norm, valid, position, None if target_cos is None else target_cos.detach())
    state = {
        name: value.to(norm.dtype) if value.is_floating_point() else value for name, value in buffers.items()
    }
    if update and buffers:
        state = margin.updated(rows, state)
        with torch.no_grad():
            for name, value in state.items():
                buffers[name].copy_(value)
    return StepMargin(margin, rows, state, margin.negatives(rows, state))


def build_margin(name: str, **params: float) -> Margin:
    """The margin `name` with `params` (head.margin_params); unknown parameters are one-line errors."""
    margin_class = MARGINS.get(name)
    known = [field.name for field in dataclasses.fields(margin_class)]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise FacetrainError(
            f"margin {name!r} takes {', '.join(known) or 'no parameters'}, not {', '.join(unknown)} "
            "(head.margin_params)"
        )
    return margin_class(**{key: float(value) for key, value in params.items()})


def check_positive(name: str, **values: float) -> None:
    for key, value in values.items():
        if not value > 0 or not math.isfinite(value):
            raise FacetrainError(f"{name} margin {key} must be > 0, got {value} (head.margin_params.{key})")
