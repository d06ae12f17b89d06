"""`facetrain bench data`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.data.run."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.bench_options import device_option
from facetrain.cli.conventions import quiet_option


@click.command("data")
@click.option(
    "--images", type=click.IntRange(min=8), default=512, show_default=True, help="JPEGs in the fixture set."
)
@click.option(
    "--identities", type=click.IntRange(min=1), default=32, show_default=True, help="Identity folders."
)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Timed passes.")
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runs/bench/data.json"),
    show_default=True,
)
@click.option("--overwrite", is_flag=True, help="Replace the JSON of an earlier run.")
@click.option(
    "--loader-workers",
    default="",
    help="Also time the trainer's DataLoader with these worker counts, e.g. 8,16 (--repeats epochs each).",
)
@click.option("--loader-batch", type=click.IntRange(min=1), default=128, show_default=True)
@device_option("Where --loader-workers deliver the batches (pinned memory on cuda).")
@quiet_option
def data_command(**options) -> None:
    """Images/s of one data worker: decode + augment + normalize of 112x112 JPEGs, from a folder and a .rec.

    Runs in this process on one core (torch and OpenCV at one thread each), the share of one DataLoader
    worker. Target: >= 1,500 images/s per worker for the whole pipeline. The median of --repeats passes
    is reported; per-pass figures and machine details go to the JSON.

    \b
    Examples:
      facetrain bench data
      facetrain bench data --images 2000 --repeats 5 --out runs/bench/data_big.json
      facetrain bench data --overwrite
      facetrain bench data --images 4096 --loader-workers 8,16 --device cuda
    """
    from facetrain.bench.data import run

    run(**options)
