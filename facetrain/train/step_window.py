"""Step figures between two logs, kept on the device so the loop reads the host once per log."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from facetrain.errors import EveryRankError
from facetrain.train.step import StepResult


@dataclass
class StepWindow:
    """Step figures since the last log, summed on the device, plus a watch for non-finite losses."""

    device: torch.device
    steps: int = 0
    started: float = field(default_factory=time.perf_counter)
    sums: torch.Tensor | None = None
    nonfinite_in_a_row: torch.Tensor | None = None
    worst_nonfinite_run: torch.Tensor | None = None
    first_nonfinite_step: torch.Tensor | None = None

    def __post_init__(self):
        self.sums = torch.zeros(2, device=self.device)
        self.nonfinite_in_a_row = torch.zeros((), dtype=torch.int64, device=self.device)
        self.worst_nonfinite_run = torch.zeros_like(self.nonfinite_in_a_row)
        self.first_nonfinite_step = torch.full_like(self.nonfinite_in_a_row, -1)

    def add(self, result: StepResult, step: int) -> None:
        finite = torch.isfinite(result.loss)
        self.sums += torch.stack([result.loss, result.accuracy])
        self.nonfinite_in_a_row = torch.where(finite, 0, self.nonfinite_in_a_row + 1)
        self.worst_nonfinite_run = torch.maximum(self.worst_nonfinite_run, self.nonfinite_in_a_row)
        unseen = (~finite) & (self.first_nonfinite_step < 0)
        self.first_nonfinite_step = torch.where(unseen, step, self.first_nonfinite_step)
        self.steps += 1

    def check_finite(self, tolerated_in_a_row: int, last_checkpoint: str | None) -> None:
        """Stop when the loss went non-finite more often in a row than tolerated (fp16's scaler skips
        such steps and recovers; other precisions tolerate none). One host read."""
        worst, first = torch.stack([self.worst_nonfinite_run, self.first_nonfinite_step]).tolist()
        if worst > tolerated_in_a_row:
            raise EveryRankError(
                f"the loss became non-finite at step {first}; last good checkpoint: "
                f"{last_checkpoint or 'none'}; lower optim.lr or use train.precision=fp32"
            )

    def means(self) -> tuple[float, float]:
        loss, accuracy = (self.sums / max(self.steps, 1)).tolist()
        return loss, accuracy

    def reset(self) -> None:
        self.sums.zero_()
        self.steps = 0
        self.started = time.perf_counter()
