"""What a run resumes from: its own newest whole checkpoint, one named by `--resume`, or, after a
restart of the job by torchrun or Slurm, the checkpoint that job wrote, as if `--resume auto` was given."""

from __future__ import annotations

import json
from pathlib import Path

from facetrain.checkpoint.layout import (
    complete_checkpoints,
    find_damage,
    find_resume_point,
    holds_checkpoints,
    resolve_checkpoint,
)
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.job_env import JOB_IDS, job_id, restart_count


def restarted_job(run_dir: Path) -> bool:
    """Whether this job was restarted after it had written a checkpoint: by torchrun
    (`--max-restarts`) or by Slurm (a requeue after preemption, `scontrol requeue`, or the job script's
    own requeue at the time-limit warning).

    Such a restart continues from that checkpoint as if `--resume auto` had been given. The newest
    checkpoint must carry this job's id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID), so a restart never takes
    over checkpoints of an earlier job that the first attempt refused to train over; a restart count
    without its job id names no job, and takes over nothing.
    """
    restarts = {"elastic_run_id": "TORCHELASTIC_RESTART_COUNT", "slurm_job_id": "SLURM_RESTART_COUNT"}
    try:
        counted = {key: JOB_IDS[count] for key, count in restarts.items() if restart_count(count)}
        restarted = {key: job for key, name in counted.items() if (job := job_id(name)) is not None}
    except FacetrainError as error:  # every rank reads the same environment
        raise EveryRankError(str(error)) from None
    finished = complete_checkpoints(run_dir) if restarted else []
    if not finished:
        return False
    try:
        meta = json.loads((finished[-1] / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return any(meta.get(key) == job for key, job in restarted.items())


def refuse_training_over(run_dir: Path, resume: str | None, restarted: bool) -> None:
    """A new run (no --resume, no restart of its job) into a folder that holds checkpoints is refused.
    Asked before the run's lock is taken, too: two such starts at once then both hear that the folder
    holds a run, rather than the later one that the earlier holds its lock."""
    if resume is None and not restarted and holds_checkpoints(run_dir):
        raise EveryRankError(
            f"{run_dir} already holds checkpoints; pass --resume auto to continue that run, "
            "or choose another train.output_dir"
        )


def find_checkpoint_to_resume(
    run_dir: Path, resume: str | None, restarted: bool | None = None
) -> tuple[Path | None, list[str]]:
    """What to resume from and notes on checkpoints passed over, refusing to silently train over an
    earlier run's checkpoints or to resume from a damaged one. `restarted`: whether torchrun or Slurm
    restarted the job on some rank (`restarted_job` on this one when None)."""
    if restarted is None:
        restarted = restarted_job(run_dir)
    if resume is None and restarted:
        resume = "auto"
    try:
        if resume is None:
            refuse_training_over(run_dir, resume, restarted)
            return None, []
        if resume == "auto":
            return find_resume_point(run_dir)
        checkpoint = resolve_checkpoint(resume)
    except FacetrainError as error:  # every rank reads the same files
        raise EveryRankError(str(error)) from None
    damage = find_damage(checkpoint)
    if damage is not None:
        earlier = [p for p in complete_checkpoints(checkpoint.parent.parent) if p.name < checkpoint.name]
        whole = [p for p in reversed(earlier) if find_damage(p) is None]
        offer = (
            f"resume from the one before it with --resume {whole[0]}" if whole else "no earlier one is whole"
        )
        raise EveryRankError(f"checkpoint {checkpoint} is damaged: {damage}; {offer}")
    return checkpoint, []
