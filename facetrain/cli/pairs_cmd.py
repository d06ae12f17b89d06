"""`facetrain pairs`: an honest verification pair set from a folder of identities."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.choices import DEFAULT_FOLD_SEED, DEFAULT_FOLDS
from facetrain.cli.conventions import OldSpellings, checked_output, dropped_verb


@click.command(cls=OldSpellings, upgrades=[dropped_verb("pairs", "make")])
@click.argument("root", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    callback=checked_output,
    help="Pairs CSV.",
)
@click.option(
    "--seed",
    type=int,
    default=DEFAULT_FOLD_SEED,
    show_default=True,
    help="Seed of the mismatched-pair sample and the folds.",
)
@click.option(
    "--folds",
    "num_folds",
    type=click.IntRange(min=2),
    default=DEFAULT_FOLDS,
    show_default=True,
    help="Cross-validation folds.",
)
@click.option("--overwrite", is_flag=True, help="Replace the CSV if it exists.")
def pairs(root: Path, out: Path, seed: int, num_folds: int, overwrite: bool) -> None:
    """Write balanced verification pairs of the images under ROOT/<identity>/ to a CSV.

    Every matched pair (two images of one identity) is written, and as many mismatched pairs,
    sampled uniformly with --seed and without repeats; the pairs are dealt into stratified folds,
    each holding the same share of matched and mismatched pairs. Columns: path1,path2,same,fold,
    with paths relative to the CSV's folder. `facetrain eval MODEL --pairs OUT` scores it, and
    `facetrain eval MODEL --folder ROOT` does both in one step.

    \b
    Examples:
      facetrain pairs data/heldout -o data/heldout_pairs.csv
      facetrain pairs aligned/test -o pairs.csv --seed 1 --folds 5 --overwrite
    """
    from facetrain.eval.pair_making import folder_pair_set, write_pairs_csv
    from facetrain.files import refuse_to_overwrite

    if not overwrite:
        refuse_to_overwrite([out])
    pair_set = folder_pair_set(root, seed, num_folds)
    written = write_pairs_csv(pair_set, out, overwrite=True)
    identities = len({Path(image).parent for image in pair_set.images})
    click.echo(
        f"wrote {pair_set.num_pairs} pairs ({pair_set.num_matched} matched, "
        f"{pair_set.num_pairs - pair_set.num_matched} mismatched) of {len(pair_set.images)} images of "
        f"{identities} identities in {len(set(pair_set.folds.tolist()))} folds to {written}"
    )
