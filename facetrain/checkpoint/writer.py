"""Writing a training checkpoint: every rank its share, atomically, keeping the last few. It is first
written as `step_N.tmp` and renamed only once complete, so a directory without the suffix is always
whole; `last` and `best` then name it, and older ones are pruned."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from facetrain.checkpoint.app_state import AppState, CheckpointStates
from facetrain.checkpoint.config import CheckpointConfig
from facetrain.checkpoint.layout import complete_checkpoints
from facetrain.checkpoint.names import TRAIN_STATE_KEYS
from facetrain.checkpoint.ranks import RankRoles
from facetrain.checkpoint.storage import save_entries
from facetrain.config.loader import save_config
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.files import atomic_write_text, fsync_directory, write_failure_advice
from facetrain.heads import collectives
from facetrain.job_env import job_id


def save_checkpoint(
    run_dir: Path,
    dims: RankRoles,
    states: CheckpointStates,
    evaluation: dict | None = None,
    is_best: bool = False,
    settings: CheckpointConfig | None = None,
) -> Path:
    """Collective: every rank calls it with its `states` (`app_state.CheckpointStates`). Their
    `train_state`'s `state_dict()`, the counters `names.TRAIN_STATE_KEYS`, goes to meta.json with the
    config's `model.embedding_size`; `evaluation` too, when given. `settings` (the run's `checkpoint`
    section; its defaults when None) say which older checkpoints to prune. Returns the checkpoint
    directory; what each rank writes: `app_state`."""
    saved = states.train_state.state_dict()
    progress = {key: saved[key] for key in TRAIN_STATE_KEYS}
    root = run_dir / "checkpoints"
    final = root / f"step_{progress['step']:08d}"
    tmp = root / f"step_{progress['step']:08d}.tmp"
    _on_primary(lambda: _clear_leftovers(root), dims, root, final)

    ema = None if states.ema is None else states.ema.module
    app = AppState(dims, states.backbone, states.head, states.optimizer, states.scaler, ema)
    try:
        save_entries({"app": app}, tmp, dims.control_group)
    except OSError as error:  # every rank raises it, whichever rank failed
        if dims.is_primary:
            shutil.rmtree(tmp, ignore_errors=True)
        raise EveryRankError(_write_failure(error, root, final)) from None

    def finish() -> None:
        meta = {
            **progress,
            "world_size": dims.world_size,
            "num_classes": len(states.class_names),
            "embedding_size": states.config.model.embedding_size,
            "evaluation": evaluation or {},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elastic_run_id": job_id("TORCHELASTIC_RUN_ID"),
            "slurm_job_id": job_id("SLURM_JOB_ID"),
        }
        atomic_write_text(tmp / "classes.json", json.dumps(states.class_names))
        save_config(states.config, tmp / "config.yaml")
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2))
        fsync_directory(tmp)
        _commit(tmp, final)
        atomic_write_text(root / "last", final.name)
        if is_best:
            atomic_write_text(root / "best", final.name)
        _prune(root, settings or CheckpointConfig(), final)

    _on_primary(finish, dims, root, final, cleanup=tmp)
    return final


def _on_primary(write, dims: RankRoles, root: Path, final: Path, cleanup: Path | None = None) -> None:
    """Run `write` on rank 0 while the others wait; a full disk or an unwritable folder becomes one line
    saying the rest is intact."""

    def guarded() -> None:
        try:
            write()
        except OSError as error:
            if cleanup is not None:
                shutil.rmtree(cleanup, ignore_errors=True)
            raise FacetrainError(_write_failure(error, root, final)) from None

    collectives.primary_first(guarded, also_others=False, group=dims.control_group)


def _write_failure(error: OSError, root: Path, final: Path) -> str:
    reason = f"{error.strerror or error} ({error.filename or root})"
    last = root / "last"
    kept = "none was written before"
    if last.is_file():
        kept = f"the last complete one, {last.read_text().strip()}, is intact"
    advice = write_failure_advice(error)
    return f"cannot write checkpoint {final}: {reason}; {kept}. {advice[0].upper()}{advice[1:]}, then resume with --resume auto"


def _clear_leftovers(root: Path) -> None:
    """Remove what a crash left behind: a half-written `.tmp`, a checkpoint half-way through removal
    (`.deleting`), or one that was being replaced (`.replaced`). None of them is ever read."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob("step_*.*"):
        if leftover.is_dir() and leftover.suffix in (".tmp", ".deleting", ".replaced"):
            shutil.rmtree(leftover)


def _commit(tmp: Path, final: Path) -> None:
    """Make the finished `tmp` the checkpoint `final` in one rename. One already at `final` (a run resumed
    from an earlier step reaches it again) is moved aside and removed only after, so a crash in between
    leaves the old one or the new one."""
    replaced = final.with_name(final.name + ".replaced")
    if final.exists():
        os.replace(final, replaced)
    os.replace(tmp, final)
    fsync_directory(final.parent)
    if replaced.exists():
        shutil.rmtree(replaced)


def _prune(root: Path, settings: CheckpointConfig, written: Path) -> None:
    """Keep the newest `checkpoint.keep` checkpoints, never the one just written nor whatever `best`
    names; runs after `last` names the new one. Each old one is renamed to `.deleting` before its
    files go, so a crash half-way never leaves a partial directory that looks like a checkpoint."""
    best = (root / "best").read_text().strip() if (root / "best").is_file() else None
    complete = complete_checkpoints(root.parent)
    removable = [p for p in complete if p.name not in (written.name, best)]
    for old in removable[: max(0, len(complete) - settings.keep)]:
        doomed = old.with_name(old.name + ".deleting")
        os.replace(old, doomed)
        fsync_directory(root)
        shutil.rmtree(doomed)
