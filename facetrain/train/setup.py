"""Everything a training run needs, built once in a fixed order before the first step.

Data first (the primary rank first, so a generated dataset is written once), then the model with the
same initial weights on every rank, parallelized from outside, the sharded head over the last stage's
data-parallel group, the optimizer and weight average, then the state of a resumed run (restored by the
checkpointer, which is handed everything a checkpoint holds) and finally the schedule from its step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from facetrain.checkpoint import Checkpointer, CheckpointStates, check_row_shards_supported, read_meta
from facetrain.data import build_train_dataset, build_train_loader, prepare_train_data
from facetrain.files import atomic_write_text
from facetrain.heads import collectives
from facetrain.logger import logger
from facetrain.models import build_backbone
from facetrain.parallel.dims import ParallelDims
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.train.class_remap import match_classes
from facetrain.train.data_checks import check_training_set
from facetrain.train.device_defaults import DeviceDefaults
from facetrain.train.distillation import build_distillation, pin_teacher
from facetrain.train.ema import WeightEma
from facetrain.train.head_plan import build_head
from facetrain.train.imprint import imprint_head
from facetrain.train.losses import build_loss
from facetrain.train.optim import build_optimizer
from facetrain.train.resume import (
    check_resumed_settings,
    last_logged_step,
    load_initial_backbone,
    membership_line,
    nothing_left_to_train,
)
from facetrain.train.run_config import Config, checkpoint_config
from facetrain.train.schedule_notes import schedule_change_line, schedule_warning
from facetrain.train.schedulers import LrSchedulers, build_lr_schedulers
from facetrain.train.stage_groups import freeze_stages
from facetrain.train.state import TrainState
from facetrain.train.step import StepParts, StepSettings


class TrainingData(NamedTuple):
    dataset: torch.utils.data.Dataset
    loader: torch.utils.data.DataLoader
    sampler: torch.utils.data.Sampler


class TrainingRun(NamedTuple):
    """What `build_training_run` makes, for the `Trainer` to own (with the config it was given)."""

    run_dir: Path
    data: TrainingData
    backbone: nn.Module  # this rank's backbone (or pipeline stage), unwrapped
    parts: StepParts  # what train_step trains: the parallelized model, the head, the optimizer
    ema: WeightEma | None  # model.ema_decay's weight average
    scheduler: LrSchedulers
    state: TrainState
    resumed_from: Path | None


def build_training_run(
    cfg: Config,
    dims: ParallelDims,
    resume: str | None,
    device_defaults: DeviceDefaults,
    checkpointer: Checkpointer,
) -> TrainingRun:
    """`cfg` is the run's one config, already resolved (`facetrain.train.trainer.resolve_run_config`);
    the `checkpointer` claims the run directory (and checks it, `checkpoint.run_dir`), finds the
    checkpoint to resume from and restores the run from it, once each, here; it holds the run's states
    from then on."""
    if dims.dp > 1:  # a head sharded over the data-parallel ranks: refused now, not at the first save
        check_row_shards_supported()
    run_dir = checkpointer.run_dir
    checkpointer.claim(resume)
    checkpoint, notes = checkpointer.find_resume(resume)
    accumulation = cfg.optim.grad_accumulation
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    trained = None if checkpoint is None else checkpoint_config(checkpoint)  # read once: it may say so
    # before the config is saved: it records the pinned one
    pinned = pin_teacher(cfg.loss, None if trained is None else trained.loss.teacher, dims.control_group)
    checkpointer.write_run_config(cfg)
    if dims.is_primary:
        logger.info(device_defaults.describe())
        if device_defaults.warning is not None:
            logger.warning(device_defaults.warning)
        for note in notes:
            logger.info(f"note: {note}")
        if pinned is not None:
            logger.info(pinned)
        if (warning := schedule_warning(cfg)) is not None:
            logger.warning(warning)

    # host-side waits go through the CPU group; every rank scans the data at once, not after rank 0
    collectives.primary_first(
        lambda: prepare_train_data(cfg.data), also_others=False, group=dims.control_group
    )
    dataset = collectives.on_every_rank(lambda: build_train_dataset(cfg.data), group=dims.control_group)
    remap = None
    if checkpoint is not None:  # before classes.json is replaced: the run's record of what its rows mean
        remap = match_classes(checkpoint, dataset.class_names, cfg.data.path, cfg.train.remap_classes)
    warnings = check_training_set(dataset, cfg.data.path)  # every rank: the set is the same
    if dims.is_primary:
        atomic_write_text(run_dir / "classes.json", json.dumps(dataset.class_names))
        for warning in warnings:
            logger.warning(warning)

    # Same initial weights on every rank; the head is drawn the same whatever the world size.
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.model, tuple(cfg.data.image_size))
    if cfg.model.init is not None and checkpoint is None:
        load_initial_backbone(cfg.model.init, backbone, cfg.model.backbone)
        if dims.is_primary:
            logger.info(f"backbone initialised from {cfg.model.init} (model.init); the head starts fresh")
    freeze_stages(backbone, backbone.stages, cfg.optim.freeze_stages)  # before DDP reads requires_grad
    batch_shape = (cfg.train.batch_size, 3, *cfg.data.image_size)
    local, model, pipeline = parallelize_backbone(
        backbone, dims, cfg.parallel, batch_shape, broadcast_buffers=device_defaults.broadcast_buffers
    )
    if cfg.model.compile:  # in place, under DDP or a pipeline stage alike: parameter names unchanged
        local.compile()
    head = build_head(cfg, dataset.num_classes, dims, backbone) if dims.is_last_stage else None
    if head is not None and cfg.head.init == "class_means" and checkpoint is None:
        line = imprint_head(cfg, backbone, head, dataset, dims.device)
        if dims.is_primary:
            logger.info(line)
    loss = build_loss(cfg.loss, head, local) if head is not None else None
    # before the per-rank seed: building the teacher draws initial weights, which a resume must not redo
    distillation = build_distillation(cfg.loss, cfg.model.embedding_size, dims.device, len(dataset))
    if distillation is not None and distillation.cache is not None and dims.is_primary:
        logger.info(distillation.cache.describe())
    loader, sampler = build_train_loader(
        dataset, cfg.data, cfg.train.batch_size, dims.dp_rank, dims.dp, cfg.train.seed, accumulation,
        with_indices=cfg.loss.teacher_cache,
    )  # fmt: skip
    fp16 = cfg.train.precision == "fp16"
    optimizer = build_optimizer(cfg.optim, local, head, grad_scaling=fp16, stages=backbone.stages)
    scaler = torch.amp.GradScaler(dims.device.type, enabled=cfg.train.precision == "fp16")
    torch.manual_seed(cfg.train.seed + 7919 * (dims.rank + 1))  # per-rank streams: dropout, Partial FC

    state = TrainState()
    ema = None if cfg.model.ema_decay == 0 else WeightEma(local, cfg.model.ema_decay)
    names = dataset.class_names
    checkpointer.hold(CheckpointStates(state, cfg, names, local, head, optimizer, scaler, ema))
    if trained is not None:
        class_rows = None if remap is None else remap.rows
        settings_notes = check_resumed_settings(trained, cfg, checkpoint, read_meta(checkpoint)["step"])
        keep_optimizer = trained.optim.name == cfg.optim.name
        if not keep_optimizer and dims.is_primary:
            logger.warning(optimizer_change_warning(checkpoint, trained.optim.name, cfg.optim.name))
        checkpointer.load(keep_optimizer, class_rows)
        if remap is not None:  # the sample position belongs to the data the checkpoint was trained on
            state.consumed = 0
        if dims.is_primary:
            logger.info(f"resumed from {checkpoint} at step {state.step}")
            if remap is not None:
                logger.info(remap.describe())
            written_by = read_meta(checkpoint)["world_size"]
            # a resize, or torchrun or Slurm restarted the job
            if written_by != dims.world_size or resume is None:
                reached = last_logged_step(run_dir)
                logger.info(membership_line(written_by, dims.world_size, state.step, reached, accumulation))
            if (note := nothing_left_to_train(state.step, cfg.train.steps)) is not None:
                logger.info(note)
            if (note := schedule_change_line(trained, cfg, state.step)) is not None:
                logger.info(note)
            for note in settings_notes:
                logger.info(note)
    scheduler = build_lr_schedulers(optimizer, head, cfg.optim, cfg.train.steps, start_step=state.step)
    settings = StepSettings(
        dims.device, cfg.train.precision, accumulation, cfg.optim.grad_clip, cfg.model.channels_last
    )
    parts = StepParts(model, head, optimizer, scaler, settings, pipeline, loss, distillation)
    data = TrainingData(dataset, loader, sampler)
    return TrainingRun(run_dir, data, local, parts, ema, scheduler, state, checkpoint)


def optimizer_change_warning(checkpoint: Path, trained_with: str, name: str) -> str:
    """The warning of a resumed run whose optim.name differs from its checkpoint's."""
    step = read_meta(checkpoint)["step"]
    return (
        f"warning: checkpoint {checkpoint} was trained with optim.name={trained_with}, this run uses "
        f"{name}: {trained_with}'s state cannot seed {name}'s, so {name} "
        f"starts with fresh state; the weights, step {step} and the schedule carry on"
    )
