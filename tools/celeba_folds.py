"""The CelebA-dev protocol: people-disjoint folds of balanced verification pairs, built once from the folder.

../shared/data/celeba_dev holds half of the identities of CelebA's first 20,000 photos (the other half
is held out for a check outside the project). LFW's View 2 comes with its folds; CelebA does not, so
this tool deals them the same way: the people (the folders) are shuffled with --seed and dealt into
--folds people-disjoint folds; in each fold, --pairs matched pairs are drawn uniformly, without
repeats, from every pair of two photos of one of the fold's people, and as many mismatched pairs from
every pair of photos of two of its people. A fold's training set is then every person outside it
(tools/ablate_celeba.py, which builds the protocol itself). The same folder, seed and sizes always
give the same folds and pairs, so the protocol is rebuilt instead of committed (CelebA's terms allow no
redistribution); this tool writes it out for inspection or for a check outside the project.

    python tools/celeba_folds.py ../shared/data/celeba_dev -o runs/celeba_dev_folds.csv

The CSV has the columns fold, person1, image1, person2, image2, same: image names relative to their
person's folder, so one protocol serves the folder and every aligned copy of it (`facetrain align`
keeps the names, changing a photo's extension at most).
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from itertools import combinations
from pathlib import Path

COLUMNS = ["fold", "person1", "image1", "person2", "image2", "same"]
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".pgm", ".ppm"}


def people_photos(root: Path) -> dict[str, list[str]]:
    """Each person folder's photo names, sorted; people in name order."""
    people = {}
    for person in sorted(p for p in root.iterdir() if p.is_dir()):
        photos = sorted(
            f.name for f in person.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
        )
        if photos:
            people[person.name] = photos
    return people


def deal_people(people: list[str], folds: int, seed: int) -> list[list[str]]:
    """The people shuffled with `seed` and dealt round-robin into `folds` folds of (nearly) equal size."""
    order = sorted(people)
    random.Random(seed).shuffle(order)
    return [sorted(order[fold::folds]) for fold in range(folds)]


def fold_pairs(photos: dict[str, list[str]], fold_people: list[str], pairs: int, rng: random.Random) -> list:
    """`pairs` matched and as many mismatched pairs of the fold's people (fewer when the fold has fewer
    matched pairs to give), each drawn uniformly without repeats."""
    matched = [
        (person, first, person, second)
        for person in fold_people
        for first, second in combinations(photos[person], 2)
    ]
    chosen = rng.sample(matched, min(pairs, len(matched)))
    images = [(person, image) for person in fold_people for image in photos[person]]
    mismatched: set[tuple[str, str, str, str]] = set()
    possible = (len(images) ** 2 - sum(len(photos[p]) ** 2 for p in fold_people)) // 2
    while len(mismatched) < min(len(chosen), possible):
        (person1, image1), (person2, image2) = rng.sample(images, 2)
        if person1 != person2:
            mismatched.add(tuple(sorted([(person1, image1), (person2, image2)])))  # a pair, either order
    return [(*pair, 1) for pair in sorted(chosen)] + [
        (first[0], first[1], second[0], second[1], 0) for first, second in sorted(mismatched)
    ]


def build_protocol(root: Path, folds: int, pairs: int, seed: int) -> tuple[list[list[str]], list[tuple]]:
    """The people of each fold, and every fold's pairs as rows (fold, person1, image1, person2, image2,
    same), folds numbered from 1."""
    photos = people_photos(root)
    if len(photos) < 2 * folds:
        raise ValueError(f"{root} has {len(photos)} people with photos, too few for {folds} folds")
    rng = random.Random(seed)
    dealt = deal_people(list(photos), folds, seed)
    rows = []
    for number, people in enumerate(dealt, start=1):
        rows.extend((number, *pair) for pair in fold_pairs(photos, people, pairs, rng))
    return dealt, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", type=Path, help="CelebA-dev (or any folder of person folders)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="protocol CSV to write")
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=300, help="matched pairs per fold (as many mismatched)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if not args.root.is_dir():
        sys.exit(f"error: {args.root} is not a folder of person folders")
    if args.out.exists() and not args.overwrite:
        sys.exit(f"error: {args.out} exists; pass --overwrite to replace it")
    try:
        _, rows = build_protocol(args.root, args.folds, args.pairs, args.seed)
    except ValueError as error:
        sys.exit(f"error: {error}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    matched = sum(row[-1] for row in rows)
    print(
        f"wrote {args.out}: {args.folds} folds, {matched} matched and {len(rows) - matched} mismatched pairs"
    )


if __name__ == "__main__":
    main()
