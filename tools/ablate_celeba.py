"""One row of docs/accuracy.md's CelebA-dev table: train on the people outside a fold, verify the fold.

The folds are tools/celeba_folds.py's: ../shared/data/celeba_dev's people dealt with a fixed seed into
10 people-disjoint folds of 300 matched and 300 mismatched pairs. For a fold k the training set is
every CelebA-dev person outside fold k with at least --min-photos photos, and the fold's 600 pairs are
verified with 10 stratified folds of their own (as tools/ablate_lfw.py does for LFW's View 2). Each
(fold, seed) is one run of `facetrain train -c CONFIG --set ...` on 2 CPU ranks; the row prints each
run and the mean ± sample standard deviation over all of them, and appends one JSON line to
OUT/rows.jsonl. The other half of CelebA's people is held out for a check outside the project and is
not in the folder; every fold here is for development.

The photos are an aligned copy (`facetrain align` keeps each person's folder and each photo's name);
the folds are dealt from the folder itself (--source), so every aligned copy shares them:

    .venv/bin/facetrain align ../shared/data/celeba_dev -o runs/celeba_dev_aligned --fallback center
    .venv/bin/python tools/ablate_celeba.py recipe --folds 2 3 --seeds 0 1

A pretrained model is scored on the same folds without training by --zero-shot, and a fine-tune is a
row of its config; --lfw also verifies every run on LFW-dev View 2 folds (tools/ablate_lfw.py's pairs,
of an LFW copy aligned the same way), to show what a fine-tune on CelebA does to LFW:

    .venv/bin/facetrain import dlib -o runs/dlib_resnet
    .venv/bin/facetrain align ../shared/data/celeba_dev -o runs/celeba_dev_dlib --template dlib --fallback center
    .venv/bin/python tools/ablate_celeba.py dlib_zero_shot --celeba runs/celeba_dev_dlib --zero-shot runs/dlib_resnet
    .venv/bin/python tools/ablate_celeba.py dlib_finetune -c configs/finetune_dlib.yaml \\
        --celeba runs/celeba_dev_dlib --lfw runs/lfw_dev_dlib --lfw-folds 2 3

A row that verifies fold k during training cannot use its best/ as a result: fold k chose it. With
--validate STEPS a run keeps the next fold's people (k+1; 1 after 10) out of training too, verifies
them every STEPS steps (and at step 0 for a fine-tune), so that best/ is the step that did best on
people of neither, and reports best/ on fold k beside the last step (last_*). This is how a fine-tune
that keeps its start when no step beats it is measured honestly:

    .venv/bin/python tools/ablate_celeba.py dlib_ft_validated -c configs/finetune_dlib.yaml \\
        --set model.init=runs/dlib_resnet --celeba runs/celeba_dev_dlib --validate 100 --folds 2 3 4

With --train-lfw a run for fold k trains from scratch on both sets: CelebA-dev outside its fold k and
the LFW-dev copy's people outside View 2 fold k (each person a class of their own; the two sets' people
are assumed distinct, as CelebA's identities are numbers and cannot be matched to LFW's names), and is
verified on both fold k's, so each run gives a CelebA-dev and an LFW-dev figure (folds 2-10):

    .venv/bin/python tools/ablate_celeba.py joint -c configs/faces_small.yaml --lfw runs/lfw_dev_aligned --train-lfw --folds 2 3 --seeds 0
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate_lfw import VIEW2_PAIRS, write_fold_split  # noqa: E402
from celeba_folds import build_protocol  # noqa: E402
from protocol import (  # noqa: E402
    REPO,
    SHARED_DATA,
    append_row,
    join_train_lists,
    pick_figures,
    row_parser,
    summarize,
    train_and_verify,
    verify_extra,
    write_train_list,
)

CELEBA_DEV = SHARED_DATA / "celeba_dev"
FOLDS, PAIRS_PER_FOLD, PROTOCOL_SEED = 10, 300, 0


def photo(root: Path, person: str, image: str) -> Path:
    """`image` of `person` in the copy `root`, whatever extension the copy gave it."""
    matches = sorted((root / person).glob(f"{Path(image).stem}.*"))
    if not matches:
        sys.exit(f"{root / person}: no photo {image}; was {root} made from {CELEBA_DEV.name}?")
    return matches[0]


def validation_fold(fold: int) -> int:
    """The fold whose people --validate keeps out of fold `fold`'s training: the next one (1 after 10)."""
    return fold % FOLDS + 1


def write_pairs(root: Path, rows: list[tuple], fold: int, path: Path) -> Path:
    """Fold `fold`'s pairs of the protocol `rows` as a pairs CSV of photos of the copy `root`."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path1", "path2", "same"])
        for number, person1, image1, person2, image2, same in rows:
            if number == fold:
                left, right = photo(root, person1, image1), photo(root, person2, image2)
                writer.writerow([left.resolve(), right.resolve(), same])
    return path


def write_celeba_split(
    source: Path, root: Path, fold: int, min_photos: int, out: Path, validation: int | None = None
) -> tuple[Path, Path, Path | None]:
    """The training list (every person outside `fold` and the `validation` fold, photos from the copy
    `root`), the fold's pairs CSV and the validation fold's (None without one), written under `out`."""
    dealt, rows = build_protocol(source, FOLDS, PAIRS_PER_FOLD, PROTOCOL_SEED)
    out.mkdir(parents=True, exist_ok=True)
    kept_out = {fold} | ({validation} if validation else set())
    outside = sorted(set().union(*dealt) - set().union(*(dealt[k - 1] for k in kept_out)))
    name = f"fold{fold}_train_min{min_photos}" + (f"_without_fold{validation}" if validation else "")
    train_list = write_train_list(root, outside, min_photos, out / f"{name}.csv")
    pairs_csv = write_pairs(root, rows, fold, out / f"fold{fold}_pairs.csv")
    validation_csv = (
        write_pairs(root, rows, validation, out / f"fold{validation}_pairs.csv") if validation else None
    )
    return train_list, pairs_csv, validation_csv


def chosen_by_validation(row: dict, run: Path, validation: int, pairs_csv: Path) -> dict:
    """A --validate run's row: fold k's figures of best/ (chosen on the validation fold, which the run
    verified), of its last step as last_*, and the validation fold's as validation_*."""
    summary = json.loads((run / "summary.json").read_text())
    figures = ("accuracy", "auc", "tar_far_1e-2")
    chosen = {f"validation_{key}": row.pop(key) for key in figures}
    chosen["validation_fold"], chosen["best_step"] = validation, summary["best_step"]
    best = pick_figures(verify_extra(run / "checkpoints" / "best", run / "eval_best", pairs_csv))
    if summary["best_step"] == summary["steps"]:  # best/ is the last step: one checkpoint, verified once
        last = best
    else:
        last = pick_figures(verify_extra(run, run / "eval_last", pairs_csv))
    return {**row, **best, **{f"last_{key}": value for key, value in last.items()}, **chosen}


def main() -> None:
    parser = row_parser(__doc__, "foldK_seedS", "lfw_small.yaml", [0, 1], "ablate_celeba")
    parser.add_argument("--folds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--source", type=Path, default=CELEBA_DEV, help="the folder the folds are dealt from")
    parser.add_argument(
        "--celeba", type=Path, default=REPO / "runs" / "celeba_dev_aligned", help="aligned copy"
    )
    parser.add_argument(
        "--min-photos", type=int, default=2, help="train on people with at least this many photos"
    )
    parser.add_argument(
        "--zero-shot", type=Path, metavar="CHECKPOINT", help="verify this checkpoint, no training"
    )
    parser.add_argument(
        "--lfw", type=Path, help="also verify each run on LFW-dev View 2 folds of this aligned copy"
    )
    parser.add_argument("--lfw-folds", type=int, nargs="+", default=[2, 3])
    parser.add_argument(
        "--train-lfw",
        action="store_true",
        help="also train on the --lfw copy's people outside View 2 fold k, and verify that fold (not --lfw-folds)",
    )
    parser.add_argument(
        "--validate",
        type=int,
        metavar="STEPS",
        help="keep the next fold's people out of training, verify them every STEPS steps to choose best/, "
        "and report best/ on fold k (the last step's figures too, as last_*)",
    )
    args = parser.parse_args()
    if args.validate is not None and (args.validate < 1 or args.zero_shot):
        sys.exit("--validate: a number of steps of at least 1, and a training row (no --zero-shot)")
    if args.train_lfw and (args.lfw is None or args.zero_shot or 1 in args.folds):
        sys.exit("--train-lfw: needs --lfw, no --zero-shot, and folds 2-10 (LFW's fold 1 is held out)")
    if any(not 1 <= fold <= FOLDS for fold in args.folds):
        sys.exit(f"--folds: the protocol has folds 1-{FOLDS}")
    if any(not 2 <= fold <= 10 for fold in args.lfw_folds):
        sys.exit("--lfw-folds: LFW View 2 folds 2-10 are for development (fold 1 is held out)")
    for folder, flag in ((args.source, "--source"), (args.celeba, "--celeba")):
        if not folder.is_dir():
            sys.exit(f"{flag} {folder} does not exist (see this tool's --help for how to make it)")
    if (args.out / args.name).exists():
        sys.exit(f"{args.out / args.name} exists; pick another row name or remove it")
    lfw_pairs = []
    if args.lfw and not args.train_lfw:  # --train-lfw verifies each run's own LFW fold instead
        for fold in args.lfw_folds:
            split = args.out / f"splits_{args.lfw.name}"
            lfw_pairs.append((fold, write_fold_split(args.lfw.resolve(), VIEW2_PAIRS, fold, 2, split)[1]))
    rows = []
    zero_shot_lfw = {  # a pretrained model's LFW figures are the same for every CelebA fold
        fold: pick_figures(verify_extra(args.zero_shot, args.out / args.name / f"eval_lfw_fold{fold}", pairs))
        for fold, pairs in (lfw_pairs if args.zero_shot else [])
    }
    for fold in args.folds:
        split = args.out / f"splits_{args.celeba.name}"
        validation = validation_fold(fold) if args.validate else None
        train_list, pairs_csv, validation_csv = write_celeba_split(
            args.source, args.celeba.resolve(), fold, args.min_photos, split, validation
        )
        if args.train_lfw:
            lfw_list, lfw_fold_pairs = write_fold_split(
                args.lfw.resolve(), VIEW2_PAIRS, fold, args.min_photos, args.out / f"splits_{args.lfw.name}"
            )
            train_list = join_train_lists(
                [train_list, lfw_list],
                split / f"fold{fold}_train_min{args.min_photos}_with_{args.lfw.name}.csv",
            )
            lfw_pairs = [(fold, lfw_fold_pairs)]
        if args.zero_shot:
            report = verify_extra(args.zero_shot, args.out / args.name / f"eval_fold{fold}", pairs=pairs_csv)
            runs = [
                ({"fold": fold, "steps": 0, "train_s": None, **pick_figures(report)}, args.zero_shot, None)
            ]
        else:
            runs = []
        for seed in () if args.zero_shot else args.seeds:
            overrides = [
                "data.source=list",
                f"data.path={train_list}",
                f"eval.pairs={validation_csv or pairs_csv}",
                *([f"eval.every={args.validate}"] if args.validate else []),
                f"train.seed={seed}",
                *args.set,
            ]
            run = args.out / args.name / f"fold{fold}_seed{seed}"
            row = {"fold": fold, "seed": seed, **train_and_verify(args.config, run, overrides, args.nproc)}
            if args.validate:
                row = chosen_by_validation(row, run, validation, pairs_csv)
            runs.append((row, run / "checkpoints" / "best" if args.validate else run, run))
        for row, model, out_dir in runs:
            for lfw_fold, pairs in lfw_pairs:
                if args.zero_shot:
                    figures = zero_shot_lfw[lfw_fold]
                else:
                    figures = pick_figures(verify_extra(model, out_dir / f"eval_lfw_fold{lfw_fold}", pairs))
                prefix = "lfw" if args.train_lfw else f"lfw{lfw_fold}"  # with --train-lfw: the run's own fold
                row.update({f"{prefix}_{key}": value for key, value in figures.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    over = f"folds {args.folds}" + ("" if args.zero_shot else f" x seeds {args.seeds}")
    metrics = ["accuracy", "auc", "tar_far_1e-2"]
    if args.validate:
        metrics += [f"last_{m}" for m in metrics]
    lfw_metrics = (
        [f"lfw_{m}" for m in metrics]
        if args.train_lfw
        else [f"lfw{fold}_{m}" for fold, _ in lfw_pairs for m in metrics]
    )
    figures = summarize(args.name, rows, metrics + lfw_metrics, over)
    record = {"name": args.name, "config": str(args.config), "set": args.set, "figures": figures}
    append_row(args.out / "rows.jsonl", {**record, "runs": rows})


if __name__ == "__main__":
    main()
