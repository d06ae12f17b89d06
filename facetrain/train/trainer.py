"""`facetrain train`: the backbone in DDP, the margin head sharded over all ranks, one loop.

Read `train` from top to bottom: set up the process group, data, model, head and optimizer, resume if
asked, then step until `train.steps`, logging, verifying and checkpointing on the way.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from facetrain.config import Config, save_config
from facetrain.data import build_train_dataset, build_train_loader
from facetrain.errors import EveryRankError
from facetrain.heads import ShardedMarginHead
from facetrain.models import build_backbone
from facetrain.parallel import comm
from facetrain.parallel.env import destroy_distributed, init_distributed, is_initialized
from facetrain.train.checkpoint import (
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from facetrain.train.metrics_log import MetricsLog
from facetrain.train.optim import build_optimizer, learning_rate, set_learning_rate
from facetrain.train.strategy import build_strategy, check_strategy_settings
from facetrain.train.verification import Verifier

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def train(cfg: Config, resume: str | None = None) -> dict:
    """Train with the config; `resume` is None, "auto" or a checkpoint path. Returns the summary."""
    owns_group = not is_initialized()  # a caller that set up the group keeps it
    env = init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)
    try:
        return _train(cfg, resume, env)
    finally:
        if owns_group:
            destroy_distributed()


def _train(cfg: Config, resume: str | None, env) -> dict:
    run_dir = Path(cfg.train.output_dir)
    checkpoint_to_resume = find_checkpoint_to_resume(run_dir, resume)
    autocast_dtype = _autocast_dtype(cfg.train.precision, env.device)
    check_strategy_settings(cfg, env.world_size)
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if env.is_primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")

    # Data. The primary rank goes first, so a synthetic set is generated once, not by every rank.
    dataset = comm.primary_first(lambda: build_train_dataset(cfg.data))
    if env.is_primary:
        (run_dir / "classes.json").write_text(json.dumps(dataset.class_names))

    # Model: same initial weights on every rank; the head is drawn the same whatever the world size.
    # The strategy spreads the backbone: DDP replicas, or pipeline stages x replicas.
    torch.manual_seed(cfg.train.seed)
    backbone = build_backbone(cfg.model, tuple(cfg.data.image_size)).to(env.device)
    memory_format = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
    backbone = backbone.to(memory_format=memory_format)
    strategy = build_strategy(backbone, cfg, env)
    backbone = strategy.backbone
    head = None
    if strategy.has_head:
        head = ShardedMarginHead(
            dataset.num_classes,
            cfg.model.embedding_size,
            margin=cfg.head.margin,
            scale=cfg.head.scale,
            sample_rate=cfg.head.sample_rate,
            group=strategy.head_group,
            **cfg.head.margin_params,
        )
        head.reset_parameters(seed=cfg.train.seed)
        head = head.to(env.device)
    loader, sampler = build_train_loader(
        dataset, cfg.data, cfg.train.batch_size, strategy.data_rank, strategy.data_world_size, cfg.train.seed
    )
    optimizer = build_optimizer(cfg.optim, backbone, head)
    scaler = torch.amp.GradScaler(env.device.type, enabled=cfg.train.precision == "fp16")
    torch.manual_seed(cfg.train.seed + 7919 * (env.rank + 1))  # per-rank streams: dropout, Partial FC

    state = TrainState()
    if checkpoint_to_resume is not None:
        state = load_checkpoint(checkpoint_to_resume, backbone, head, optimizer, scaler)
        if env.is_primary:
            tqdm.write(f"resumed from {checkpoint_to_resume} at step {state.step}")
    verifier = Verifier(cfg, env) if cfg.eval.pairs and strategy.verifies else None
    log = MetricsLog(run_dir, enabled=env.is_primary)

    accumulation = cfg.optim.grad_accumulation
    global_batch = cfg.train.batch_size * strategy.data_world_size
    batches = _batches(loader, sampler, state, global_batch, dataset, env.is_primary)
    progress = tqdm(
        total=cfg.train.steps, initial=state.step, desc="train", unit="step", disable=not env.is_primary
    )
    last_checkpoint = str(checkpoint_to_resume) if checkpoint_to_resume else None
    evaluation: dict = {}
    window_loss, window_accuracy, window_steps, window_start = 0.0, 0.0, 0, time.perf_counter()
    nonfinite_in_a_row = 0
    started = time.perf_counter()
    autocast = torch.autocast(env.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    backbone.train()
    try:
        while state.step < cfg.train.steps:
            lr = learning_rate(cfg.optim, state.step, cfg.train.steps)
            set_learning_rate(optimizer, lr)
            step_loss, step_accuracy = 0.0, 0.0
            for micro_step in range(accumulation):
                images, labels = next(batches)
                images = images.to(env.device, non_blocking=True, memory_format=memory_format)
                labels = labels.to(env.device, non_blocking=True)
                loss, accuracy = strategy.forward_backward(
                    images, labels, head, autocast, scaler, accumulation, micro_step == accumulation - 1
                )
                step_loss += loss.item() / accumulation
                step_accuracy += float(accuracy) / accumulation

            if not math.isfinite(step_loss):
                nonfinite_in_a_row += 1
                if not scaler.is_enabled() or nonfinite_in_a_row > cfg.train.max_nonfinite_steps:
                    raise EveryRankError(
                        f"the loss became {step_loss} at step {state.step + 1}; last good checkpoint: "
                        f"{last_checkpoint or 'none'}; lower optim.lr or use train.precision=fp32"
                    )
            else:
                nonfinite_in_a_row = 0
            scaler.unscale_(optimizer)
            if cfg.optim.grad_clip is not None:
                strategy.clip_grad_norm_(cfg.optim.grad_clip)
            scaler.step(optimizer)  # an fp16 step with non-finite gradients is skipped here
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            progress.update(1)

            window_loss += step_loss
            window_accuracy += step_accuracy
            window_steps += 1
            final_step = state.step == cfg.train.steps
            if state.step % cfg.train.log_every == 0 or final_step:
                elapsed = time.perf_counter() - window_start
                row = {
                    "step": state.step,
                    "epoch": state.epoch,
                    "loss": window_loss / window_steps,
                    "accuracy": window_accuracy / window_steps,
                    "lr": lr,
                    "images_per_s": window_steps * accumulation * global_batch / max(elapsed, 1e-9),
                    "elapsed_s": time.perf_counter() - started,
                }
                log.log(row)
                progress.set_postfix(
                    loss=f"{row['loss']:.3f}",
                    acc=f"{row['accuracy']:.3f}",
                    lr=f"{lr:.2e}",
                    img_s=f"{row['images_per_s']:.0f}",
                )
                window_loss, window_accuracy, window_steps = 0.0, 0.0, 0
                window_start = time.perf_counter()

            is_best = False
            if verifier is not None and ((cfg.eval.every and state.step % cfg.eval.every == 0) or final_step):
                evaluation = verifier.run(backbone, state.step)
                log.log_eval(state.step, evaluation)
                accuracy = evaluation["accuracy"]
                is_best = state.best_accuracy is None or accuracy > state.best_accuracy
                if is_best:
                    state.best_accuracy, state.best_step = accuracy, state.step
            if state.step % cfg.train.checkpoint_every == 0 or final_step or is_best:
                last_checkpoint = str(
                    save_checkpoint(
                        run_dir,
                        state,
                        cfg,
                        backbone,
                        head,
                        optimizer,
                        scaler,
                        dataset.class_names,
                        evaluation=evaluation if is_best or final_step else None,
                        is_best=is_best,
                        keep=cfg.train.keep_checkpoints,
                        writes_backbone=strategy.writes_backbone,
                    )
                )
    finally:
        progress.close()
        log.close()

    summary = {
        "steps": state.step,
        "world_size": env.world_size,
        "num_classes": dataset.num_classes,
        "last_checkpoint": last_checkpoint,
        "best_accuracy": state.best_accuracy,
        "best_step": state.best_step,
        "evaluation": evaluation,
        "train_seconds": time.perf_counter() - started,
    }
    if env.is_primary:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        tqdm.write(f"done: {state.step} steps; checkpoints in {run_dir / 'checkpoints'}")
    return summary


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


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision not in AUTOCAST_DTYPES:
        raise EveryRankError(f"train.precision must be fp32, bf16 or fp16, got {precision!r}")
    if precision == "fp16" and device.type != "cuda":
        raise EveryRankError("train.precision=fp16 needs CUDA; use bf16 on CPU")
    return AUTOCAST_DTYPES[precision]


def _batches(loader, sampler, state: TrainState, global_batch: int, dataset, is_primary: bool) -> Iterator:
    """Batches forever, epoch after epoch, keeping `state` at the exact sample position."""
    while True:
        sampler.set_epoch(state.epoch, state.consumed)
        yielded = False
        for images, labels in loader:
            state.consumed += global_batch
            yielded = True
            yield images, labels
        if not yielded and state.consumed == 0:
            raise EveryRankError(
                "the training set gives no full batch per rank; lower train.batch_size or add images"
            )
        if dataset.bad_images and is_primary:
            tqdm.write(
                f"epoch {state.epoch}: skipped {dataset.bad_images} unreadable images on rank 0 "
                "(data.skip_bad_images)"
            )
        dataset.reset_bad_images()
        state.epoch += 1
        state.consumed = 0
