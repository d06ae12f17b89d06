"""`facetrain align`: raw photos in, aligned face crops out, the same folder tree."""

from __future__ import annotations

import os
from pathlib import Path

import click

from facetrain.cli.conventions import checked_output, old_positional_out, out_or_old_positional, quiet_option

DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))


@click.command(options_metavar="-o OUT [OPTIONS]")
@click.argument("source", metavar="SRC", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    callback=checked_output,
    help="Folder for the crops, SRC's tree (required).",
)
@old_positional_out("old_destination")
@click.option(
    "--size",
    default=None,
    help="Crop size: 112 (square) or HEIGHTxWIDTH, e.g. 112x96 [default: 112 for arcface, 150 for dlib].",
)
@click.option(
    "--template",
    type=click.Choice(["arcface", "dlib"]),
    default="arcface",
    show_default=True,
    help="ArcFace reference points (insightface models), or dlib's get_face_chip with padding 0.25 "
    "(dlib's face ResNet, `facetrain import dlib`).",
)
@click.option(
    "--detector",
    type=click.Choice(["hog", "cnn"]),
    default="hog",
    show_default=True,
    help="dlib's HOG detector (fast) or its CNN detector (more faces, slow on a CPU).",
)
@click.option(
    "--fallback",
    type=click.Choice(["skip", "center"]),
    default="skip",
    show_default=True,
    help="Images without a face: leave them out, or write a centre crop.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=DEFAULT_WORKERS,
    show_default=True,
    help="Processes aligning in parallel.",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Report CSV listing every image and what became of it [default: OUT/align_report.csv].",
)
@click.option("--overwrite", is_flag=True, help="Replace crops (and the report) already in OUT.")
@quiet_option
def align(
    source: Path,
    out: Path | None,
    old_destination: Path | None,
    size: str | None,
    template: str,
    detector: str,
    fallback: str,
    workers: int,
    report: Path | None,
    overwrite: bool,
) -> None:
    """Align the faces of every image under SRC into crops under OUT, keeping the folder tree.

    For each photo the largest face is detected, its eye centres, nose tip and mouth corners are
    found with dlib's 68-point landmarks, and the photo is warped by a similarity transform onto
    the ArcFace reference points (the crops insightface-trained models expect). Images without a
    face are skipped, or centre-cropped with --fallback center; both are counted in the summary and
    listed in the report CSV with unreadable images. Nothing in OUT is replaced without
    --overwrite. --template dlib cuts the chips dlib's face ResNet expects (`facetrain import dlib`)
    instead: dlib's 5-point landmarks placed as `dlib.get_face_chip` places them, 150x150 with
    padding 0.25. Needs the align extra: pip install 'facetrain[align]'.

    \b
    Examples:
      facetrain align photos/ -o aligned/
      facetrain align lfw/raw -o lfw/aligned --workers 4 --fallback center
      facetrain align faces/ -o crops_112x96/ --size 112x96 --detector cnn --overwrite
      facetrain align photos/ -o chips/ --template dlib
    """
    from facetrain.align.runner import AlignSettings, align_folder
    from facetrain.align.template import parse_crop_size

    destination = out_or_old_positional(out, old_destination, "align", "facetrain align SRC -o OUT")
    crop_size = None if size is None else parse_crop_size(size)
    settings = AlignSettings(crop_size, detector, fallback, template)
    summary = align_folder(source, destination, settings, workers=workers, overwrite=overwrite, report=report)
    click.echo(summary.describe())
