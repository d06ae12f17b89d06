"""`facetrain train`: the backbone in DDP (or pipeline stages), the margin head sharded over ranks.

Read `train` from top to bottom: join the process group, check the config, build the run
(`setup.build_training_run`), then step until `train.steps`. Each step is `train_step`; after it come
the logging, verification and checkpointing that are due. Step figures stay on the device and are
read once per log interval, so the loop never stalls the GPU between logs.

Nothing a run did is lost to a fault it can survive. Before each step the ranks agree on whether to
stop (`step_gate`): a SIGTERM or SIGINT, or a data error on any rank, stops every rank at the same step
with a checkpoint written first. A failed verification is reported and training goes on. A rank whose
collective fails because another rank died names that rank in one line (`parallel/failures.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from facetrain import run_lock
from facetrain.checkpoint import TrainState, load_ema_weights, save_checkpoint
from facetrain.config import Config
from facetrain.config.validate import validate
from facetrain.errors import EveryRankError, FacetrainError, PeerFailed
from facetrain.heads.margins import margin_at_step
from facetrain.parallel import comm
from facetrain.parallel.dims import destroy_parallel, init_parallel, is_initialized
from facetrain.parallel.failures import collective_failure_error, is_collective_failure
from facetrain.progress import ProgressBar as tqdm  # plain lines when not on a terminal
from facetrain.train.curves import write_run_curves
from facetrain.train.elastic import hold_global_batch
from facetrain.train.ema import WeightEma
from facetrain.train.evaluation import TrainingVerifier
from facetrain.train.metrics_log import MetricsLog
from facetrain.train.notices import UnderfitWatch, evaluation_line
from facetrain.train.setup import TrainingRun, build_training_run
from facetrain.train.step import train_step
from facetrain.train.step_gate import StepGate, StopSignals
from facetrain.train.step_window import StepWindow


@record  # every rank's entry point: an error other than a user error leaves its traceback for torchrun
def train(cfg: Config, resume: str | None = None) -> dict:
    """Train with the config; `resume` is None, "auto" or a checkpoint path. Returns the summary."""
    owns_group = not is_initialized()  # a caller that set up the group keeps it
    dims = init_parallel(cfg.parallel.pipeline_stages, cfg.parallel.backend, cfg.parallel.timeout_s)
    run = None
    cfg = hold_global_batch(cfg, dims.dp)
    try:
        try:
            validate(cfg, dims.world_size, device_type=dims.device.type)
        except FacetrainError as error:  # every rank sees the same config: one of them says so
            raise EveryRankError(str(error)) from None
        run = build_training_run(cfg, dims, resume)
        return _train(run)
    except OSError as error:  # the disk filled up, or the output folder became unwritable
        raise FacetrainError(
            f"cannot write {error.filename or cfg.train.output_dir}: {error.strerror or error}; the "
            "checkpoints written so far are intact: free space, then resume with --resume auto"
        ) from None
    except Exception as error:
        if dims.world_size > 1 and is_collective_failure(error):
            step = run.state.step if run is not None else None
            raise collective_failure_error(error, dims.rank, dims.world_size, step) from error
        raise
    finally:
        run_lock.release(cfg.train.output_dir)
        if owns_group:
            destroy_parallel()


def _train(run: TrainingRun) -> dict:
    cfg, dims, state = run.cfg, run.dims, run.state
    ledger = RunLedger(run)
    log = MetricsLog(run.run_dir, enabled=dims.is_primary)
    minutes = cfg.train.checkpoint_every_minutes
    gate = StepGate(
        _batches(run, state),
        run.step_settings.accumulation,
        state,
        dims,
        None if minutes is None else 60 * minutes,
    )
    progress = tqdm(
        total=cfg.train.steps, initial=state.step, desc="train", unit="step", disable=not dims.is_primary
    )
    tolerated = cfg.train.max_nonfinite_steps if run.scaler.is_enabled() else 0
    window = StepWindow(dims.device)
    underfit = UnderfitWatch(cfg.train.steps, run.dataset.num_classes)
    full_margin = run.head.margin if run.head is not None else None
    started = time.perf_counter()
    signals = StopSignals().install()
    try:
        while state.step < cfg.train.steps:
            step_batches = gate.next_step(signals)
            if step_batches is None:
                break
            lr = run.scheduler.get_last_lr()[0]
            train_backbone = state.step >= cfg.optim.head_only_steps
            run.backbone.train(train_backbone)  # a frozen backbone keeps its batch-norm statistics too
            if run.head is not None and cfg.head.margin_warmup_steps:
                run.head.margin = margin_at_step(full_margin, state.step, cfg.head.margin_warmup_steps)
            result = train_step(
                iter(step_batches), run.model, run.head, run.optimizer, run.scaler, run.step_settings, run.pipeline,
                train_backbone, run.loss,
            )  # fmt: skip
            run.scheduler.step()
            if ledger.ema is not None:
                ledger.ema.update(run.backbone)
            state.step += 1
            progress.update(1)
            window.add(result, state.step)

            final_step = state.step == cfg.train.steps
            if state.step % cfg.train.log_every == 0 or final_step:
                window.check_finite(tolerated, ledger.last_checkpoint)
                row = _log_row(run, window, lr, time.perf_counter() - started)
                log.log(row)
                warning = underfit.check(state.step, row["accuracy"])
                if warning and dims.is_primary:
                    tqdm.write(warning)
                progress.set_postfix(
                    loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.3f}", lr=f"{lr:.2e}",
                    img_s=f"{row['images_per_s']:.0f}",
                )  # fmt: skip
                window.reset()
            is_best = ledger.verify_if_due(final_step, log)
            if state.step % cfg.train.checkpoint_every == 0 or final_step or is_best or gate.checkpoint_due:
                window.check_finite(tolerated, ledger.last_checkpoint)  # never save a diverged model
                ledger.save(is_best, final_step)
                gate.checkpoint_written()
        if gate.stopped and ledger.saved_step != state.step and state.step > 0:
            window.check_finite(tolerated, ledger.last_checkpoint)
            ledger.save(is_best=False, final_step=False)
    finally:
        signals.restore()
        progress.close()
        log.close()
    if gate.data_failed:
        raise _data_failure(gate, state.step, ledger.last_checkpoint)
    return _finish(run, gate, ledger, time.perf_counter() - started)


class RunLedger:
    """What the loop has verified and written so far: the latest verification, the last checkpoint.

    Every rank keeps one, because keeping the best checkpoint is a collective save."""

    def __init__(self, run: TrainingRun):
        self.run = run
        cfg, dims = run.cfg, run.dims
        self.verifier = TrainingVerifier(cfg, dims) if cfg.eval.pairs and not dims.pp_enabled else None
        self.ema = _weight_average(run)
        self.last_checkpoint = str(run.resumed_from) if run.resumed_from else None
        self.saved_step = run.state.step if run.resumed_from else None
        self.evaluation: dict = {}
        self.evaluation_failure: str | None = None

    def verify_if_due(self, final_step: bool, log: MetricsLog) -> bool:
        """Verify when `eval.every` says so (and at the end). True when this is the best step yet."""
        state, every = self.run.state, self.run.cfg.eval.every
        if self.verifier is None or not ((every and state.step % every == 0) or final_step):
            return False
        outcome = self.verifier.run(self.run.backbone if self.ema is None else self.ema.module, state.step)
        if outcome is None:  # reported; training goes on without verification
            self.evaluation_failure, self.verifier = self.verifier.failure, None
            return False
        self.evaluation = outcome
        log.log_eval(state.step, {**outcome, **self.verifier.tensorboard_scalars(outcome)})
        if self.run.dims.is_primary:
            for line in self.verifier.report_lines(outcome):
                tqdm.write(line)
        if state.best_accuracy is not None and outcome["accuracy"] <= state.best_accuracy:
            return False
        state.best_accuracy, state.best_step = outcome["accuracy"], state.step
        return True

    def save(self, is_best: bool, final_step: bool) -> None:
        run = self.run
        saved = save_checkpoint(
            run.run_dir,
            run.state,
            run.cfg,
            run.dims,
            run.backbone,
            run.head,
            run.optimizer,
            run.scaler,
            run.dataset.class_names,
            evaluation=self.evaluation if is_best or final_step else None,
            is_best=is_best,
            keep=run.cfg.train.keep_checkpoints,
            ema=None if self.ema is None else self.ema.module,
        )
        self.last_checkpoint, self.saved_step = str(saved), run.state.step


def _finish(run: TrainingRun, gate: StepGate, ledger: RunLedger, train_seconds: float) -> dict:
    """Write the summary and the curves; a verification that failed on the way fails the command now,
    after every checkpoint is written."""
    state, dims = run.state, run.dims
    summary = {
        "steps": state.step,
        "stopped_by": gate.stop_signal.name if gate.stop_signal else None,
        "world_size": dims.world_size,
        "num_classes": run.dataset.num_classes,
        "last_checkpoint": ledger.last_checkpoint,
        "best_accuracy": state.best_accuracy,
        "best_step": state.best_step,
        "evaluation": ledger.evaluation,
        "train_seconds": train_seconds,
    }
    if dims.is_primary:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        curves = write_run_curves(run.run_dir)
        if gate.stop_signal is None:
            verified = ""
            if ledger.evaluation:
                verified = f"; last {evaluation_line(state.step, ledger.evaluation)}"
                if state.best_step is not None and state.best_step != state.step:
                    verified += f"; best {100 * state.best_accuracy:.1f} % at step {state.best_step}"
            tqdm.write(
                f"done: {state.step} steps{verified}; checkpoints in {run.run_dir / 'checkpoints'}, "
                f"curves in {curves}"
            )
            table = ledger.verifier.final_table() if ledger.verifier is not None else None
            if table is not None:
                tqdm.write(table)
    if ledger.evaluation_failure is not None:
        raise EveryRankError(
            f"{ledger.evaluation_failure}; training itself finished and its checkpoints are in "
            f"{run.run_dir / 'checkpoints'}: fix eval.pairs, then run facetrain eval on the checkpoint"
        )
    return summary


def _data_failure(gate: StepGate, step: int, last_checkpoint: str | None) -> FacetrainError:
    """The rank whose data failed says why, naming the step; the others stop quietly."""
    if gate.data_error is None:
        return PeerFailed("another rank could not read its data")
    saved = f"checkpoint {last_checkpoint} holds steps 1-{step}" if last_checkpoint else "no step was taken"
    return type(gate.data_error)(
        f"step {step + 1}: {gate.data_error}; {saved}: fix the data, then resume with --resume auto"
    )


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


def _weight_average(run: TrainingRun) -> WeightEma | None:
    """The backbone's weight average (model.ema_decay), continued from the checkpoint when resuming."""
    if run.cfg.model.ema_decay == 0:
        return None
    ema = WeightEma(run.backbone, run.cfg.model.ema_decay)
    if run.resumed_from is not None and load_ema_weights(run.resumed_from, ema.module):
        ema.updates = run.state.step
    return ema


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
        if dataset.skip_bad_images:  # every rank ends the epoch at the same batch: count them all
            skipped = torch.tensor(
                [dataset.bad_images], device=comm.collective_device(run.dims.control_group)
            )
            total = int(comm.all_reduce_(skipped, "sum", run.dims.control_group))
            if total and run.dims.is_primary:
                tqdm.write(f"epoch {state.epoch}: skipped {total} unreadable images (data.skip_bad_images)")
        dataset.reset_bad_images()
        state.epoch += 1
        state.consumed = 0
