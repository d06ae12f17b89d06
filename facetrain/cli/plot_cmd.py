"""`facetrain plot`: the training curves of one run or several on one figure."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.conventions import checked_output


@click.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    callback=checked_output,
    help="PNG to write.",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Legend name of each run, in order (default: the run directory's name).",
)
@click.option("--overwrite", is_flag=True, help="Replace the PNG if it exists.")
def plot(runs: tuple[Path, ...], out: Path, labels: tuple[str, ...], overwrite: bool) -> None:
    """Plot loss, training accuracy, verification accuracy and lr against the step for each RUN.

    Each RUN is a training run directory (train.output_dir): its metrics.csv gives the loss, the
    accuracy on its training batches (means over each log interval) and the lr, its eval/step_*.json
    the verification accuracy on eval.pairs (every eval.every steps and at the end) with a band of
    ± one standard deviation over its folds. Every run gets one colour in all four panels. The trainer writes the same figure of its own run to RUN/curves.png
    when it finishes.

    \b
    Examples:
      facetrain plot runs/orl_small -o orl_small.png
      facetrain plot runs/orl_a runs/orl_b --label "no EMA" --label "EMA 0.999" -o compare.png
    """
    from facetrain.errors import FacetrainError
    from facetrain.files import refuse_to_overwrite
    from facetrain.train.curves import plot_curves, read_run_curves

    if labels and len(labels) != len(runs):
        raise FacetrainError(f"{len(labels)} --label for {len(runs)} runs; give one per run or none")
    if not overwrite:
        refuse_to_overwrite([out])
    curves = [read_run_curves(run, label) for run, label in zip(runs, labels or [None] * len(runs))]
    written = plot_curves(curves, out)
    click.echo(f"wrote {written} ({len(curves)} run{'s' if len(curves) > 1 else ''})")
