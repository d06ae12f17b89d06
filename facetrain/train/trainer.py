"""`facetrain train`: the backbone in DDP (or pipeline stages), the margin head sharded over ranks.

Read `_train_in_group` and then `Trainer.fit` from top to bottom: join the process group, resolve the
config once (the run holds that one object) and check it, build the run (`setup.build_training_run`:
data, model parts, optimizer, schedule, resumed state), then step until `train.steps`. Each step is
`train_step`; after it come the logging, verification and checkpointing that are due. `train` around
them destroys the group the run joined. Step figures stay on the device until a log, so the loop never
stalls the GPU.

Nothing a run did is lost to a fault it can survive. Before each step the ranks agree on whether to
stop (`step_gate`): a SIGTERM or SIGINT, or a data error on any rank, stops every rank at the same step
with a checkpoint written first. A failed verification is reported and training goes on. A rank whose
collective fails because another rank died names that rank in one line (`parallel/failures.py`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from facetrain import run_log
from facetrain.checkpoint import Checkpointer
from facetrain.config import to_dict
from facetrain.errors import EveryRankError, FacetrainError, PeerFailed
from facetrain.files import atomic_write_text, write_failure_advice
from facetrain.heads import collectives
from facetrain.heads.margins import margin_at_step
from facetrain.job_env import check_job_env, job_id
from facetrain.logger import LOG_ONLY, logger
from facetrain.parallel.dims import ParallelDims, destroy_parallel, init_parallel, is_initialized
from facetrain.parallel.failures import collective_failure_error, is_collective_failure
from facetrain.progress import ProgressBar as tqdm  # plain lines when not on a terminal
from facetrain.train.curves import CURVES_FILE, plot_curves, read_run_curves
from facetrain.train.device_defaults import DeviceDefaults, apply_device_defaults, resolve_device_defaults
from facetrain.train.evaluation import (
    TrainingVerifier,
    evaluation_line,
    replaces_best,
    report_lines,
    tensorboard_scalars,
)
from facetrain.train.metrics import MetricsLog, UnderfitWatch
from facetrain.train.resume import hold_global_batch
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from facetrain.train.setup import build_training_run
from facetrain.train.stage_groups import set_train_mode
from facetrain.train.startup import StartupClock
from facetrain.train.step import StepResult, StepWindow, check_finite_weights, train_step
from facetrain.train.step_gate import StepGate, StopSignals
from facetrain.train.trackers import check_installed


def train(cfg: Config, resume: str | None = None) -> dict:
    """Train with the config; `resume` is None, "auto" or a checkpoint path. Returns the summary.

    A caller that set up the process group keeps it; otherwise the run joins one and destroys it
    before returning or raising, once nothing of the run refers to it any more (`destroy_parallel`).
    """
    if is_initialized():
        return _train_in_group(cfg, resume)
    try:
        return _train_in_group(cfg, resume)
    except BaseException as error:
        if is_initialized():  # the run's modules hold the groups, the traceback's frames the run
            _drop_frame_locals(error)
        raise
    finally:
        destroy_parallel()


def _drop_frame_locals(error: BaseException | None) -> None:
    """Clear the locals of the frames an exception and its causes hold; their code and line numbers,
    all a traceback prints, stay."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _train_in_group(cfg: Config, resume: str | None) -> dict:
    startup = StartupClock()
    dims = init_parallel(cfg.parallel.pipeline_stages, cfg.parallel.backend, cfg.parallel.timeout_s)
    trainer = None
    device_defaults = resolve_run_config(cfg, dims)
    checkpointer = Checkpointer(Path(cfg.train.output_dir), dims, cfg.checkpoint)
    try:
        try:
            validate(cfg, dims.world_size, device_type=dims.device.type)
            check_job_env()
            check_installed(cfg.train.trackers)
        except FacetrainError as error:  # every rank sees the same config: one of them says so
            raise EveryRankError(str(error)) from None
        trainer = Trainer(cfg, dims, resume, device_defaults, checkpointer)
        resumed = trainer.resumed_from
        started = f"resumed from {resumed} at step {trainer.state.step}" if resumed else "started"
        run_log.attach(trainer.run_dir, run_log.start_header(started, dims.world_size))
        return trainer.fit(startup)
    except OSError as error:  # the disk filled up, or the output folder became unwritable
        raise _logged(
            FacetrainError(
                f"cannot write {error.filename or cfg.train.output_dir}: {error.strerror or error}; the "
                f"checkpoints written so far are intact: {write_failure_advice(error)}, then resume with "
                "--resume auto"
            )
        ) from None
    except Exception as error:
        if dims.world_size > 1 and is_collective_failure(error):
            step = trainer.state.step if trainer is not None else None
            raise _logged(collective_failure_error(error, dims.rank, dims.world_size, step)) from error
        _logged(error)
        raise
    finally:
        run_log.detach()
        checkpointer.close()


def resolve_run_config(cfg: Config, dims: ParallelDims) -> DeviceDefaults:
    """Resolve, in place and once, what the config leaves to the run: the gradient accumulation that
    holds train.global_batch on this world size, and the device's defaults (whose process-wide switches
    are set here, before the first GEMM). From here on the run, its saved config.yaml and its
    checkpoints hold this one config object."""
    hold_global_batch(cfg, dims.dp)
    device_defaults = resolve_device_defaults(dims.device.type, cfg)
    apply_device_defaults(device_defaults, cfg)
    return device_defaults


def _logged(error: Exception) -> Exception:
    """`error`, written to the run's log first by the rank it belongs to (a bystander's `PeerFailed`
    and the other ranks' copies of an every-rank error are not)."""
    if isinstance(error, PeerFailed) or (
        isinstance(error, EveryRankError) and os.environ.get("RANK", "0") != "0"
    ):
        return error
    if isinstance(error, FacetrainError):
        logger.error(f"error: {error}", extra=LOG_ONLY)  # the console gets it from the command
    else:
        logger.error(f"error: {type(error).__name__}: {error} (its traceback is on stderr)", extra=LOG_ONLY)
    return error


class Trainer:
    """One rank's run: the model parts with their optimizer (`parts`, what `train_step` takes), the data,
    the schedule, the weight average, the verifier, and the `checkpointer` that restored it and saves it.

    It owns where the run is (`state`, a `TrainState`: the `Stateful` the checkpointer keeps in each
    checkpoint's meta.json, torchtitan's train state) and moves it on step by step."""

    def __init__(
        self,
        cfg: Config,
        dims: ParallelDims,
        resume: str | None,
        device_defaults: DeviceDefaults,
        checkpointer: Checkpointer,
    ):
        run = build_training_run(cfg, dims, resume, device_defaults, checkpointer)
        self.cfg, self.dims, self.run_dir, self.data = cfg, dims, run.run_dir, run.data
        self.backbone, self.parts, self.scheduler = run.backbone, run.parts, run.scheduler
        self.state, self.resumed_from = run.state, run.resumed_from
        self.verifier = TrainingVerifier(cfg, dims) if cfg.eval.pairs and not dims.pp_enabled else None
        self.ema, self.checkpointer = run.ema, checkpointer
        self.evaluation: dict = {}
        self.stop_seconds: float | None = None  # from the stop signal to the last checkpoint, on this rank
        self.evaluation_failure: str | None = None
        self.global_batch = cfg.train.batch_size * dims.dp  # images per micro-step over all replicas
        self.full_margin = None if self.parts.head is None else self.parts.head.margin  # margin warmup's goal
        # (step, checkpoint) of each checkpoint with finite weights: the resumed one and those written
        self.finite_checkpoints = [(self.state.step, str(self.resumed_from))] if self.resumed_from else []

    @property
    def last_checkpoint(self) -> str | None:
        last = self.checkpointer.last
        return None if last is None else str(last)

    def good_before(self, step: int) -> str | None:
        """The newest checkpoint whose weights are finite and come from before `step`: a good one, when
        the weights of `step` are the first that are not (or give a non-finite loss)."""
        return next((path for saved, path in reversed(self.finite_checkpoints) if saved < step), None)

    def fit(self, startup: StartupClock) -> dict:
        """Train until train.steps or a stop; `startup`, started with the run, times its first step."""
        cfg, dims, state = self.cfg, self.dims, self.state
        log = MetricsLog(self.run_dir, dims.is_primary, cfg.train.trackers, to_dict(cfg))
        checkpointer = self.checkpointer
        gate = StepGate(self._batches(), cfg.optim.grad_accumulation, state, dims, checkpointer.clock)
        progress = tqdm(
            total=cfg.train.steps, initial=state.step, desc="train", unit="step", disable=not dims.is_primary
        )
        tolerated = cfg.train.max_nonfinite_steps if self.parts.scaler.is_enabled() else 0
        window = StepWindow(dims.device)
        underfit = UnderfitWatch(cfg.train.steps, self.data.dataset.num_classes, cfg.optim.warmup_steps)
        started = time.perf_counter()
        signals = StopSignals().install()
        try:
            if self.verifies_its_start() and self.verify_if_due(False, log, at_start=True):
                self.save(is_best=True, final_step=False)  # best/ holds the start until a step beats it
            startup.setup_done()
            while state.step < cfg.train.steps and (step_batches := gate.next_step(signals)) is not None:
                startup.batches_ready()
                lr = self.scheduler.get_last_lr()[0]
                result = self.take_step(step_batches)
                if startup.step_done(dims.device) and dims.is_primary:
                    logger.info(startup.line())
                progress.update(1)
                window.add(result, state.step)

                final_step = state.step == cfg.train.steps
                if state.step % cfg.train.log_every == 0 or final_step:
                    window.check_finite(tolerated, self.good_before)
                    row = self._log_row(window, lr, time.perf_counter() - started)
                    log.log(row)
                    warning = underfit.check(state.step, row["accuracy"])
                    if warning and dims.is_primary:
                        logger.warning(warning)
                    progress.set_postfix(
                        loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.3f}", lr=f"{lr:.2e}",
                        img_s=f"{row['images_per_s']:.0f}",
                    )  # fmt: skip
                    window.reset()
                is_best = self.verify_if_due(final_step, log)
                if checkpointer.due(state.step, final_step, is_best, gate.checkpoint_due):
                    window.check_finite(tolerated, self.good_before)  # never save a diverged model
                    self.save(is_best, final_step)
            if gate.stopped and checkpointer.due_on_stop(state.step):
                window.check_finite(tolerated, self.good_before)
                self.save(is_best=False, final_step=False)
            if gate.stop_signal is not None:
                self.stop_seconds = (
                    None if signals.received_at is None else time.monotonic() - signals.received_at
                )
        finally:
            signals.restore()
            progress.close()
            log.close()
        if gate.data_failed:
            raise _data_failure(gate, state.step, self.last_checkpoint)
        return self._finish(gate, time.perf_counter() - started, startup.parts)

    def take_step(self, step_batches: list) -> StepResult:
        """One optimizer step at `state.step`: the backbone frozen for optim.head_only_steps, the margin
        warmed up, then the schedule, the weight average and the step counter move on."""
        cfg, state, head = self.cfg, self.state, self.parts.head
        train_backbone = state.step >= cfg.optim.head_only_steps
        # a frozen backbone (or frozen stage, optim.freeze_stages) keeps its batch-norm statistics too
        set_train_mode(self.backbone, train_backbone)
        if head is not None and cfg.head.margin_warmup_steps:
            head.margin = margin_at_step(self.full_margin, state.step, cfg.head.margin_warmup_steps)
        result = train_step(iter(step_batches), self.parts, train_backbone)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.backbone)
        state.step += 1
        return result

    def verifies_its_start(self) -> bool:
        """A fine-tune (`model.init`) with `eval.pairs` verifies its starting model at step 0, so the run
        shows what it adds to it and `best/` never holds a model worse than the start."""
        return self.verifier is not None and bool(self.cfg.model.init) and self.resumed_from is None

    def verify_if_due(self, final_step: bool, log: MetricsLog, at_start: bool = False) -> bool:
        """Verify when `eval.every` says so (and at the end, and a fine-tune's start with `at_start`). True
        when this is the best step yet."""
        state, every = self.state, self.cfg.eval.every
        due = at_start or (every and state.step % every == 0) or final_step
        if self.verifier is None or not due:
            return False
        outcome = self.verifier.run(self.backbone if self.ema is None else self.ema.module, state.step)
        if outcome is None:  # reported; training goes on without verification
            self.evaluation_failure, self.verifier = self.verifier.failure, None
            return False
        self.evaluation = outcome
        log.log_eval(state.step, {**outcome, **tensorboard_scalars(outcome)})
        if self.dims.is_primary:
            for line in report_lines(outcome, self.verifier.best_by):
                logger.info(line)
        if state.best_accuracy is not None and not replaces_best(
            outcome["accuracy"], state.best_accuracy, self.cfg.eval.best_min_gain
        ):
            return False
        state.best_accuracy, state.best_step = outcome["accuracy"], state.step
        return True

    def save(self, is_best: bool, final_step: bool) -> None:
        """A collective save on every rank (keeping the best checkpoint is one too), of finite weights only."""
        parts, step = self.parts, self.state.step
        check_finite_weights([self.backbone, parts.head], step, self.good_before, self.dims.control_group)
        saved = self.checkpointer.save(is_best, evaluation=self.evaluation if is_best or final_step else None)
        self.finite_checkpoints.append((step, str(saved)))

    def _finish(self, gate: StepGate, train_seconds: float, startup: dict[str, float] | None) -> dict:
        """Write the summary and the curves; a verification that failed on the way fails the command now,
        after every checkpoint is written."""
        state, dims = self.state, self.dims
        summary = {
            "steps": state.step,
            "stopped_by": gate.stop_signal.name if gate.stop_signal else None,
            "world_size": dims.world_size,
            "num_classes": self.data.dataset.num_classes,
            "last_checkpoint": self.last_checkpoint,
            "best_accuracy": state.best_accuracy,
            "best_step": state.best_step,
            "evaluation": self.evaluation,
            "train_seconds": train_seconds,
            "startup_s": startup,  # to the first step's end, in parts (`facetrain.train.startup`)
            "stop_to_checkpoint_s": self.stop_seconds,
            "slurm_job_id": job_id("SLURM_JOB_ID"),
        }
        if dims.is_primary:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
            # none when metrics.csv could not be written at all (MetricsLog said so then)
            recorded = (self.run_dir / "metrics.csv").is_file()
            curves = (
                plot_curves([read_run_curves(self.run_dir)], self.run_dir / CURVES_FILE) if recorded else None
            )
            if gate.stop_signal is not None:
                took = "" if self.stop_seconds is None else f", {self.stop_seconds:.1f} s after the signal"
                logger.info(
                    f"stop: {gate.stop_signal.name} at step {state.step}; checkpoint {self.last_checkpoint}{took}",
                    extra=LOG_ONLY,
                )
            else:
                verified = ""
                if self.evaluation:
                    verified = f"; last {evaluation_line(state.step, self.evaluation)}"
                    if state.best_step is not None and state.best_step != state.step:
                        verified += f"; best {100 * state.best_accuracy:.1f} % at step {state.best_step}"
                    if state.best_step == 0 and self.cfg.model.init:
                        verified += (
                            " (the starting model, model.init: no step beat it, and best/ keeps it; "
                            "try a lower lr for the backbone, optim.backbone_lr_scale, more head_only_steps, "
                            "or frozen early stages, optim.freeze_stages and optim.layer_decay)"
                        )
                drawn = "" if curves is None else f", curves in {curves}"
                logger.info(
                    f"done: {state.step} steps{verified}; checkpoints in {self.run_dir / 'checkpoints'}{drawn}"
                )
                if self.verifier is not None and (table := self.verifier.final_table()) is not None:
                    logger.info(table)
        if self.evaluation_failure is not None:
            raise EveryRankError(
                f"{self.evaluation_failure}; training itself finished and its checkpoints are in "
                f"{self.run_dir / 'checkpoints'}: fix eval.pairs, then run facetrain eval on the checkpoint"
            )
        return summary

    def _log_row(self, window: StepWindow, lr: float, elapsed_s: float) -> dict:
        loss, accuracy = (window.sums / max(window.steps, 1)).tolist()
        seconds = max(time.perf_counter() - window.started, 1e-9)
        images = window.steps * self.cfg.optim.grad_accumulation * self.global_batch
        return {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "loss": loss,
            "accuracy": accuracy,
            "lr": lr,
            "images_per_s": images / seconds,
            "elapsed_s": elapsed_s,
        }

    def _batches(self) -> Iterator:
        """Batches forever, epoch after epoch, keeping the state at the exact sample position."""
        state, dataset, control = self.state, self.data.dataset, self.dims.control_group
        while True:
            self.data.sampler.set_epoch(state.epoch, state.consumed)
            for batch in self.data.loader:  # (images, labels[, sample indices: loss.teacher_cache])
                state.consumed += self.global_batch
                yield batch
            if state.consumed == 0:  # not one batch this epoch, nor before a resume within it
                raise EveryRankError(
                    "the training set gives no full batch per rank; lower train.batch_size or add images"
                )
            if dataset.skip_bad_images:  # every rank ends the epoch at the same batch: count them all
                skipped = torch.tensor([dataset.bad_images], device=collectives.collective_device(control))
                total = int(collectives.all_reduce_(skipped, "sum", control))
                if total and self.dims.is_primary:
                    logger.warning(
                        f"epoch {state.epoch}: skipped {total} unreadable images (data.skip_bad_images)"
                    )
            dataset.reset_bad_images()
            state.epoch += 1
            state.consumed = 0


def _data_failure(gate: StepGate, step: int, last_checkpoint: str | None) -> FacetrainError:
    """The rank whose data failed says why, naming the step; the others stop quietly."""
    if gate.data_error is None:
        return PeerFailed("another rank could not read its data")
    saved = f"checkpoint {last_checkpoint} holds steps 1-{step}" if last_checkpoint else "no step was taken"
    return type(gate.data_error)(
        f"step {step + 1}: {gate.data_error}; {saved}: fix the data, then resume with --resume auto"
    )
