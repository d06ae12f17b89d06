"""What a run directory may hold before training writes into it, and what a run resumes from.

Training never writes over what it did not make: a directory with checkpoints is continued only with
`--resume`, and a `config.yaml` there that facetrain did not write (a user's own config, say) is never
replaced. facetrain marks its resolved config with a first line of its own, `RUN_CONFIG_HEADER`, and
replaces only a file that starts with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from facetrain.checkpoints import (
    complete_checkpoints,
    find_damage,
    find_resume_point,
    holds_checkpoints,
    resolve_checkpoint,
)
from facetrain.config import Config, to_dict
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.files import atomic_write_text

RUN_CONFIG = "config.yaml"
RUN_CONFIG_HEADER = "# facetrain train: this run's resolved config, rewritten at each start; edit a copy\n"


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory whose `config.yaml` is someone else's file."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return
    try:
        with path.open() as handle:
            first_line = handle.readline()
    except OSError as error:
        raise EveryRankError(f"cannot read {path}: {error.strerror}") from None
    if first_line != RUN_CONFIG_HEADER:
        raise EveryRankError(
            f"{path} was not written by facetrain and training would replace it; move it out of "
            "train.output_dir, or choose another train.output_dir"
        )


def write_run_config(cfg: Config, run_dir: Path) -> None:
    """The resolved config beside the run's checkpoints; a full disk or read-only folder is one line."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            run_dir / RUN_CONFIG, RUN_CONFIG_HEADER + yaml.safe_dump(to_dict(cfg), sort_keys=False)
        )
    except OSError as error:
        raise FacetrainError(
            f"cannot write to train.output_dir {run_dir}: {error.strerror} ({error.filename}); "
            "choose a writable folder with free space"
        ) from None


def restarted_by_elastic_agent(run_dir: Path) -> bool:
    """Whether torchrun restarted this job (`--max-restarts`) after it had written a checkpoint.

    Such a restart continues from that checkpoint as if `--resume auto` had been given. The newest
    checkpoint must carry this job's TORCHELASTIC_RUN_ID, so a restart never takes over checkpoints of
    an earlier job that the first attempt refused to train over.
    """
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        return False
    finished = complete_checkpoints(run_dir)
    if not finished:
        return False
    try:
        meta = json.loads((finished[-1] / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("elastic_run_id") == os.environ.get("TORCHELASTIC_RUN_ID")


def find_checkpoint_to_resume(run_dir: Path, resume: str | None) -> tuple[Path | None, list[str]]:
    """What to resume from and notes on checkpoints passed over, refusing to silently train over an
    earlier run's checkpoints or to resume from a damaged one."""
    if resume is None and restarted_by_elastic_agent(run_dir):
        resume = "auto"
    try:
        if resume is None:
            if holds_checkpoints(run_dir):
                raise EveryRankError(
                    f"{run_dir} already holds checkpoints; pass --resume auto to continue that run, "
                    "or choose another train.output_dir"
                )
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
