"""`facetrain pack`: an image folder as insightface's RecordIO, for faster reading and insightface's tools."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.conventions import checked_output, quiet_option


@click.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    callback=checked_output,
    required=True,
    help="The packed file NAME.rec; NAME.idx and property are written beside it.",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier NAME.rec, NAME.idx or property.")
@quiet_option
def pack(folder: Path, out: Path, overwrite: bool) -> None:
    """Pack FOLDER/<identity>/<image> into insightface's RecordIO: NAME.rec, NAME.idx and property.

    Images are stored as they are (not re-encoded), labelled 0, 1, ... in the sorted order of the
    identity folders, with insightface's header and identity records; property holds
    `classes,height,width`, so every image must have one size (align the folder first). facetrain
    reads the result as data.path (data.source: recordio), as do insightface's loaders. The files
    are written under temporary names and renamed at the end: an interrupted pack leaves nothing
    half-written, and earlier files are replaced only with --overwrite. One pack at a time writes
    into a folder: a second is refused, naming the first.

    \b
    Examples:
      facetrain pack data/aligned -o data/packed/train.rec
      facetrain pack data/synth/train -o data/synth_rec/train.rec --overwrite -q
      facetrain bench data                           # folder vs .rec reading speed
    """
    from facetrain.data.pack import pack_folder

    packed = pack_folder(folder, out, overwrite=overwrite)
    click.echo(
        f"wrote {packed.images} images of {packed.identities} identities ({packed.height}x{packed.width}) "
        f"to {packed.rec_path}, {packed.idx_path} and {packed.property_path}"
    )
