"""`facetrain eval`: how good is a model, on verification pairs or on Market-1501 retrieval."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import click

from facetrain.choices import DEFAULT_FOLD_SEED, DEFAULT_FOLDS
from facetrain.cli.conventions import (
    batch_size_option,
    checked_output,
    device_option,
    quiet_option,
    trust_torchscript_option,
    workers_option,
)


@click.command()
@click.argument("model", metavar="MODEL", type=click.Path(path_type=Path))
@click.option(
    "--pairs",
    "pairs_path",
    type=click.Path(path_type=Path),
    help="LFW pairs.txt, a pairs CSV (path1,path2,same[,fold]) or an insightface .bin.",
)
@click.option(
    "--images",
    "images_root",
    type=click.Path(path_type=Path),
    help="Image root of --pairs (default: the pairs file's folder).",
)
@click.option("--skip-missing", is_flag=True, help="Drop pairs whose images are missing (and report them).")
@click.option(
    "--folder",
    "folder_root",
    type=click.Path(path_type=Path),
    help="Folder of identities ROOT/<identity>/<image>: verify on balanced pairs made from it.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help=f"With --folder: seed of the mismatched-pair sample and the folds [default: {DEFAULT_FOLD_SEED}].",
)
@click.option(
    "--folds",
    "num_folds",
    type=click.IntRange(min=2),
    default=None,
    help=f"With --folder: cross-validation folds [default: {DEFAULT_FOLDS}].",
)
@click.option(
    "--market",
    "market_root",
    type=click.Path(path_type=Path),
    help="Market-1501 root with query/ and bounding_box_test/, for re-id retrieval instead of --pairs.",
)
@click.option(
    "--ijb",
    "ijb_root",
    type=click.Path(path_type=Path),
    help="IJB-B/IJB-C folder with meta/ and loose_crop/ (insightface's layout), for 1:1 template verification.",
)
@click.option(
    "--ijb-target",
    type=click.Choice(["IJBC", "IJBB"]),
    default=None,
    help="With --ijb: which protocol's meta files to read [default: IJBC].",
)
@click.option(
    "--reid",
    "reid_sets",
    nargs=2,
    type=str,
    default=None,
    metavar="QUERY GALLERY",
    help="Re-id retrieval from QUERY to GALLERY: folders of PID_CAM images or path,pid,camera CSVs; "
    "FOLDER@N keeps camera N's images.",
)
@click.option("--rerank", is_flag=True, help="With --reid or --market: k-reciprocal re-ranking.")
@click.option(
    "--flip/--no-flip",
    default=True,
    show_default=True,
    help="The flip test: add the embedding of each image's mirror.",
)
@batch_size_option()
@workers_option
@device_option
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    callback=checked_output,
    help="Report folder (default: MODEL/eval, or eval/ beside a model file).",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier report of the same name in --out.")
@trust_torchscript_option
@quiet_option
def eval_command(
    model: Path,
    pairs_path: Path | None,
    images_root: Path | None,
    skip_missing: bool,
    folder_root: Path | None,
    seed: int | None,
    num_folds: int | None,
    market_root: Path | None,
    ijb_root: Path | None,
    ijb_target: str | None,
    reid_sets: tuple[str, str] | None,
    rerank: bool,
    flip: bool,
    batch_size: int,
    workers: int,
    device: str | None,
    out_dir: Path | None,
    overwrite: bool,
    trust_torchscript: bool,
) -> None:
    """Evaluate MODEL: face verification on --pairs or --folder, or person re-id retrieval on --market.

    MODEL is a training checkpoint (written by any number of ranks; a last/best pointer or run
    directory works too), an export directory, or an exported model file. Verification prints
    10-fold accuracy (thresholds chosen on the other 9 folds; the file's folds when it has them,
    else stratified ones), the all-"different" baseline, the threshold to deploy (best balanced
    accuracy) with its FAR and TAR, ROC AUC, EER, TAR at FAR 1e-1/1e-2/1e-3, XNorm and the quantiles
    of the embedding norms before normalisation, and writes NAME.json, NAME_folds.csv, NAME_roc.png
    and NAME_norms.png (each pair's lower norm) to --out, NAME being the pairs file's folder, stem and
    a short hash of its path (heldout-pairs-1a2b3c: two files called pairs.txt never share a report).
    --folder makes balanced pairs from a folder of identities (as `facetrain pairs` does),
    names the report after the folder and keeps the pairs as NAME.pairs.csv (--pairs NAME.pairs.csv
    later scores them into the same NAME report files).
    Re-id prints CMC rank-1/5/10 and mAP (same-person same-camera gallery images removed) and
    writes NAME.json and the CMC curve NAME_cmc.png, NAME being market1501 or reid_<gallery>.
    --ijb runs insightface's IJB-B/IJB-C 1:1 protocol (faces aligned by their 5 landmarks, flip
    features summed, detector-score weighting, media then template pooling) and prints TAR at FAR
    1e-6 ... 1e-1, writing ijbc.json, ijbc_roc.png and ijbc_scores.npy (ijbb_* for IJBB).
    A pairs file of one kind only (all matched, like insightface's small_lfw.bin) gets similarity
    statistics and the TAR (or FAR) at the model's own threshold instead of accuracy.
    An earlier report of the same name in --out is replaced only with --overwrite.

    \b
    Examples:
      facetrain eval runs/demo/checkpoints/last --pairs data/synth/heldout/pairs.txt
      facetrain eval runs/orl/export --folder data/orl_heldout --seed 1
      facetrain eval runs/lfw/export --pairs lfw/pairs.txt --images lfw/aligned --skip-missing
      facetrain eval runs/ms1m/checkpoints/best --pairs faces_emore/agedb_30.bin --no-flip
      facetrain eval runs/reid/export --market data/Market-1501 --batch-size 256 -o reports/reid
      facetrain eval runs/ms1m/export --ijb IJB_release/IJBC --ijb-target IJBC --workers 8
      facetrain eval runs/reid_small --reid data/cuhk03/val@1 data/cuhk03/val@2 --rerank
    """
    from facetrain.align.five_points import FivePointCrop
    from facetrain.checkpoint.run_dir import writing_into_run
    from facetrain.devices import resolve_device
    from facetrain.eval.kinds import EvalRequest, eval_kind
    from facetrain.files import refuse_to_overwrite
    from facetrain.interop.loading import load_model

    inputs = {
        "pairs": pairs_path,
        "folder": folder_root,
        "market": market_root,
        "reid": reid_sets,
        "ijb": ijb_root,
    }
    given = {
        "--images": images_root,
        "--skip-missing": skip_missing,
        "--seed": seed,
        "--folds": num_folds,
        "--ijb-target": ijb_target,
        "--rerank": rerank,
    }
    kind_name = _chosen_kind(inputs, given)
    device = resolve_device(device)
    out_dir = out_dir or (model if model.is_dir() else model.parent) / "eval"
    request = EvalRequest(
        inputs[kind_name],
        out_dir,
        model,
        embedding={"batch_size": batch_size, "flip": flip, "device": device, "num_workers": workers},
        extra={"model": str(model)},
        images_root=images_root,
        skip_missing=skip_missing,
        seed=seed,
        num_folds=num_folds,
        ijb_target=ijb_target or "IJBC",
        rerank=rerank,
        face_crop=FivePointCrop,
    )
    kind = eval_kind(kind_name)
    if not overwrite:  # before the model is loaded or an image read
        refuse_to_overwrite(kind.report_paths(request))
    with writing_into_run(
        out_dir, "facetrain eval", "wait for it to finish, or pass --out to write the report elsewhere"
    ):
        table, written = kind(request, partial(load_model, model, device, trust_torchscript))
    click.echo(table)
    click.echo("wrote " + ", ".join(str(path) for path in written))


def _chosen_kind(inputs: dict[str, object], given: dict[str, object]) -> str:
    """The one kind of evaluation (`facetrain.eval.kinds`) whose option was given; a usage error for none
    or several, or for an option (`given`) that kind does not read."""
    from facetrain.eval.kinds import eval_kind

    chosen = [name for name, value in inputs.items() if value is not None]
    if len(chosen) != 1:
        kinds = ", ".join(f"{eval_kind(name).option} ({eval_kind(name).what})" for name in inputs)
        raise click.UsageError(f"give exactly one of {kinds}")
    options = eval_kind(chosen[0]).options
    wrong = next(
        (option for option, value in given.items() if value not in (None, False) and option not in options),
        None,
    )
    if wrong is not None:
        readers = [eval_kind(name).option for name in inputs if wrong in eval_kind(name).options]
        raise click.UsageError(f"{wrong} applies to {' and '.join(readers)} only")
    return chosen[0]
