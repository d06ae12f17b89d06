"""What a scheduler tells a run through its environment: the job's id and how often it was restarted.

Slurm sets SLURM_JOB_ID and SLURM_RESTART_COUNT, torchrun TORCHELASTIC_RUN_ID and
TORCHELASTIC_RESTART_COUNT. A restart resumes the job's own checkpoints by itself
(`facetrain.checkpoint.resume_point`), the ids go into train.log's header, each checkpoint's meta.json and
the Slurm scripts' run folder name. A user or a wrapper script can set them to anything, so they are
read here, checked once before any rank starts: a count that is no number was a ValueError traceback
(under `--nproc 2` a bare "rank 0 exited with code 1"), a job id holding `/`, `..` or a newline named a
folder outside `runs/` and wrote a line of its own into train.log.
"""

from __future__ import annotations

import os
import re

from facetrain.errors import FacetrainError

RESTART_COUNTS = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
JOB_IDS = {"SLURM_RESTART_COUNT": "SLURM_JOB_ID", "TORCHELASTIC_RESTART_COUNT": "TORCHELASTIC_RUN_ID"}
MAX_RESTARTS = 1_000_000  # far above any scheduler's requeue limit, far below an overflow
JOB_ID = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,127}")  # Slurm's digits, torchrun's run ids


def restart_count(name: str) -> int:
    """The restart count in the environment variable `name`, 0 when unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return 0
    if not value.isascii() or not value.isdigit() or int(value) > MAX_RESTARTS:
        raise FacetrainError(
            f"environment variable {name}={value[:40]!r} is not a restart count (a whole number from 0 to "
            f"{MAX_RESTARTS}); the scheduler sets it: unset it to start the run yourself"
        )
    return int(value)


def job_id(name: str) -> str | None:
    """The job id in the environment variable `name`, None when unset or empty."""
    value = os.environ.get(name)
    if not value:
        return None
    if not JOB_ID.fullmatch(value) or ".." in value:
        raise FacetrainError(
            f"environment variable {name}={value[:40]!r} is not a job id (letters, digits, '_', '+', '-' "
            "and single dots, at most 128); the scheduler sets it: unset it to start the run yourself"
        )
    return value


def check_job_env() -> None:
    """Every scheduler variable facetrain reads, checked at once; one line for the first bad one."""
    for name in RESTART_COUNTS:
        restart_count(name)
        job_id(JOB_IDS[name])
