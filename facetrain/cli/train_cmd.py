"""`facetrain train`."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from facetrain.cli.conventions import checked_output, quiet_option


@click.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="YAML config file, e.g. configs/demo.yaml; without one, the defaults (r50, GPU-sized).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a config value (repeatable); `facetrain config` lists every key.",
)
@click.option(
    "--resume",
    metavar="auto|PATH",
    help="Continue a run: 'auto' takes the output dir's last whole checkpoint (or starts fresh if none).",
)
@click.option(
    "--init",
    "init",
    metavar="PATH",
    help="Start the backbone from this checkpoint, run or export directory (model.init); fresh head.",
)
@click.option(
    "-o",
    "--out",
    "output_dir",
    metavar="DIR",
    callback=checked_output,
    help="Run directory: checkpoints, logs, curves (train.output_dir; the same as --set train.output_dir=DIR).",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Start this many local ranks (gloo on CPU, nccl on GPUs). Not needed under torchrun.",
)
@quiet_option
def train(
    config_path: str | None,
    overrides: tuple[str, ...],
    resume: str | None,
    init: str | None,
    output_dir: str | None,
    nproc: int,
) -> None:
    """Train a backbone with the class-sharded margin-softmax head.

    Every rank holds 1/N of the class weights and the backbone is replicated with DDP. The resolved
    config is written to the run directory (-o) and into every checkpoint. SIGTERM, SIGUSR1 or Ctrl-C
    stops the run after the current step with a checkpoint, exit code 0, and prints the command that
    resumes it; under Slurm a requeued job resumes by itself (docs/cluster.md).

    Settings come from the config (-c) and --set, in sections data, model, head, loss, optim, train,
    eval and parallel; `facetrain config -c FILE` prints every key with its value, and a config in
    configs/ is the place to start (demo.yaml: synthetic faces; laptop.yaml: your own photos).

    \b
    Examples:
      facetrain train -c configs/demo.yaml --nproc 2
      facetrain train -c configs/laptop.yaml -o runs/mine --set data.path=~/faces --nproc 2 -q
      facetrain train -c configs/ms1mv3_r100.yaml --set train.batch_size=64 --resume auto
      facetrain train -c configs/finetune_iresnet50.yaml --init runs/imported/ms1mv3_r50
      torchrun --nproc-per-node 8 -m facetrain train -c configs/ms1mv3_r100.yaml
      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m facetrain train -c configs/glint360k_r100.yaml
    """
    from facetrain.config import config_source, override_origins
    from facetrain.train.run_checks import validate
    from facetrain.train.run_config import load_config

    options = {"model.init": ("--init", init), "train.output_dir": ("-o", output_dir)}
    given = override_origins(
        overrides, {key: name for key, (name, value) in options.items() if value is not None}
    )
    config = load_config(config_path, overrides)
    if init is not None:
        config.model.init = os.path.expanduser(init)
    if output_dir is not None:
        config.train.output_dir = os.path.expanduser(output_dir)
    launching = nproc > 1 and "WORLD_SIZE" not in os.environ
    # a bad config, or a path it names that is not there, fails here, once, before any rank starts
    source = config_source(config_path)
    validate(config, world_size=nproc if launching else None, source=source, given=given)
    if config_path is None and os.environ.get("RANK", "0") == "0":
        _say_what_the_defaults_do(config)
    resume_command = _resume_command(config_path, overrides, output_dir, nproc if launching else 1)
    if launching:
        from facetrain.parallel.launch import launch_local
        from facetrain.train.run_dir import check_run_dir_free

        # a run another process holds is refused before any rank starts; the ranks check the folder and
        # find the checkpoint to resume from themselves, once (`facetrain.train.setup`)
        check_run_dir_free(Path(config.train.output_dir))
        backend = config.parallel.backend  # more nccl ranks than GPUs are refused before any starts
        timeout_s = config.parallel.timeout_s
        code = launch_local(
            nproc, train_rank, config, resume, resume_command, backend=backend, timeout_s=timeout_s
        )
        _ignore_stop_signals()
        sys.exit(code)
    _defer_stop_signals()
    try:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank under torchrun's agent, which may be killed
            from facetrain.parallel.launcher_watch import run_watched

            timeout_s = config.parallel.timeout_s
            run_watched(_train_and_report, os.getppid(), timeout_s, config, resume, resume_command)
        else:
            _train_and_report(config, resume, resume_command)
    finally:
        _ignore_stop_signals()


def _say_what_the_defaults_do(config) -> None:
    import torch

    from facetrain.cli.train_defaults import no_config_note

    click.echo(no_config_note(config, "cuda" if torch.cuda.is_available() else "cpu"))


def _train_and_report(config, resume: str | None, resume_command: str) -> None:
    from facetrain.logger import warnings_beside_info
    from facetrain.train.trainer import train as run_training

    with warnings_beside_info():
        summary = run_training(config, resume)
    _say_how_to_resume(summary, resume_command, config.train.output_dir)


def train_rank(config, resume: str | None, resume_command: str) -> None:
    """One rank of a `--nproc` run: its share of the cores, training, and user errors as one line."""
    import torch

    from facetrain.cli.user_errors import report_user_error
    from facetrain.errors import FacetrainError
    from facetrain.logger import warnings_beside_info
    from facetrain.parallel.launch import local_threads
    from facetrain.train.trainer import train as run_training

    _defer_stop_signals()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(local_threads(int(os.environ["LOCAL_WORLD_SIZE"])))
    try:
        with warnings_beside_info():
            summary = run_training(config, resume)
    except FacetrainError as error:
        sys.exit(report_user_error(error))
    finally:
        _ignore_stop_signals()
    _say_how_to_resume(summary, resume_command, config.train.output_dir)


def _defer_stop_signals() -> None:
    """A stop signal is caught for the rank's whole life, start-up included, and the training loop
    stops at its next step boundary (before the first step, when it came during start-up). A
    scheduler's stop may come at any moment; and under a launcher's agent, SIGTERM is how it stops the
    other ranks once one failed: caught, it lets this rank finish reporting why it stops instead of
    dying silently."""
    from facetrain.train.step_gate import StopSignals

    StopSignals().install()


def _ignore_stop_signals() -> None:
    """The run's work is done (`step_gate.ignore_stop_signals`): a late stop signal changes no exit code."""
    from facetrain.train.step_gate import ignore_stop_signals

    ignore_stop_signals()


def _resume_command(
    config_path: str | None, overrides: tuple[str, ...], output_dir: str | None, nproc: int
) -> str:
    """The command that continues this run (what was typed, with --resume auto)."""
    words = ["facetrain", "train"]
    if config_path:
        words += ["-c", config_path]
    for override in overrides:
        words += ["--set", override]
    if output_dir is not None:
        words += ["-o", output_dir]
    if nproc > 1:
        words += ["--nproc", str(nproc)]
    command = shlex.join([*words, "--resume", "auto"])
    if "TORCHELASTIC_RUN_ID" in os.environ and nproc == 1:  # started by torchrun, options unknown here
        command = command.replace("facetrain train", "torchrun [same options] -m facetrain train", 1)
    return command


def _say_how_to_resume(summary: dict, resume_command: str, run_dir: str) -> None:
    if summary.get("stopped_by") and os.environ.get("RANK", "0") == "0":
        from facetrain import run_log

        line = f"stopped at step {summary['steps']} by {summary['stopped_by']}; resume with: {resume_command}"
        click.echo(line)
        run_log.append(Path(run_dir), line)
