"""`facetrain bench scaling`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.scaling.run."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.conventions import quiet_option


@click.command("scaling")
@click.option(
    "--classes",
    default=100_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="C of the measured runs.",
)
@click.option(
    "--dim", default=256, show_default=True, type=click.IntRange(min=1), help="D of the measured runs."
)
@click.option(
    "--batch-per-rank",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="b of the measured runs: N ranks take a global batch of N b.",
)
@click.option(
    "--world-sizes", default="1,2,3,4", show_default=True, help="Ranks N (CPU processes), comma-separated."
)
@click.option(
    "--heads",
    default="sharded,tiled",
    show_default=True,
    help="bench head's untiled (sharded) and tiled heads.",
)
@click.option("--tile-classes", default=8192, show_default=True, type=click.IntRange(min=1), help="Tile T.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(min=1), help="Timed steps.")
@click.option(
    "--warmup", default=1, show_default=True, type=click.IntRange(min=0), help="Untimed steps first."
)
@click.option("--cases-only", is_flag=True, help="Only evaluate the user cases (no measurement: instant).")
@click.option(
    "-o",
    "--out",
    default="runs/bench/scaling",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the JSON, PNG and markdown outputs.",
)
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
@quiet_option
def scaling_command(**options) -> None:
    """The sharded head's per-rank memory, compute and bytes on the wire as functions of C, D, b and N.

    Checks the model (facetrain/bench/scaling_model.py) against `facetrain bench head` run in N CPU
    processes with b embeddings each (peak memory, bytes sent and step time of the slowest rank;
    PASS within 10 %), then evaluates 8 GPUs x 2M classes, 64 x 10M and 512 x 100M (D 512, b 128,
    fp32 and bf16, untiled and tiled) on H100 nodes beside an r100 backbone. Writes JSON, three PNG
    plots and the markdown tables to --out; docs/scaling.md reads them.

    \b
    Examples:
      facetrain bench scaling                                   # N = 1-4 on the CPU (about a minute)
      facetrain bench scaling --cases-only --out /tmp/scaling
      facetrain bench scaling --classes 20000 --dim 64 --world-sizes 1,2 --steps 1 --out /tmp/scaling
    """
    from facetrain.bench.scaling import run

    run(**options)
