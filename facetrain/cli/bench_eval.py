"""`facetrain bench eval`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.eval.run."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.bench_options import device_option
from facetrain.cli.conventions import quiet_option


@click.command("eval")
@click.option(
    "--backbone", default="r50", show_default=True, help="Backbone to embed with (model registry name)."
)
@click.option(
    "--image-size", type=click.IntRange(min=8), default=112, show_default=True, help="Square input side."
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=128, show_default=True, help="Images per batch."
)
@click.option("--batches", type=click.IntRange(min=1), default=2, show_default=True, help="Timed batches.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="Torch threads [torch's default: one a core].",
)
@click.option(
    "--pairs",
    type=click.IntRange(min=20),
    default=6000,
    show_default=True,
    help="Pairs for the metric timing.",
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed metric runs."
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runs/bench/eval.json"),
    show_default=True,
)
@click.option("--overwrite", is_flag=True, help="Replace the JSON of an earlier run.")
@quiet_option
@device_option("Where the backbone embeds; the metrics always run on the CPU.")
def eval_command(**options) -> None:
    """Embedding throughput (images/s) on CPU or GPU and the time to compute verification metrics.

    Embeds --batches batches of random 8-bit images (after one untimed warm-up batch) with a freshly
    initialized --backbone, without the flip test (which doubles the model's work), and times the
    full verification metrics (10-fold accuracy, ROC, AUC, EER, TAR@FAR) on --pairs random scores,
    the median of --repeats runs against the target of under 1 s. Prints a markdown table for
    docs/benchmarks.md and writes the figures and machine details as JSON to --out.

    \b
    Examples:
      facetrain bench eval
      facetrain bench eval --backbone r18 --batches 4 --threads 2 --overwrite
      facetrain bench eval --backbone small --out runs/bench/eval_small.json
      facetrain bench eval --device cuda --batch-size 256 --batches 8
    """
    from facetrain.bench.eval import run

    run(**options)
