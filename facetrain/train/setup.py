"""Everything a training run needs, built once in a fixed order before the first step.

Data first (the primary rank first, so a generated dataset is written once), then the model with the
same initial weights on every rank, parallelized from outside, the sharded head over the last stage's
data-parallel group, the optimizer and schedule, and finally the state of a resumed run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from facetrain.checkpoints import latest_checkpoint, resolve_checkpoint
from facetrain.config import Config, save_config
from facetrain.data import build_train_dataset, build_train_loader
from facetrain.errors import EveryRankError
from facetrain.heads import ShardedMarginHead
from facetrain.models import build_backbone
from facetrain.parallel import comm
from facetrain.parallel.dims import ParallelDims
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.parallel.pipeline import PipelineRuntime
from facetrain.train.checkpoint import TrainState, load_checkpoint
from facetrain.train.optim import build_lr_scheduler, build_optimizer
from facetrain.train.step import StepSettings


@dataclass
class TrainingRun:
    cfg: Config
    dims: ParallelDims
    run_dir: Path
    dataset: torch.utils.data.Dataset
    loader: torch.utils.data.DataLoader
    sampler: torch.utils.data.Sampler
    backbone: nn.Module  # this rank's backbone (or pipeline stage), unwrapped
    model: nn.Module | None  # what the step calls without a pipeline (DDP or the backbone)
    pipeline: PipelineRuntime | None
    head: ShardedMarginHead | None  # None on pipeline stages before the last
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    step_settings: StepSettings
    state: TrainState
    resumed_from: Path | None

    @property
    def global_batch(self) -> int:
        """Images per micro-step over all data-parallel replicas."""
        return self.cfg.train.batch_size * self.dims.dp


def find_checkpoint_to_resume(run_dir: Path, resume: str | None) -> Path | None:
    """What to resume from, refusing to silently train over an earlier run's checkpoints."""
    if resume is None:
        if latest_checkpoint(run_dir) is not None:
            raise EveryRankError(
                f"{run_dir} already holds checkpoints; pass --resume auto to continue that run, "
                "or choose another train.output_dir"
            )
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    return resolve_checkpoint(resume)


def build_training_run(cfg: Config, dims: ParallelDims, resume: str | None) -> TrainingRun:
    run_dir = Path(cfg.train.output_dir)
    checkpoint = find_checkpoint_to_resume(run_dir, resume)
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if dims.is_primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")

    dataset = comm.primary_first(lambda: build_train_dataset(cfg.data))
    if dims.is_primary:
        (run_dir / "classes.json").write_text(json.dumps(dataset.class_names))

    # Same initial weights on every rank; the head is drawn the same whatever the world size.
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.model, tuple(cfg.data.image_size))
    batch_shape = (cfg.train.batch_size, 3, *cfg.data.image_size)
    local, model, pipeline = parallelize_backbone(backbone, dims, cfg.parallel, batch_shape)
    head = None
    if dims.is_last_stage:
        head = ShardedMarginHead(
            dataset.num_classes,
            cfg.model.embedding_size,
            margin=cfg.head.margin,
            scale=cfg.head.scale,
            sample_rate=cfg.head.sample_rate,
            group=dims.dp_group,
            **cfg.head.margin_params,
        )
        head.reset_parameters(seed=cfg.train.seed)
        head = head.to(dims.device)
    loader, sampler = build_train_loader(
        dataset, cfg.data, cfg.train.batch_size, dims.dp_rank, dims.dp, cfg.train.seed
    )
    optimizer = build_optimizer(cfg.optim, local, head)
    scaler = torch.amp.GradScaler(dims.device.type, enabled=cfg.train.precision == "fp16")
    torch.manual_seed(cfg.train.seed + 7919 * (dims.rank + 1))  # per-rank streams: dropout, Partial FC

    state = TrainState()
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, dims, local, head, optimizer, scaler)
        if dims.is_primary:
            tqdm.write(f"resumed from {checkpoint} at step {state.step}")
    scheduler = build_lr_scheduler(optimizer, cfg.optim, cfg.train.steps, start_step=state.step)
    step_settings = StepSettings(
        device=dims.device,
        precision=cfg.train.precision,
        accumulation=cfg.optim.grad_accumulation,
        grad_clip=cfg.optim.grad_clip,
        channels_last=cfg.model.channels_last,
    )
    return TrainingRun(
        cfg, dims, run_dir, dataset, loader, sampler, local, model, pipeline, head,
        optimizer, scheduler, scaler, step_settings, state, checkpoint,
    )  # fmt: skip
