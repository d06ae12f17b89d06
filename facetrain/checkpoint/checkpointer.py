"""The one object a run talks to about its checkpoints (torchtitan's `CheckpointManager` idea).

Made for the run directory from the `checkpoint` config section before anything is written there, it
claims the directory (the rules and the lock of `run_dir`) and finds what the run resumes from
(`resume_point`). Once the run is built it is given what a checkpoint holds (`CheckpointStates`), and
from then on it owns both directions: `load` restores the whole run from the checkpoint found (model,
head rows, optimizer, scaler, weight average, sample position, RNG streams), and it makes every save
decision the loop would otherwise spell out (`due`: every `checkpoint.every` steps, when the
`checkpoint.every_minutes` clock says so, for a new best, at the end; `due_on_stop`: a stop or a
preemption), writes each checkpoint atomically and prunes the stale ones (`save`), remembers which one
was written last, and holds the lock until `close`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from facetrain import run_lock
from facetrain.checkpoint.app_state import CheckpointStates
from facetrain.checkpoint.config import CheckpointConfig
from facetrain.checkpoint.ranks import RankRoles
from facetrain.checkpoint.reader import load_checkpoint, load_ema_weights
from facetrain.checkpoint.resume_point import (
    find_checkpoint_to_resume,
    refuse_training_over,
    restarted_job,
)
from facetrain.checkpoint.run_dir import claim_run_dir, write_run_config
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.heads import collectives


class SaveClock:
    """`checkpoint.every_minutes` on this host's clock, from the last checkpoint written (or the run's
    start).
    Clocks differ between hosts, so only rank 0's is asked (`facetrain.train.step_gate` carries its
    answer to every rank in the all-reduce it makes before each step anyway)."""

    def __init__(self, every_minutes: float | None):
        self.every_s = None if every_minutes is None else 60 * every_minutes
        self.restart()

    def restart(self) -> None:
        self.started = time.monotonic()

    def due(self) -> bool:
        return self.every_s is not None and time.monotonic() - self.started >= self.every_s


class Checkpointer:
    """A run's checkpoints under `run_dir`, as its `checkpoint` config section says."""

    def __init__(self, run_dir: Path, dims: RankRoles, settings: CheckpointConfig):
        self.run_dir, self.dims, self.settings = run_dir, dims, settings
        self.clock = SaveClock(settings.every_minutes)
        self.states: CheckpointStates | None = None
        self.resume_from: Path | None = None  # what `find_resume` chose, for `load`
        self.last: Path | None = None  # the newest checkpoint written or resumed from
        self.saved_step: int | None = None

    def claim(self, resume: str | None = None) -> None:
        """Collective: rank 0 checks, creates, marks and locks the run directory while the others wait.
        A new run (`resume` None) into a folder holding checkpoints is refused before the lock is taken
        (`resume_point.refuse_training_over`)."""
        refuse_training_over(self.run_dir, resume, self._job_restarted())
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
        over; `load` restores it. A restart of the job by torchrun or Slurm on any rank resumes every
        rank."""
        self.resume_from, notes = find_checkpoint_to_resume(self.run_dir, resume, self._job_restarted())
        return self.resume_from, notes

    def hold(self, states: CheckpointStates) -> None:
        """What `load` restores into and every checkpoint from now on saves. The clock starts now, with
        the run built: its set-up (scanning or writing the data) is no training to lose."""
        self.states = states
        self.clock.restart()

    def load(self, keep_optimizer: bool = True, class_rows: list[int | None] | None = None) -> bool:
        """Collective: restore the whole run from the checkpoint `find_resume` chose into the held
        states; False when there is none (a new run). The weight average carries on from the
        checkpoint's, or starts from the restored weights when it kept none (its run had
        model.ema_decay 0). `keep_optimizer` and `class_rows`: see `reader.load_checkpoint`."""
        checkpoint, states = self.resume_from, self.states
        if checkpoint is None:
            return False
        progress = load_checkpoint(
            checkpoint, self.dims, states.backbone, states.head, states.optimizer, states.scaler,
            keep_optimizer, class_rows,
        )  # fmt: skip
        states.train_state.load_state_dict(progress)
        ema = states.ema
        if ema is not None:
            if load_ema_weights(checkpoint, ema.module):
                ema.updates = progress["step"]
            else:
                ema.module.load_state_dict(states.backbone.state_dict())
        self.last, self.saved_step = checkpoint, progress["step"]
        return True

    def due(self, step: int, final_step: bool, is_best: bool, clock_due: bool) -> bool:
        """Whether to save after `step`: at the end, for a new best, when the clock says so
        (`clock_due`, rank 0's `clock` agreed by every rank), or every checkpoint.every steps."""
        return is_best or final_step or clock_due or step % self.settings.every == 0

    def due_on_stop(self, step: int) -> bool:
        """Whether a run stopping after `step` (a signal, a preemption, a data error) saves: unless that
        step is the one saved or resumed from, or no step was taken."""
        return step > 0 and self.saved_step != step

    def save(self, is_best: bool, evaluation: dict | None = None) -> Path:
        """Collective: write a checkpoint of the states, atomically, then prune the stale ones."""
        self.last = save_checkpoint(self.run_dir, self.dims, self.states, evaluation, is_best, self.settings)
        self.saved_step = self.states.train_state.state_dict()["step"]
        self.clock.restart()
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
