"""What a run continues from: its own checkpoint, on any number of ranks, or an earlier model's backbone.

A resume says what changed in one line: the world size (`membership_line`), or that the checkpoint is
already at train.steps (`nothing_left_to_train`). Under torchrun's elastic agent (`--nnodes MIN:MAX`)
a run that loses a node restarts on fewer ranks, and may grow back later; each attempt resumes from the
last checkpoint with the head resharded. To train the same model, a step must mean the same on any
number of ranks: `train.global_batch` fixes the images a step takes and the micro-batch
(`train.batch_size`) keeps its size, so fewer ranks accumulate more micro-batches. The sampler deals
the same micro-batches in the same order on any world size (`facetrain/data/samplers.py`), so
batch-norm sees the same batches and the gradient is the same sum, up to the order of float additions.

An earlier model (`model.init`, `facetrain train --init`: fine-tuning) may be a training checkpoint,
the checkpoint `facetrain import insightface` writes, or an export directory; only its backbone is
taken, and the run's head starts fresh for the run's own identities. Keys and shapes must match
exactly, so a wrong architecture is one line, not a silent partial load.
"""

from __future__ import annotations

import csv
from pathlib import Path

from torch import nn

from facetrain.config.validate import show
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.heads.margins import build_margin
from facetrain.interop.loading import load_model
from facetrain.models.state_match import first_nonfinite, first_state_mismatch
from facetrain.train.run_config import Config


def hold_global_batch(cfg: Config, replicas: int) -> None:
    """Set optim.grad_accumulation = train.global_batch / (train.batch_size x replicas) in place;
    nothing without train.global_batch. A global batch that does not divide is left to `validate`."""
    global_batch = cfg.train.global_batch
    if global_batch is not None:
        cfg.optim.grad_accumulation = max(1, global_batch // (cfg.train.batch_size * replicas))


def last_logged_step(run_dir: Path) -> int | None:
    """The last step metrics.csv holds: how far the previous attempt got, to within train.log_every."""
    try:
        with (run_dir / "metrics.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        return int(rows[-1]["step"]) if rows else None
    except (OSError, KeyError, ValueError, TypeError):
        return None


def membership_line(
    old_world_size: int, new_world_size: int, resumed_step: int, reached_step: int | None, accumulation: int
) -> str:
    """One line per change: the world sizes, the step resumed from and the steps the change cost."""
    lost = max(0, (reached_step or resumed_step) - resumed_step)
    redone = f" (steps {resumed_step + 1}-{resumed_step + lost} are taken again)" if lost else ""
    return (
        f"membership: world size {old_world_size} -> {new_world_size}; resumed from step {resumed_step}, "
        f"{lost} step{'s' if lost != 1 else ''} lost{redone}; {accumulation} micro-batch"
        f"{'es' if accumulation != 1 else ''} a rank per step"
    )


def nothing_left_to_train(step: int, steps: int) -> str | None:
    """A resume at or past train.steps trains nothing; without this note, `done: 10 steps` after
    `--set train.steps=4` reads as if the new setting had been ignored."""
    if step < steps:
        return None
    where = "already at" if step == steps else "past"
    return (
        f"note: the checkpoint's step {step} is {where} train.steps={steps}, so there is nothing left to "
        f"train; raise train.steps above {step} to train on"
    )


# What a checkpoint's weights mean, and which of them train: changed on resume, the run would go on
# under another loss (a margin and its parameters: AdaFace's running norms mean nothing to ArcFace), with
# other rows a class (sub-centers), or freeze and decay weights it already trained. Changing one is a
# new run started from the checkpoint with --init. (model.backbone, embedding size and image size, the
# classes, and optim.name have checks of their own, at load.)
FIXED_ON_RESUME = (
    "head.margin",
    "head.margin_params",
    "head.sub_centers",
    "optim.freeze_stages",
    "optim.layer_decay",
    "optim.head_only_steps",
)
# How the same weights are computed, not what they mean: a resume may change them, and says so.
CHANGEABLE_ON_RESUME = (
    "train.precision",
    "head.mode",
    "head.kernel",
    "head.tile_classes",
    "model.compile",
    "model.channels_last",
)


def check_resumed_settings(trained: Config, cfg: Config, checkpoint: Path, step: int) -> list[str]:
    """Refuse, in one line naming the key and the checkpoint's value, a resume that changes what the
    weights mean (FIXED_ON_RESUME); the notes for what changes only how they are computed."""
    for key in FIXED_ON_RESUME:
        was, now = _setting(trained, key, step), _setting(cfg, key, step)
        if was != now:
            value = _value(trained, key)
            raise EveryRankError(
                f"{key}: checkpoint {checkpoint} was trained with {show(value)}, this run sets "
                f"{show(_value(cfg, key))}; resume with --set {key}={show(value)}, or start a new run from it "
                f"with --init {checkpoint} to change it"
            )
    changed = [key for key in CHANGEABLE_ON_RESUME if _value(trained, key) != _value(cfg, key)]
    return [
        f"note: resuming with {key} {show(_value(trained, key))} -> {show(_value(cfg, key))} (checkpoint "
        f"{checkpoint.name}): the same weights, computed another way"
        for key in changed
    ]


def _value(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _setting(cfg: Config, key: str, step: int):
    """What `key` does from `step` on: a margin with its defaults filled in (margin_params {} is m=0.5
    for ArcFace), the head-only steps still to come (0 once past them, whatever the number)."""
    if key == "head.margin_params":
        return build_margin(cfg.head.margin, **cfg.head.margin_params)
    if key == "optim.head_only_steps":
        return max(0, cfg.optim.head_only_steps - step)
    return _value(cfg, key)


def load_initial_backbone(path: str | Path, backbone: nn.Module, backbone_name: str) -> None:
    """Fill this run's `backbone` from `model.init` as `load_model` loads it, refusing in one line (on
    every rank) a model whose keys or shapes differ, which a partial load would hide."""
    try:
        loaded = load_model(path)
    except FacetrainError as error:
        raise EveryRankError(f"model.init: {error}") from None
    theirs = loaded.module.state_dict()
    mismatch = first_state_mismatch(theirs, backbone.state_dict(), backbone_name)
    if mismatch is not None:
        trained_as = loaded.card.get("architecture", "another backbone")
        raise EveryRankError(
            f"model.init: {path}: {mismatch}; it holds a {trained_as}: set model.backbone "
            "(and model.embedding_size, data.image_size) to match it"
        )
    nonfinite = first_nonfinite(theirs)
    if nonfinite is not None:
        raise EveryRankError(
            f"model.init: {path}: {nonfinite}; it comes from a diverged run or is damaged, so it was not "
            "loaded: start from an earlier checkpoint of that run"
        )
    backbone.load_state_dict(theirs)
