"""`facetrain export`, `facetrain embed` and `facetrain compare`: using a trained model."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.conventions import (
    OldSpellings,
    batch_size_option,
    checked_output,
    device_option,
    model_option_first,
    quiet_option,
    trust_torchscript_option,
)
from facetrain.logger import logger

# MODEL, first on every command that uses a model: a training checkpoint (a checkpoint directory, a
# last/best pointer or a run directory), an export directory or an exported model file
model_argument = click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))


def _human_size(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _aligner(align: bool, detector: str, image_size: tuple[int, int]):
    """With --align, a face aligner to the model's input size; the align extra is needed only then."""
    if not align:
        return None
    from facetrain.align.aligner import FaceAligner

    return FaceAligner(image_size, detector)


align_option = click.option(
    "--align",
    is_flag=True,
    help="Find and align the face in each photo first (needs pip install 'facetrain[align]').",
)
detector_option = click.option(
    "--detector",
    type=click.Choice(["hog", "cnn"]),
    default="hog",
    show_default=True,
    help="Face detector for --align.",
)


def _parse_formats(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


@click.command()
@model_argument
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    callback=checked_output,
    help="Output folder.",
)
@click.option(
    "--formats",
    default="safetensors,torchscript,onnx",
    show_default=True,
    help="Comma-separated: safetensors, torchscript, onnx.",
)
@click.option(
    "--evaluation",
    "verification_report",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A `facetrain eval --pairs` report (NAME.json) whose accuracy and threshold go into the card.",
)
@click.option(
    "--with-head", is_flag=True, help="Also write the full classifier head, gathered from its shards."
)
@click.option("--overwrite", is_flag=True, help="Replace model files already in the output folder.")
@trust_torchscript_option
@quiet_option
def export(
    model_path: Path,
    out_dir: Path,
    formats: str,
    verification_report: Path | None,
    with_head: bool,
    overwrite: bool,
    trust_torchscript: bool,
) -> None:
    """Export a trained backbone for inference, with a JSON model card.

    MODEL is a checkpoint directory written by any number of ranks, a last/best pointer, or a run
    directory. Writes OUT/model.safetensors (canonical; OUT is then a MODEL of eval, embed and
    compare), OUT/model.json (the card: architecture, input size and normalization, training config,
    evaluation results and threshold), OUT/model.torchscript.pt and OUT/model.onnx (dynamic batch,
    checked against PyTorch with onnxruntime to 1e-4), and with --with-head OUT/head.safetensors. The
    card's evaluation results come from the checkpoint (the trainer's last verification) or from
    --evaluation.

    \b
    Examples:
      facetrain export runs/demo/checkpoints/best -o runs/demo/export
      facetrain export runs/demo -o exported --formats safetensors,onnx --overwrite
      facetrain export runs/demo/checkpoints/last -o exported --with-head
      facetrain export runs/demo -o exported --evaluation runs/demo/eval/lfw_pairs.json
    """
    from facetrain.checkpoint.run_dir import writing_into_run
    from facetrain.export.exporter import export_model

    with writing_into_run(out_dir, "facetrain export", "wait for it to finish, or choose another -o"):
        result = export_model(
            model_path,
            out_dir,
            _parse_formats(formats),
            with_head,
            overwrite,
            verification_report=verification_report,
            trust_torchscript=trust_torchscript,
        )
    click.echo(
        f"exported {result.card['architecture']} ({result.card['embedding_size']}-d) to {result.out_dir}"
    )
    checks = {entry["file"]: entry.get("max_abs_diff") for entry in result.card["files"].values()}
    for path in result.files:
        diff = checks.get(path.name)
        check = "" if diff is None else f"  max |diff| vs PyTorch {diff:.2e}"
        click.echo(f"  {path.name:<24} {_human_size(path.stat().st_size):>10}{check}")
    threshold, threshold_far = result.card.get("threshold"), result.card.get("threshold_far")
    if threshold is not None:
        where = "" if threshold_far is None else f" (FAR {100 * threshold_far:.2f}% on the evaluation pairs)"
        click.echo(f"verification threshold (cosine): {threshold:.4f}{where}")


@click.command(cls=OldSpellings, upgrades=[model_option_first("embed", "MODEL PATH... -o OUT")])
@model_argument
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    callback=checked_output,
    help="Output: .npy (+ .paths.txt), .parquet or .csv.",
)
@batch_size_option(64)
@click.option(
    "--flip/--no-flip", default=None, help="Add the mirrored image's embedding [default: as evaluated]."
)
@device_option
@click.option("--overwrite", is_flag=True, help="Replace the output file if it exists.")
@click.option(
    "--norms",
    is_flag=True,
    help="Also write each image's raw embedding norm, a quality score for MagFace/AdaFace models.",
)
@align_option
@detector_option
@trust_torchscript_option
@quiet_option
def embed(
    model_path: Path,
    paths: tuple[Path, ...],
    out: Path,
    batch_size: int,
    flip: bool | None,
    device: str | None,
    overwrite: bool,
    norms: bool,
    align: bool,
    detector: str,
    trust_torchscript: bool,
) -> None:
    """Write MODEL's L2-normalized embeddings of images, and of every image under folders.

    MODEL is a training checkpoint, an export directory or an exported model file. Rows follow the
    order of PATHS, folders expanded in sorted order. Tables (.parquet, .csv) have a `path` column
    then e0, e1, ...; -o X.npy gets the paths in X.paths.txt beside it. With --align, raw photos are
    aligned to the model's input first (as `facetrain align` does); photos without a face are left
    out and named on stderr. --norms adds each image's embedding norm before normalisation (of the
    image itself, without its mirror): a `norm` column in tables, X.norms.npy beside X.npy. Under a
    magnitude-aware margin (head.margin magface or adaface) a low norm marks a poor image; a model
    that normalises its embedding inside gives 1 for all, and a note says so.

    \b
    Examples:
      facetrain embed runs/demo/export data/synth/heldout -o embeddings.npy
      facetrain embed runs/demo/checkpoints/best a.jpg b.jpg -o faces.csv
      facetrain embed runs/demo/export raw_photos/ -o faces.npy --align
      facetrain embed exported photos/ -o faces.parquet --batch-size 128
      facetrain embed runs/magface/export photos/ -o faces.csv --norms
    """
    from facetrain.devices import resolve_device
    from facetrain.export.compare import default_flip
    from facetrain.export.embed_paths import embed_paths
    from facetrain.export.embedding_files import embeddings_writer
    from facetrain.export.inputs import collect_images
    from facetrain.interop.loading import load_model

    write = embeddings_writer(out, overwrite, with_norms=norms)
    images = collect_images(paths)
    model = load_model(model_path, resolve_device(device), trust_torchscript)
    flip = default_flip(model.card) if flip is None else flip
    result = embed_paths(model, images, batch_size, flip, _aligner(align, detector, model.image_size))
    for line in result.warnings():
        logger.warning(line)
    written = write([str(path) for path in result.paths], result.vectors, result.norms)
    if norms and (note := _unit_norms_note(model_path, result.norms)) is not None:
        logger.warning(note)
    click.echo(
        f"wrote {len(result.paths)} embeddings of size {result.vectors.shape[1]} to "
        f"{', '.join(map(str, written))}{result.left_out()}"
    )


def _unit_norms_note(model_path: Path, norms) -> str | None:
    """What --norms of a model that normalises its embedding inside says: every norm is 1, so none of
    them tells a poor image from a good one (`eval.norm_summary`)."""
    from facetrain.eval.norm_summary import summarize_norms

    if len(norms) == 0 or not summarize_norms(norms).unit:
        return None
    return (
        f"note: every norm is 1: {model_path} normalises its embedding inside, so its norms say "
        "nothing of image quality"
    )


@click.command(cls=OldSpellings, upgrades=[model_option_first("compare", "MODEL IMG1 IMG2")])
@model_argument
@click.argument("first", metavar="IMG1", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.argument("second", metavar="IMG2", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--threshold", type=float, help="Cosine similarity to call a pair the same [default: the card's]."
)
@click.option(
    "--flip/--no-flip", default=None, help="Add the mirrored image's embedding [default: as evaluated]."
)
@device_option
@align_option
@detector_option
@trust_torchscript_option
def compare(
    model_path: Path,
    first: Path,
    second: Path,
    threshold: float | None,
    flip: bool | None,
    device: str | None,
    align: bool,
    detector: str,
    trust_torchscript: bool,
) -> None:
    """Say whether two face images show the same person, by MODEL's embeddings.

    MODEL is a training checkpoint, an export directory or an exported model file. Prints the
    cosine similarity of their embeddings and the decision at the threshold that evaluation found
    (stored in the model card, with the false-accept rate it gave there), or at --threshold. With
    --align the two can be raw photos: each face is found and aligned first.

    \b
    Examples:
      facetrain compare runs/demo/export a.jpg b.jpg
      facetrain compare runs/demo/export photo1.jpg photo2.jpg --align
      facetrain compare runs/demo/checkpoints/best a.jpg b.jpg --threshold 0.3
    """
    from facetrain.devices import resolve_device
    from facetrain.export.compare import compare_images
    from facetrain.interop.loading import load_model

    model = load_model(model_path, resolve_device(device), trust_torchscript)
    result = compare_images(
        model, first, second, threshold, flip, _aligner(align, detector, model.image_size)
    )
    verdict = "same person" if result.same else "different people"
    where = (
        ""
        if result.threshold_far is None
        else f"  (threshold at FAR {100 * result.threshold_far:.2f}% in evaluation)"
    )
    click.echo(f"similarity {result.similarity:.4f}  threshold {result.threshold:.4f}  -> {verdict}{where}")
    if not align:
        from facetrain.export.compare import unaligned_hint

        hint = unaligned_hint([first, second], model.image_size)
        if hint:
            logger.warning(hint)
