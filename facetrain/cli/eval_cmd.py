"""`facetrain eval`: how good is a model, on verification pairs or on Market-1501 retrieval."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

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
from facetrain.logger import logger

if TYPE_CHECKING:
    from facetrain.interop.loading import LoadedModel


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
    from facetrain.checkpoint.run_dir import writing_into_run
    from facetrain.devices import resolve_device
    from facetrain.files import refuse_to_overwrite
    from facetrain.interop.loading import load_model

    if [pairs_path, folder_root, market_root, reid_sets, ijb_root].count(None) != 4:
        raise click.UsageError(
            "give exactly one of --pairs or --folder (verification), --market or --reid (re-id retrieval) "
            "or --ijb (IJB-B/C template verification)"
        )
    if ijb_root is None and ijb_target is not None:
        raise click.UsageError("--ijb-target applies to --ijb only")
    if rerank and market_root is None and reid_sets is None:
        raise click.UsageError("--rerank applies to --market and --reid only")
    if pairs_path is None and (images_root is not None or skip_missing):
        raise click.UsageError("--images and --skip-missing apply to --pairs only")
    if folder_root is None and (seed is not None or num_folds is not None):
        raise click.UsageError("--seed and --folds apply to --folder only")
    device = resolve_device(device)
    out_dir = out_dir or (model if model.is_dir() else model.parent) / "eval"
    options = {
        "batch_size": batch_size,
        "flip": flip,
        "device": device,
        "num_workers": workers,
    }
    load = partial(load_model, model, device, trust_torchscript)
    extra = {"model": str(model)}
    if reid_sets is not None:
        from facetrain.cli.eval_reid import evaluate_reid_sets, reid_report_paths

        if not overwrite:
            refuse_to_overwrite(reid_report_paths(out_dir, reid_sets[1]))
        with writing_into_run(out_dir, "facetrain eval", "wait for it to finish, or pass --out elsewhere"):
            written = evaluate_reid_sets(load, *reid_sets, rerank, out_dir, options, extra)
        click.echo("wrote " + ", ".join(str(path) for path in written))
        return
    name = _report_file_name(pairs_path, folder_root)
    if not overwrite:  # before the model is loaded or an image read
        refuse_to_overwrite(
            _report_paths(out_dir, name, folder_root is not None, ijb_root and (ijb_target or "IJBC"))
        )
    with writing_into_run(
        out_dir, "facetrain eval", "wait for it to finish, or pass --out to write the report elsewhere"
    ):
        written = _evaluate(
            model, load, out_dir, name, options, extra, pairs_path, images_root, skip_missing, folder_root, seed,
            num_folds, market_root, ijb_root, ijb_target or "IJBC", rerank,
        )  # fmt: skip
    click.echo("wrote " + ", ".join(str(path) for path in written))


def _report_file_name(pairs_path: Path | None, folder_root: Path | None) -> str | None:
    """What a verification's report files are called (`set_names.report_file_name`); None for the others."""
    from facetrain.eval.set_names import report_file_name

    if folder_root is not None:
        return report_file_name(os.path.abspath(folder_root))  # as `folder_pair_set` names its pairs
    return None if pairs_path is None else report_file_name(pairs_path)


def _report_paths(out_dir: Path, name: str | None, keeps_pairs: bool, ijb_target: str | None) -> list[Path]:
    """The files this evaluation writes into `out_dir` (`eval.report` names them): `name` is a
    verification's report name, and `keeps_pairs` (--folder) adds the pairs it keeps."""
    if ijb_target:
        from facetrain.eval.ijb_report import ijb_report_paths

        return ijb_report_paths(out_dir, ijb_target)
    from facetrain.eval.report import retrieval_report_paths, verification_report_paths
    from facetrain.eval.retrieval import REPORT_NAME
    from facetrain.eval.set_names import KEPT_PAIRS_SUFFIX

    if name is not None:
        kept = [out_dir / f"{name}{KEPT_PAIRS_SUFFIX}.csv"] if keeps_pairs else []
        return [*verification_report_paths(out_dir, name), *kept]
    return retrieval_report_paths(out_dir, REPORT_NAME)


def _evaluate(
    model: Path,
    load: Callable[[], LoadedModel],
    out_dir: Path,
    name: str | None,
    options: dict,
    extra: dict,
    pairs_path: Path | None,
    images_root: Path | None,
    skip_missing: bool,
    folder_root: Path | None,
    seed: int | None,
    num_folds: int | None,
    market_root: Path | None,
    ijb_root: Path | None,
    ijb_target: str,
    rerank: bool = False,
) -> list[Path]:
    """Run the evaluation MODEL was asked for, print its table and write its report to `out_dir`.

    `load` loads MODEL, called only once the inputs were read, so a bad input fails before the model loads."""
    from facetrain.eval.report import (
        retrieval_table,
        verification_table,
        write_retrieval_report,
        write_verification_report,
    )
    from facetrain.interop.card import card_interpolation

    if ijb_root is not None:
        from facetrain.align.five_points import FivePointCrop
        from facetrain.eval.ijb import evaluate_ijb
        from facetrain.eval.ijb_meta import read_ijb_meta
        from facetrain.eval.ijb_report import ijb_table, write_ijb_report

        read_ijb_meta(ijb_root, ijb_target)  # a broken protocol file fails before the model loads
        loaded = load()
        crop = FivePointCrop(loaded.image_size)
        result = evaluate_ijb(loaded.module, ijb_root, ijb_target, loaded.image_size, crop, **options)
        click.echo(ijb_table(result))
        return write_ijb_report(result, out_dir, extra)
    if market_root is None:
        from facetrain.eval.one_kind import one_kind_problem
        from facetrain.eval.pair_making import folder_pair_set, write_pairs_csv
        from facetrain.eval.verify_pairs import KEPT_PAIRS_SUFFIX, load_pairs, verify

        if folder_root is not None:
            pairs = folder_pair_set(
                folder_root,
                DEFAULT_FOLD_SEED if seed is None else seed,
                DEFAULT_FOLDS if num_folds is None else num_folds,
            )
        else:
            pairs = load_pairs(pairs_path, images_root, skip_missing)
        if pairs.skipped_pairs:
            logger.warning(
                f"skipped {pairs.skipped_pairs} pairs: {len(pairs.missing)} images missing, e.g. {pairs.missing[0]}"
            )
        if one_kind_problem(pairs) is not None:
            return _evaluate_one_kind(model, load, pairs, out_dir, name, options, extra)
        loaded = load()
        result = verify(
            pairs, loaded.module, loaded.image_size, interpolation=card_interpolation(loaded.card), **options
        )
        click.echo(verification_table(result))
        step = (loaded.card.get("training") or {}).get("step")
        written = write_verification_report(result, out_dir, {**extra, "step": step}, name)
        if folder_root is not None:
            kept = out_dir / f"{name}{KEPT_PAIRS_SUFFIX}.csv"
            written.append(write_pairs_csv(pairs, kept, overwrite=True))
    else:
        from facetrain.eval.rerank import RerankSettings
        from facetrain.eval.retrieval import evaluate_market1501

        loaded = load()
        settings = RerankSettings() if rerank else None
        result = evaluate_market1501(
            loaded.module, market_root, loaded.image_size, rerank=settings, **options
        )
        click.echo(retrieval_table(result))
        written = write_retrieval_report(result, out_dir, extra)
    return written


def _evaluate_one_kind(
    model: Path, load: Callable[[], LoadedModel], pairs, out_dir: Path, name: str, options: dict, extra: dict
) -> list[Path]:
    """A pairs file of one kind only: say so at once (before the model loads), then report what it can."""
    from facetrain.eval.one_kind import (
        one_kind_problem,
        one_kind_table,
        score_one_kind,
        write_one_kind_report,
    )
    from facetrain.interop.card import card_interpolation

    logger.warning(f"note: {one_kind_problem(pairs)}; reporting the similarity statistics instead")
    loaded = load()
    threshold = loaded.threshold
    source = (
        "the model's own, from its verification"
        if threshold is not None
        else (
            f"{model} records no threshold (it was never verified on pairs of both kinds); export it with "
            "--evaluation NAME.json of such a verification to give it one"
        )
    )
    result = score_one_kind(
        pairs, loaded.module, loaded.image_size, threshold, source,
        interpolation=card_interpolation(loaded.card), **options,
    )  # fmt: skip
    click.echo(one_kind_table(result))
    return write_one_kind_report(result, out_dir, extra, name)
