"""One row of docs/accuracy.md's LFW-dev table: train on the people outside a View 2 fold, verify the fold.

LFW's View 2 deals its 6,000 pairs into 10 people-disjoint folds of 300 matched and 300 mismatched
pairs. ../shared/data/lfw_dev holds all of LFW except the people of fold 1, which stays held out for
a check outside the project (this tool refuses it). For a fold k in 2-10 the training set is every
lfw_dev person who appears in no pair of fold k with at least --min-photos photos (default 2;
singletons add classes but measured 4.5 points worse), and the fold's 600 pairs are verified with 10 stratified folds of their own. Each
(fold, seed) is one run of `facetrain train -c CONFIG --set ...` on 2 CPU ranks; the row prints each
run and the mean ± sample standard deviation over all of them, and appends one JSON line to
OUT/rows.jsonl.

The photos are the aligned copy that `facetrain align` makes (the default --lfw); make it once:

    .venv/bin/facetrain align ../shared/data/lfw_dev -o runs/lfw_dev_aligned --fallback center
    .venv/bin/python tools/ablate_lfw.py recipe --folds 2 3 --seeds 0 1
    .venv/bin/python tools/ablate_lfw.py wider --folds 2 --seeds 0 --set model.backbone=small_wide

A pretrained model is scored on the same folds without training by --zero-shot (dlib's ResNet on the
chips of `facetrain align --template dlib`):

    .venv/bin/facetrain import dlib -o runs/dlib_resnet
    .venv/bin/facetrain align ../shared/data/lfw_dev -o runs/lfw_dev_dlib --template dlib --fallback center
    .venv/bin/python tools/ablate_lfw.py dlib_zero_shot --lfw runs/lfw_dev_dlib --zero-shot runs/dlib_resnet

--orl also verifies every run on ORL's balanced s31-s40 pairs (tools/ablate_orl.py's protocol) of a
copy aligned like the training photos: a second set, of other people photographed otherwise, that no
run has seen:

    .venv/bin/facetrain align ../shared/data/orl -o runs/orl_aligned --fallback center
    .venv/bin/python tools/ablate_lfw.py recipe --folds 2 --seeds 0 1 2 --orl runs/orl_aligned
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from protocol import (  # noqa: E402
    REPO,
    SHARED_DATA,
    append_row,
    pick_figures,
    row_parser,
    summarize,
    train_and_verify,
    verify_extra,
    write_train_list,
)

VIEW2_PAIRS = SHARED_DATA / "lfw_pairs.txt"
HELD_OUT_FOLD = 1


def read_view2_folds(pairs_txt: Path) -> list[list[tuple[str, int, str, int, bool]]]:
    """View 2's folds as lists of (person1, image1, person2, image2, same)."""
    lines = pairs_txt.read_text().split("\n")
    folds_count, per_half = (int(x) for x in lines[0].split())
    rows = [line.split() for line in lines[1:] if line.strip()]
    if len(rows) != folds_count * 2 * per_half:
        sys.exit(
            f"{pairs_txt}: expected {folds_count * 2 * per_half} pairs after the header, got {len(rows)}"
        )
    folds = []
    for fold in range(folds_count):
        chunk = rows[fold * 2 * per_half : (fold + 1) * 2 * per_half]
        pairs = []
        for fields in chunk:
            if len(fields) == 3:
                pairs.append((fields[0], int(fields[1]), fields[0], int(fields[2]), True))
            else:
                pairs.append((fields[0], int(fields[1]), fields[2], int(fields[3]), False))
        folds.append(pairs)
    return folds


def photo(root: Path, person: str, number: int) -> Path:
    matches = sorted((root / person).glob(f"{person}_{number:04d}.*"))
    if not matches:
        sys.exit(f"{root / person}: no photo {number} of {person}; was {root} made from lfw_dev?")
    return matches[0]


def write_fold_split(root: Path, pairs_txt: Path, fold: int, min_photos: int, out: Path) -> tuple[Path, Path]:
    """The training list (people outside `fold`) and the fold's pairs CSV, written under `out`."""
    folds = read_view2_folds(pairs_txt)
    verified = folds[fold - 1]
    fold_people = {pair[0] for pair in verified} | {pair[2] for pair in verified}
    out.mkdir(parents=True, exist_ok=True)
    train_list = out / f"fold{fold}_train_min{min_photos}.csv"
    people = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in fold_people)
    write_train_list(root, people, min_photos, train_list)
    pairs_csv = out / f"fold{fold}_pairs.csv"
    with pairs_csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path1", "path2", "same"])
        for person1, image1, person2, image2, same in verified:
            left, right = photo(root, person1, image1), photo(root, person2, image2)
            writer.writerow([left.resolve(), right.resolve(), int(same)])
    return train_list, pairs_csv


def main() -> None:
    parser = row_parser(__doc__, "foldK_seedS", "lfw_small.yaml", [0, 1], "ablate_lfw")
    parser.add_argument("--folds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--lfw", type=Path, default=REPO / "runs" / "lfw_dev_aligned")
    parser.add_argument("--pairs", type=Path, default=VIEW2_PAIRS, help="LFW View 2 pairs.txt")
    parser.add_argument(
        "--min-photos", type=int, default=2,
        help="train on people with at least this many photos (1: singletons too, measured worse)",
    )  # fmt: skip
    parser.add_argument(
        "--zero-shot",
        type=Path,
        metavar="CHECKPOINT",
        help="verify this checkpoint on each fold, no training",
    )
    parser.add_argument(
        "--orl", type=Path, help="also verify each run on ORL s31-s40's balanced pairs of this aligned copy"
    )
    args = parser.parse_args()
    if HELD_OUT_FOLD in args.folds:
        sys.exit(f"fold {HELD_OUT_FOLD} is held out for the outside check: develop on folds 2-10")
    if any(not 2 <= fold <= 10 for fold in args.folds):
        sys.exit("--folds: View 2 has folds 1-10, and 2-10 are for development")
    if not args.lfw.is_dir():
        sys.exit(
            f"{args.lfw} does not exist: make it with `facetrain align ../shared/data/lfw_dev -o {args.lfw}`"
        )
    if (args.out / args.name).exists():
        sys.exit(f"{args.out / args.name} exists; pick another row name or remove it")
    if args.orl and args.zero_shot:
        sys.exit(
            "--orl checks trained runs; score a checkpoint on ORL once with "
            "`facetrain eval CHECKPOINT --pairs ORL_PAIRS.csv` (tools/ablate_orl.py writes the pairs)"
        )
    orl_pairs = None
    if args.orl:
        from ablate_orl import write_orl_split

        orl = args.orl.resolve()
        orl_pairs = write_orl_split(orl, args.out / f"split_{orl.name}")[1]
    rows = []
    for fold in args.folds:
        train_list, pairs_csv = write_fold_split(
            args.lfw.resolve(), args.pairs, fold, args.min_photos, args.out / f"splits_{args.lfw.name}"
        )
        if args.zero_shot:
            report = verify_extra(args.zero_shot, args.out / args.name / f"eval_fold{fold}", pairs=pairs_csv)
            row = {"fold": fold, "steps": 0, "train_s": None, **pick_figures(report)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        for seed in args.seeds:
            overrides = [
                "data.source=list",
                f"data.path={train_list}",
                f"eval.pairs={pairs_csv}",
                f"train.seed={seed}",
                *args.set,
            ]
            run = args.out / args.name / f"fold{fold}_seed{seed}"
            row = {"fold": fold, "seed": seed, **train_and_verify(args.config, run, overrides, args.nproc)}
            if orl_pairs is not None:
                orl_figures = pick_figures(verify_extra(run, run / "eval_orl", orl_pairs))
                row.update({f"orl_{key}": value for key, value in orl_figures.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    over = f"folds {args.folds}" + ("" if args.zero_shot else f" x seeds {args.seeds}")
    metrics = ["accuracy", "auc", "tar_far_1e-2"]
    figures = summarize(args.name, rows, metrics + [f"orl_{m}" for m in metrics if orl_pairs], over)
    record = {"name": args.name, "config": str(args.config), "set": args.set, "figures": figures}
    append_row(args.out / "rows.jsonl", {**record, "runs": rows})


if __name__ == "__main__":
    main()
