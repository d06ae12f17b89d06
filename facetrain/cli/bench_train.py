"""`facetrain bench train`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.train.run."""

from __future__ import annotations

import click

from facetrain.choices import TRAIN_PRECISIONS
from facetrain.cli.bench_options import device_option


@click.command("train")
@click.option("--classes", type=click.IntRange(min=2), default=100_000, show_default=True)
@click.option("--world-size", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--backbone", default="small", show_default=True, help="A registered backbone.")
@click.option("--image-size", type=click.IntRange(min=16), default=112, show_default=True)
@click.option("--dim", type=click.IntRange(min=1), default=512, show_default=True, help="Embedding size.")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True, help="Images per rank.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option(
    "--heads",
    default="sharded,replicated",
    show_default=True,
    help="Classifiers to time, in order: sharded (untiled), tiled (with its fused SGD), replicated, linear "
    "(plain nn.Linear, --linear-classes).",
)
@click.option("--linear-classes", type=click.IntRange(min=2), default=1000, show_default=True)
@click.option(
    "--precision",
    type=click.Choice(TRAIN_PRECISIONS),
    default="fp32",
    show_default=True,
    help="As train.precision: auto is bf16 where the device computes bf16 natively, else fp32.",
)
@click.option("--channels-last", is_flag=True, help="Backbone and images in channels_last.")
@click.option(
    "--compile",
    "compile_backbone",
    is_flag=True,
    help="torch.compile the backbone (model.compile); compiling happens in the warm-up steps.",
)
@click.option(
    "--from-folder",
    type=click.Path(file_okay=False),
    help="Also run `facetrain train` of the margin heads on this image folder (root/<identity>/<image>) and "
    "report its images/s beside the compute step's; the folder's identities become every row's classes.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Loader workers a rank for --from-folder (data.num_workers).",
)
@click.option("-o", "--out", type=click.Path(file_okay=False), default="runs/bench/train", show_default=True)
@device_option("Where the ranks run; cuda: rank r on GPU r modulo the GPUs, nccl when each has its own.")
def train_command(**options) -> None:
    """End-to-end training images/s, MFU and per-rank peak memory: sharded head vs DDP-replicated full FC.

    Targets (C = 100k, 2 ranks): the sharded head reaches >= 1.5x the images/s of the replicated FC at
    <= 0.6x its per-rank peak memory (on the CPU peak RSS growth of each rank's process over the run,
    on CUDA the peak of the GPU's allocated bytes). With the linear head too: the sharded head's step
    is at most 15 % longer than the backbone's under a plain linear classifier. MFU: the FLOPs of an
    image (torch's FlopCounterMode) times images/s, over a GEMM peak measured on the same device. With
    --from-folder: `facetrain train` from the images on disk reaches >= 95 % of the compute step's
    images/s, no log window below 90 %.

    \b
    Examples:
      facetrain bench train
      facetrain bench train --classes 1000000 --backbone r18 --batch 32
      facetrain bench train --device cuda --world-size 1 --backbone r50 --batch 256 --precision bf16 \\
          --channels-last --classes 2000000 --heads sharded,linear
      facetrain bench train --device cuda --world-size 1 --backbone r50 --batch 256 --precision bf16 \\
          --channels-last --heads tiled --from-folder /data/jpeg_faces --workers 16
    """
    from facetrain.bench.train import run

    run(**options)
