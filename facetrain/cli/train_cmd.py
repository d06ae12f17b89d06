"""`facetrain train`."""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path

import click

from facetrain.cli.conventions import checked_output, config_option, quiet_option


@click.command()
@config_option
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
    checkpoint, eval and parallel; `facetrain config -c FILE` prints every key with its value, and a
    recipe is the place to start (`facetrain config --recipes`; demo: synthetic faces; laptop: your
    own photos; in a clone, configs/demo.yaml and configs/laptop.yaml are the same files).

    \b
    Examples:
      facetrain train -c demo --nproc 2
      facetrain train -c laptop -o runs/mine --set data.path=~/faces --nproc 2 -q
      facetrain train -c configs/ms1mv3_r100.yaml --set train.batch_size=64 --resume auto
      facetrain train -c configs/finetune_iresnet50.yaml --init runs/imported/ms1mv3_r50
      torchrun --nproc-per-node 8 -m facetrain train -c configs/ms1mv3_r100.yaml
      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m facetrain train -c configs/glint360k_r100.yaml
    """
    launching = nproc > 1 and "WORLD_SIZE" not in os.environ
    if launching:  # the launcher works on one thread, so that its ranks can be forked from it
        import torch

        torch.set_num_threads(1)
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
    # a bad config, or a path it names that is not there, fails here, once, before any rank starts
    source = config_source(config_path)
    validate(config, world_size=nproc if launching else None, source=source, given=given)
    from facetrain.job_env import check_job_env

    check_job_env()  # before any rank starts: the launcher would only say a rank exited
    if config_path is None and os.environ.get("RANK", "0") == "0":
        _say_what_the_defaults_do(config)
    resume_command = _resume_command(config_path, overrides, output_dir, nproc if launching else 1)
    # every rank's entry point: training under torch elastic's @record, reporting here
    from facetrain.train.rank import train_rank

    report = functools.partial(
        _say_how_to_resume, resume_command=resume_command, run_dir=config.train.output_dir
    )
    if launching:
        from facetrain.checkpoint.run_dir import check_run_dir_free
        from facetrain.parallel.launch import launch_local

        # a run another process holds is refused before any rank starts; the ranks check the folder and
        # find the checkpoint to resume from themselves, once (`facetrain.train.setup`)
        check_run_dir_free(Path(config.train.output_dir), resume)
        backend = config.parallel.backend  # more nccl ranks than GPUs are refused before any starts
        timeout_s = config.parallel.timeout_s
        code = launch_local(
            nproc, train_rank, config, resume, report, backend=backend, timeout_s=timeout_s, fork=True
        )
        _ignore_stop_signals()
        sys.exit(code)
    _defer_stop_signals()  # during start-up too
    try:
        train_rank(config, resume, report)
    finally:
        _ignore_stop_signals()


def _say_what_the_defaults_do(config) -> None:
    import torch

    from facetrain.cli.train_defaults import no_config_note

    click.echo(no_config_note(config, "cuda" if torch.cuda.is_available() else "cpu"))


def _defer_stop_signals() -> None:
    """A stop signal is caught from start-up on, so the training loop stops before its first step when
    one came while the config loaded (`facetrain.train.rank` keeps it caught for the rank's life)."""
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
