"""`facetrain synth` (the built-in synthetic face set) and `facetrain data` (dataset inspection)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from facetrain.choices import SYNTH_DEFAULTS
from facetrain.cli.conventions import (
    OldSpellings,
    checked_output,
    dropped_verb,
    old_positional_out,
    out_or_old_positional,
    quiet_option,
)
from facetrain.cli.source_names import inspectable_source_names


@click.command("synth", options_metavar="-o OUT [OPTIONS]")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    callback=checked_output,
    help="Folder to draw the set into (required).",
)
@old_positional_out("old_out")
@click.option(
    "--identities", type=click.IntRange(min=1), default=SYNTH_DEFAULTS["identities"], show_default=True
)
@click.option(
    "--images-per-identity",
    type=click.IntRange(min=1),
    default=SYNTH_DEFAULTS["images_per_identity"],
    show_default=True,
)
@click.option(
    "--heldout-identities",
    type=click.IntRange(min=0),
    default=SYNTH_DEFAULTS["heldout_identities"],
    show_default=True,
    help="Other identities for verification (0: no held-out set).",
)
@click.option(
    "--heldout-images-per-identity",
    type=click.IntRange(min=2),
    default=SYNTH_DEFAULTS["heldout_images_per_identity"],
    show_default=True,
)
@click.option(
    "--pairs-folds",
    type=click.IntRange(min=1),
    default=SYNTH_DEFAULTS["pairs_folds"],
    show_default=True,
    help="Folds of pairs.txt; needs 2 held-out identities per fold.",
)
@click.option(
    "--pairs-per-fold",
    type=click.IntRange(min=1),
    default=SYNTH_DEFAULTS["pairs_per_fold"],
    show_default=True,
    help="Matched pairs per fold (and as many mismatched).",
)
@click.option(
    "--image-size",
    type=click.IntRange(min=8),
    default=SYNTH_DEFAULTS["image_size"],
    show_default=True,
    help="Side of the square images in pixels.",
)
@click.option("--seed", type=int, default=SYNTH_DEFAULTS["seed"], show_default=True)
@click.option(
    "--overwrite", is_flag=True, help="Replace the synthetic set in OUT (anything else there is refused)."
)
@quiet_option
def synth(
    out: Path | None,
    old_out: Path | None,
    identities: int,
    images_per_identity: int,
    heldout_identities: int,
    heldout_images_per_identity: int,
    pairs_folds: int,
    pairs_per_fold: int,
    image_size: int,
    seed: int,
    overwrite: bool,
) -> None:
    """Draw the built-in synthetic face set into OUT (deterministic: the same seed, the same bytes).

    Writes OUT/train/<identity>/*.png for training and OUT/heldout/ with other identities and an
    LFW-format pairs.txt for verification on unseen people.

    \b
    Examples:
      facetrain synth -o data/synth
      facetrain synth -o data/tiny --identities 20 --images-per-identity 8 --image-size 48
      facetrain synth -o data/synth --seed 1 --overwrite
    """
    from facetrain.data.config import SynthConfig
    from facetrain.data.synthetic import generate_synthetic

    out = out_or_old_positional(out, old_out, "synth", "facetrain synth -o OUT")
    cfg = SynthConfig(
        identities=identities,
        images_per_identity=images_per_identity,
        heldout_identities=heldout_identities,
        heldout_images_per_identity=heldout_images_per_identity,
        pairs_folds=pairs_folds,
        pairs_per_fold=pairs_per_fold,
        image_size=image_size,
        seed=seed,
    )
    root = generate_synthetic(out, cfg, overwrite=overwrite)
    size = f"{image_size}x{image_size}"
    click.echo(
        f"training set: {root / 'train'} ({identities} identities x {images_per_identity} images, {size})"
    )
    if heldout_identities:
        click.echo(
            f"held-out set: {root / 'heldout'} ({heldout_identities} identities x "
            f"{heldout_images_per_identity} images)"
        )
        click.echo(
            f"pairs:        {root / 'heldout' / 'pairs.txt'} ({pairs_folds} folds x {pairs_per_fold} "
            "matched + mismatched)"
        )


@click.command("data", cls=OldSpellings, upgrades=[dropped_verb("data", "stats")])
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--source",
    type=click.Choice(inspectable_source_names()),
    help="Dataset kind; guessed when omitted (.rec: recordio, .csv/.tsv/.txt: list, "
    "a folder with bounding_box_train: market1501, else folder).",
)
@click.option("--no-decode", is_flag=True, help="Skip decoding every image (no corrupt-file check).")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=min(8, os.cpu_count() or 1),
    show_default=True,
    help="Processes that decode images.",
)
@quiet_option
def data(path: Path, source: str | None, no_decode: bool, workers: int) -> None:
    """Identities, images, an images-per-identity summary and the corrupt files of the dataset at PATH.

    Every image is decoded as training would decode it, so each file listed as corrupt would stop an
    epoch (or be skipped with data.skip_bad_images: true).

    \b
    Examples:
      facetrain data data/synth/train
      facetrain data lists/train.csv --no-decode
      facetrain data /data/faces_emore/train.rec --workers 8
      facetrain data /data/Market-1501-v15.09.15 --source market1501
    """
    import cv2

    from facetrain.data.stats import collect_stats, format_stats

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    click.echo(format_stats(collect_stats(path, source, decode=not no_decode, workers=workers)))
