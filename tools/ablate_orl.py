"""One row of docs/accuracy.md's ablation table: train on ORL s1-s30, verify on held-out s31-s40.

Each seed trains `facetrain train -c CONFIG --set ...` on 2 CPU ranks with train.seed = the seed and
is verified on the balanced pairs of s31-s40 (all 450 matched pairs, 450 mismatched ones sampled with
seed 0, 10 stratified folds: the protocol of tests/test_train_learns.py, which imports the split from
here so that the two cannot drift). The row prints each seed's accuracy, AUC, steps and training wall
time, then the mean and the sample standard deviation over the seeds, and appends it as one JSON line
to OUT/rows.jsonl. `--all-pairs` also scores all 4,950 held-out pairs (91 % mismatched) beside the
balanced figure; `--folder ROOT` also verifies on balanced pairs of another folder of identities, and
`--train-folder ROOT` trains on a folder of identities instead of ORL s1-s30 (checks that a setting
generalises beyond ORL; the ORL pairs then measure a model that never saw an ORL photo). `--orl DIR`
runs the protocol on a copy of ORL made by `facetrain align` (K.png instead of K.pgm).

    .venv/bin/python tools/ablate_orl.py baseline
    .venv/bin/python tools/ablate_orl.py erasing --set data.augment.random_erasing=0.5
    .venv/bin/python tools/ablate_orl.py recipe --all-pairs
    .venv/bin/python tools/ablate_orl.py lfw_recipe --train-folder lfw_aligned --folder ../shared/data/johns
    .venv/bin/python tools/ablate_orl.py aligned --orl runs/orl_aligned --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from protocol import (  # noqa: E402
    SHARED_DATA,
    append_row,
    row_parser,
    summarize,
    train_and_verify,
    verify_extra,
)

ORL = SHARED_DATA / "orl"
TRAIN_SUBJECTS = range(1, 31)
HELD_OUT_SUBJECTS = range(31, 41)


def write_orl_split(orl: Path, out: Path) -> tuple[Path, Path, Path]:
    """Train list: subjects s1-s30. Held out s31-s40 (100 images) scored two ways: balanced pairs (all
    450 matched pairs, 450 mismatched pairs sampled with seed 0, 10 stratified folds), the protocol
    reported, and all 4,950 pairs, 91% mismatched, kept beside it with its all-"different" baseline."""
    from facetrain.eval.pair_making import balanced_pair_set, write_pairs_csv

    out.mkdir(parents=True, exist_ok=True)

    def photo(subject: int, image: int) -> Path:  # ORL's K.pgm, or an aligned copy's K.png
        return next((orl / f"s{subject}").glob(f"{image}.*"))

    train_list = out / "orl_train.csv"
    with train_list.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        for subject in TRAIN_SUBJECTS:
            for image in range(1, 11):
                writer.writerow([photo(subject, image), subject - 1])
    held_out = [(s, photo(s, k)) for s in HELD_OUT_SUBJECTS for k in range(1, 11)]
    balanced = out / "orl_balanced_pairs.csv"
    subjects, paths = zip(*held_out)
    write_pairs_csv(balanced_pair_set(paths, subjects, "orl s31-s40", seed=0), balanced, overwrite=True)
    all_pairs = out / "orl_all_pairs.csv"
    with all_pairs.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path1", "path2", "same"])
        for (s1, p1), (s2, p2) in itertools.combinations(held_out, 2):
            writer.writerow([p1, p2, int(s1 == s2)])
    return train_list, balanced, all_pairs


def train_seed(args: argparse.Namespace, split: tuple[Path, Path, Path], seed: int) -> dict:
    train_list, balanced, all_pairs = split
    run = args.out / args.name / f"seed{seed}"
    source = ["data.source=folder", f"data.path={args.train_folder}"] if args.train_folder else []
    overrides = [
        *(source or ["data.source=list", f"data.path={train_list}"]),
        f"eval.pairs={balanced}",
        f"train.seed={seed}",
        *args.set,
    ]
    row = {"seed": seed, **train_and_verify(args.config, run, overrides, args.nproc)}
    if args.all_pairs:
        everything = verify_extra(run, run / "eval_all_pairs", pairs=all_pairs)
        row["all_pairs_accuracy"] = everything["accuracy"]
        row["all_pairs_baseline"] = everything["baseline_accuracy"]
    for folder in args.folder:
        report = verify_extra(run, run / f"eval_{folder.name}", folder=folder)
        row[f"{folder.name}_accuracy"] = report["accuracy"]
        row[f"{folder.name}_auc"] = report["auc"]
    return row


def main() -> None:
    parser = row_parser(__doc__, "seedS", "orl_small.yaml", [0, 1, 2], "ablate_orl")
    parser.add_argument(
        "--orl", type=Path, default=ORL, help="the ORL root (s1..s40), or its copy by `facetrain align`"
    )
    parser.add_argument(
        "--train-folder", type=Path, help="train on this folder of identities instead of ORL s1-s30"
    )
    parser.add_argument("--all-pairs", action="store_true", help="also score all 4,950 held-out pairs")
    parser.add_argument(
        "--folder", type=Path, action="append", default=[], help="also verify on this folder's pairs"
    )
    args = parser.parse_args()
    if (args.out / args.name).exists():
        sys.exit(f"{args.out / args.name} exists; pick another row name or remove it")
    orl = args.orl.resolve()
    split = write_orl_split(orl, args.out / ("split" if orl == ORL.resolve() else f"split_{orl.name}"))
    rows = []
    for seed in args.seeds:
        row = train_seed(args, split, seed)
        rows.append(row)
        print(json.dumps(row), flush=True)
    metrics = ["accuracy", "auc"] + [k for k in rows[0] if k.endswith(("_accuracy", "_auc"))]
    figures = summarize(args.name, rows, metrics, f"seeds {args.seeds}")
    record = {"name": args.name, "config": str(args.config), "set": args.set, "figures": figures}
    append_row(args.out / "rows.jsonl", {**record, "runs": rows})


if __name__ == "__main__":
    main()
