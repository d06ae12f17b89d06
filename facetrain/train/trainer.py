"""`facetrain train`: the backbone in DDP (or pipeline stages), the margin head sharded over ranks.

Read `train` from top to bottom: join the process group, check the config, build the run
(`setup.build_training_run`), then step until `train.steps`. Each step is `train_step`; after it come
the logging, verification and checkpointing that are due. Step figures stay on the device and are
read once per log interval, so the loop never stalls the GPU between logs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from facetrain.config import Config
from facetrain.config.validate import validate
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.parallel.dims import destroy_parallel, init_parallel, is_initialized
from facetrain.train.checkpoint import TrainState, save_checkpoint
from facetrain.train.evaluation import TrainingVerifier
from facetrain.train.metrics_log import MetricsLog
from facetrain.train.setup import TrainingRun, build_training_run
from facetrain.train.step import StepResult, train_step


def train(cfg: Config, resume: str | None = None) -> dict:
    """Train with the config; `resume` is None, "auto" or a checkpoint path. Returns the summary."""
    owns_group = not is_initialized()  # a caller that set up the group keeps it
    dims = init_parallel(cfg.parallel.pipeline_stages, cfg.parallel.backend, cfg.parallel.timeout_s)
    try:
        try:
            validate(cfg, dims.world_size, device_type=dims.device.type)
        except FacetrainError as error:  # every rank sees the same config: one of them says so
            raise EveryRankError(str(error)) from None
        run = build_training_run(cfg, dims, resume)
        return _train(run)
    finally:
        if owns_group:
            destroy_parallel()


@dataclass
class StepWindow:
    """Step figures since the last log, summed on the device, plus a watch for non-finite losses."""

    device: torch.device
    steps: int = 0
    started: float = field(default_factory=time.perf_counter)
    sums: torch.Tensor | None = None
    nonfinite_in_a_row: torch.Tensor | None = None
    worst_nonfinite_run: torch.Tensor | None = None
    first_nonfinite_step: torch.Tensor | None = None

    def __post_init__(self):
        self.sums = torch.zeros(2, device=self.device)
        self.nonfinite_in_a_row = torch.zeros((), dtype=torch.int64, device=self.device)
        self.worst_nonfinite_run = torch.zeros_like(self.nonfinite_in_a_row)
        self.first_nonfinite_step = torch.full_like(self.nonfinite_in_a_row, -1)

    def add(self, result: StepResult, step: int) -> None:
        finite = torch.isfinite(result.loss)
        self.sums += torch.stack([result.loss, result.accuracy])
        self.nonfinite_in_a_row = torch.where(finite, 0, self.nonfinite_in_a_row + 1)
        self.worst_nonfinite_run = torch.maximum(self.worst_nonfinite_run, self.nonfinite_in_a_row)
        unseen = (~finite) & (self.first_nonfinite_step < 0)
        self.first_nonfinite_step = torch.where(unseen, step, self.first_nonfinite_step)
        self.steps += 1

    def check_finite(self, tolerated_in_a_row: int, last_checkpoint: str | None) -> None:
        """Stop when the loss went non-finite more often in a row than tolerated (fp16's scaler skips
        such steps and recovers; other precisions tolerate none). One host read."""
        worst, first = torch.stack([self.worst_nonfinite_run, self.first_nonfinite_step]).tolist()
        if worst > tolerated_in_a_row:
            raise EveryRankError(
                f"the loss became non-finite at step {first}; last good checkpoint: "
                f"{last_checkpoint or 'none'}; lower optim.lr or use train.precision=fp32"
            )

    def means(self) -> tuple[float, float]:
        loss, accuracy = (self.sums / max(self.steps, 1)).tolist()
        return loss, accuracy

    def reset(self) -> None:
        self.sums.zero_()
        self.steps = 0
        self.started = time.perf_counter()


def _train(run: TrainingRun) -> dict:
    cfg, dims, state = run.cfg, run.dims, run.state
    verifier = TrainingVerifier(cfg, dims) if cfg.eval.pairs and not dims.pp_enabled else None
    log = MetricsLog(run.run_dir, enabled=dims.is_primary)
    batches = _batches(run, state)
    progress = tqdm(
        total=cfg.train.steps, initial=state.step, desc="train", unit="step", disable=not dims.is_primary
    )
    tolerated = cfg.train.max_nonfinite_steps if run.scaler.is_enabled() else 0
    window = StepWindow(dims.device)
    last_checkpoint = str(run.resumed_from) if run.resumed_from else None
    evaluation: dict = {}
    started = time.perf_counter()
    run.backbone.train()
    try:
        while state.step < cfg.train.steps:
            lr = run.scheduler.get_last_lr()[0]
            result = train_step(
                batches, run.model, run.head, run.optimizer, run.scaler, run.step_settings, run.pipeline
            )
            run.scheduler.step()
            state.step += 1
            progress.update(1)
            window.add(result, state.step)

            final_step = state.step == cfg.train.steps
            if state.step % cfg.train.log_every == 0 or final_step:
                window.check_finite(tolerated, last_checkpoint)
                row = _log_row(run, window, lr, time.perf_counter() - started)
                log.log(row)
                progress.set_postfix(
                    loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.3f}", lr=f"{lr:.2e}",
                    img_s=f"{row['images_per_s']:.0f}",
                )  # fmt: skip
                window.reset()

            is_best = False
            if verifier is not None and ((cfg.eval.every and state.step % cfg.eval.every == 0) or final_step):
                evaluation = verifier.run(run.backbone, state.step)
                log.log_eval(state.step, evaluation)
                is_best = state.best_accuracy is None or evaluation["accuracy"] > state.best_accuracy
                if is_best:
                    state.best_accuracy, state.best_step = evaluation["accuracy"], state.step
            if state.step % cfg.train.checkpoint_every == 0 or final_step or is_best:
                window.check_finite(tolerated, last_checkpoint)  # never save a diverged model
                last_checkpoint = str(_save(run, evaluation if is_best or final_step else None, is_best))
    finally:
        progress.close()
        log.close()

    summary = {
        "steps": state.step,
        "world_size": dims.world_size,
        "num_classes": run.dataset.num_classes,
        "last_checkpoint": last_checkpoint,
        "best_accuracy": state.best_accuracy,
        "best_step": state.best_step,
        "evaluation": evaluation,
        "train_seconds": time.perf_counter() - started,
    }
    if dims.is_primary:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        tqdm.write(f"done: {state.step} steps; checkpoints in {run.run_dir / 'checkpoints'}")
    return summary


def _log_row(run: TrainingRun, window: StepWindow, lr: float, elapsed_s: float) -> dict:
    loss, accuracy = window.means()
    seconds = max(time.perf_counter() - window.started, 1e-9)
    images = window.steps * run.step_settings.accumulation * run.global_batch
    return {
        "step": run.state.step,
        "epoch": run.state.epoch,
        "loss": loss,
        "accuracy": accuracy,
        "lr": lr,
        "images_per_s": images / seconds,
        "elapsed_s": elapsed_s,
    }


def _save(run: TrainingRun, evaluation: dict | None, is_best: bool):
    return save_checkpoint(
        run.run_dir,
        run.state,
        run.cfg,
        run.dims,
        run.backbone,
        run.head,
        run.optimizer,
        run.scaler,
        run.dataset.class_names,
        evaluation=evaluation,
        is_best=is_best,
        keep=run.cfg.train.keep_checkpoints,
    )


def _batches(run: TrainingRun, state: TrainState) -> Iterator:
    """Batches forever, epoch after epoch, keeping `state` at the exact sample position."""
    dataset = run.dataset
    while True:
        run.sampler.set_epoch(state.epoch, state.consumed)
        yielded = False
        for images, labels in run.loader:
            state.consumed += run.global_batch
            yielded = True
            yield images, labels
        if not yielded and state.consumed == 0:
            raise EveryRankError(
                "the training set gives no full batch per rank; lower train.batch_size or add images"
            )
        if dataset.bad_images and run.dims.is_primary:
            tqdm.write(
                f"epoch {state.epoch}: skipped {dataset.bad_images} unreadable images on rank 0 "
                "(data.skip_bad_images)"
            )
        dataset.reset_bad_images()
        state.epoch += 1
        state.consumed = 0
