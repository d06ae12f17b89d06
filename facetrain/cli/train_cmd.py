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
    from facetrain.config import load_config
    from facetrain.heads.sharded import check_head_settings

    # a bad config fails here, once, before any rank starts
    config = load_config(config_path, overrides)
    check_head_settings(
        config.head.margin, config.head.scale, config.head.sample_rate, config.head.margin_params
    )
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        from facetrain.parallel.launch import launch_local
        from facetrain.train.strategy import check_strategy_settings
        from facetrain.train.trainer import find_checkpoint_to_resume

        check_strategy_settings(config, nproc)
        find_checkpoint_to_resume(Path(config.train.output_dir), resume)

        argv = ["train", *(["-c", config_path] if config_path else [])]
        argv += [arg for override in overrides for arg in ("--set", override)]
        argv += ["--resume", resume] if resume else []
        sys.exit(launch_local(nproc, argv))

    from facetrain.train.trainer import train as run_training

    run_training(config, resume)
