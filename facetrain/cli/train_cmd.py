"""`facetrain train`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a config value (repeatable).",
)
@click.option(
    "--resume",
    metavar="auto|PATH",
    help="Continue a run: 'auto' takes the output dir's last checkpoint (or starts fresh if none).",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Start this many local ranks (gloo on CPU, nccl on GPUs). Not needed under torchrun.",
)
def train(config_path: str | None, overrides: tuple[str, ...], resume: str | None, nproc: int) -> None:
    """Train a backbone with the class-sharded margin-softmax head.

    Every rank holds 1/N of the class weights and the backbone is replicated with DDP. The resolved
    config is written to the run's output dir and into every checkpoint.

    \b
    Examples:
      facetrain train -c configs/demo.yaml --nproc 2
      facetrain train -c configs/ms1mv3_r100.yaml --set train.batch_size=64 --resume auto
      torchrun --nproc-per-node 8 -m facetrain train -c configs/ms1mv3_r100.yaml
      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m facetrain train -c configs/glint360k_r100.yaml
    """
    from facetrain.config import config_source, load_config, validate

    config = load_config(config_path, overrides)
    launching = nproc > 1 and "WORLD_SIZE" not in os.environ
    # a bad config fails here, once, before any rank starts
    validate(config, world_size=nproc if launching else None, source=config_source(config_path))
    if launching:
        from facetrain.parallel.launch import launch_local
        from facetrain.train.setup import find_checkpoint_to_resume

        find_checkpoint_to_resume(Path(config.train.output_dir), resume)
        sys.exit(launch_local(nproc, train_rank, config, resume))
    from facetrain.train.trainer import train as run_training

    run_training(config, resume)


def train_rank(config, resume: str | None) -> None:
    """One rank of a `--nproc` run: its share of the cores, training, and user errors as one line."""
    import torch

    from facetrain.cli import report_user_error
    from facetrain.errors import FacetrainError
    from facetrain.parallel.launch import local_threads
    from facetrain.train.trainer import train as run_training

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(local_threads(int(os.environ["LOCAL_WORLD_SIZE"])))
    try:
        run_training(config, resume)
    except FacetrainError as error:
        sys.exit(report_user_error(error))
