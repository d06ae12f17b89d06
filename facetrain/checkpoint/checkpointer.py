"""The one object a run talks to about its checkpoints (torchtitan's `CheckpointManager` idea).

Made for the run directory before anything is written there, it claims the directory (the rules and
the lock of `run_dir`) and finds what the run resumes from (`resume_point`); once the run is built it
is given what a checkpoint holds (`CheckpointStates`: the trainer, which is where the run is, and the
model parts, optimizers, scaler and weight average). From then on it owns the rules the loop would
otherwise spell out: when a checkpoint is due (`should_save`), writing one atomically and pruning the
stale ones (`save`, `writer.save_checkpoint`), which one was written last, and the lock until `close`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from facetrain import run_lock
from facetrain.checkpoint.ranks import RankRoles
from facetrain.checkpoint.resume_point import find_checkpoint_to_resume, restarted_job
from facetrain.checkpoint.run_dir import claim_run_dir, write_run_config
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.heads import ShardedMarginHead, collectives


@dataclass
class CheckpointStates:
    """What a checkpoint holds: `train_state` (the trainer) goes to meta.json, the rest to DCP."""

    train_state: Stateful
    backbone: nn.Module  # unwrapped, or this rank's pipeline stage
    head: ShardedMarginHead | None  # None on a stage without one
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    ema: nn.Module | None = None


class Checkpointer:
    """A run's checkpoints: every `every_steps` steps (and when asked), the newest `keep` kept."""

    def __init__(self, run_dir: Path, dims: RankRoles, every_steps: int, keep: int):
        self.run_dir, self.dims, self.every_steps, self.keep = run_dir, dims, every_steps, keep
        self.states: CheckpointStates | None = None
        self.config: Any = None
        self.class_names: list[str] = []
        self.last: Path | None = None  # the newest checkpoint written or resumed from
        self.saved_step: int | None = None

    def claim(self) -> None:
        """Collective: rank 0 checks, creates, marks and locks the run directory while the others wait."""
        group = self.dims.control_group
        collectives.primary_first(lambda: claim_run_dir(self.run_dir), also_others=False, group=group)

    def write_run_config(self, config: Any) -> None:
        """Collective: the resolved config beside the checkpoints, written by rank 0."""
        group = self.dims.control_group
        collectives.primary_first(
            lambda: write_run_config(config, self.run_dir), also_others=False, group=group
        )

    def find_resume(self, resume: str | None) -> tuple[Path | None, list[str]]:
        """Collective: what to resume from (`resume` None, "auto" or a path) and notes on what was passed
        over. A restart of the job by torchrun or Slurm on any rank resumes every rank."""
        return find_checkpoint_to_resume(self.run_dir, resume, self._job_restarted())

    def hold(self, states: CheckpointStates, config: Any, class_names: list[str], resumed_from: Path | None):
        """What every checkpoint from now on saves; `resumed_from` counts as the last one written."""
        self.states, self.config, self.class_names = states, config, class_names
        self.last = resumed_from
        self.saved_step = states.train_state.state_dict()["step"] if resumed_from else None

    def should_save(self, step: int, final_step: bool, is_best: bool, interval_due: bool) -> bool:
        """After `step`: at the end, for a new best, when the time interval says so
        (train.checkpoint_every_minutes, agreed by the ranks), or every train.checkpoint_every steps."""
        return is_best or final_step or interval_due or step % self.every_steps == 0

    def holds_step(self, step: int) -> bool:
        return self.saved_step == step

    def save(self, is_best: bool, evaluation: dict | None = None) -> Path:
        """Collective: write a checkpoint of the states, atomically, then prune the stale ones."""
        states = self.states
        self.last = save_checkpoint(
            self.run_dir,
            states.train_state,
            self.config,
            self.dims,
            states.backbone,
            states.head,
            states.optimizer,
            states.scaler,
            self.class_names,
            evaluation=evaluation,
            is_best=is_best,
            keep=self.keep,
            ema=states.ema,
        )
        self.saved_step = states.train_state.state_dict()["step"]
        return self.last

    def close(self) -> None:
        """Give up the run directory's lock (rank 0 holds it from `claim` on)."""
        run_lock.release(self.run_dir)

    def _job_restarted(self) -> bool:
        """Whether torchrun or Slurm restarted this job on any rank. A node that joins a running job (it
        grows back) runs its agent's first attempt, while the nodes it joins have restarted: all resume
        together."""
        group = self.dims.control_group
        mine = torch.tensor([int(restarted_job(self.run_dir))], device=collectives.collective_device(group))
        return bool(collectives.all_reduce_(mine, "max", group))
