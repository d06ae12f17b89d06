"""`facetrain bench pipeline`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.pipeline.run."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.bench.pipeline_settings import DEFAULTS
from facetrain.cli.bench_options import device_option
from facetrain.cli.conventions import quiet_option


@click.command("pipeline")
@click.option(
    "--backbone", default=DEFAULTS.backbone, show_default=True, help="Registered backbone to split."
)
@click.option(
    "--image-size",
    default=DEFAULTS.image_size,
    show_default=True,
    type=click.IntRange(min=8),
    help="Square input side.",
)
@click.option(
    "--batch-size",
    default=DEFAULTS.batch_size,
    show_default=True,
    type=click.IntRange(min=1),
    help="Images per step.",
)
@click.option(
    "--embedding-size",
    default=DEFAULTS.embedding_size,
    show_default=True,
    type=click.IntRange(min=1),
    help="Embedding width D of the backbone.",
)
@click.option(
    "--classes",
    default=DEFAULTS.classes,
    show_default=True,
    type=click.IntRange(min=2),
    help="Classes of the margin head on the last stage.",
)
@click.option(
    "--stages",
    default=DEFAULTS.stages,
    show_default=True,
    type=click.IntRange(min=2),
    help="Stage processes.",
)
@click.option(
    "--microbatches",
    default=DEFAULTS.microbatches,
    show_default=True,
    type=click.IntRange(min=2),
    help="For the pipelined bar.",
)
@click.option(
    "--split-sizes",
    default=",".join(map(str, DEFAULTS.split_sizes)),
    show_default=True,
    help="Micro-batch sizes to sweep.",
)
@click.option(
    "--schedule",
    type=click.Choice(["gpipe", "1f1b"]),
    default=DEFAULTS.schedule,
    show_default=True,
    help="Pipeline schedule of the pipelined runs.",
)
@click.option(
    "--split-at",
    default="",
    help="Modules where stages 2..S begin, comma-separated (e.g. layer3.5); default: balance by cost.",
)
@click.option(
    "--repeats",
    default=DEFAULTS.repeats,
    show_default=True,
    type=click.IntRange(min=1),
    help="Runs per setup.",
)
@click.option(
    "--steps",
    default=DEFAULTS.steps,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed steps per run.",
)
@click.option(
    "--warmup",
    default=DEFAULTS.warmup,
    show_default=True,
    type=click.IntRange(min=0),
    help="Untimed steps first.",
)
@click.option(
    "-o",
    "--out",
    default="runs/bench/pipeline",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for bench_pipeline.json, .md and the two plots.",
)
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
@device_option("Where the stages run; cuda: one GPU per stage (nccl), the single device on GPU 0.")
@quiet_option
def pipeline_command(**options) -> None:
    """Time single device, model parallel and pipelined training steps of a backbone, on CPU or GPUs.

    Each stage is a process with one thread; the single device runs once with one thread and once
    with as many threads as stages. Runs repeat (mean and std), and the micro-batch (split) size is
    swept. Writes JSON, a markdown table, a bar chart and a time-versus-split-size plot to --out.

    \b
    Examples:
      facetrain bench pipeline
      facetrain bench pipeline --backbone r18 --image-size 32 --batch-size 16 --split-sizes 8,4,2
      facetrain bench pipeline --microbatches 8 --split-sizes 32,16,8,4 --repeats 5 --overwrite
      facetrain bench pipeline --split-at layer3.5 --out runs/bench/pipeline-fixed-cut
      facetrain bench pipeline --device cuda --backbone r50 --image-size 112 --batch-size 128
    """
    from facetrain.bench.pipeline import run

    run(**options)
