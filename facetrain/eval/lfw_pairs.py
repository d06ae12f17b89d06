"""LFW `pairs.txt` exactly as published, with its folds, and the images it names.

The View 2 file starts with a `folds<TAB>pairs_per_class` header and then holds, per fold, that many
matched lines `name i j` followed by as many mismatched lines `name1 i name2 j`. View 1 files have a
single-number header and no folds (scoring gives them stratified ones). Images sit at `root/name/name_%04d.<ext>` with whatever image
extension is on disk (the official set is .jpg; aligned copies are often .png).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from facetrain.errors import FacetrainError
from facetrain.eval.pair_set import PairSet, pair_set_from_paths

COUNT = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() also takes superscripts, int() does not
MAX_COUNT = 9_999_999
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".webp", ".tif", ".tiff")


class LfwPair(NamedTuple):
    name1: str
    index1: int
    name2: str
    index2: int
    same: bool
    fold: int | None
    line: int


def parse_lfw_pairs(path: str | Path) -> list[LfwPair]:
    """Every pair of an LFW pairs file, checked line by line but without looking for images."""
    lines = _read_lines(path)
    numbered = [(number, line.split()) for number, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise FacetrainError(f"{path}: the pairs file is empty")
    header_line, header = numbered[0]
    pairs_per_fold = None
    if len(header) in (1, 2) and all(field.isdigit() for field in header):
        if not all(COUNT.fullmatch(field) and int(field) > 0 for field in header):
            raise FacetrainError(
                f"{path} line {header_line}: the header must be N (pairs of each kind) or FOLDS N, each a "
                f"number from 1 to {MAX_COUNT}, got {' '.join(header)[:40]!r}"
            )
        numbered = numbered[1:]
        folds, per_class = (1, int(header[0])) if len(header) == 1 else (int(header[0]), int(header[1]))
        if len(numbered) != folds * 2 * per_class:
            raise FacetrainError(
                f"{path} line {header_line}: the header promises {folds} x 2 x {per_class} pairs "
                f"but the file has {len(numbered)}; fix the header or the pair lines"
            )
        if folds > 1:
            pairs_per_fold = 2 * per_class
    return [
        _parse_line(path, number, fields, None if pairs_per_fold is None else position // pairs_per_fold)
        for position, (number, fields) in enumerate(numbered)
    ]


def load_lfw_pairs(path: Path, images_root: Path | None, skip_missing: bool) -> PairSet:
    """The pairs with their images found under `images_root` (default: the pairs file's folder)."""
    pairs = parse_lfw_pairs(path)
    finder = _ImageFinder(images_root or path.parent)
    paths = [(finder.find(pair.name1, pair.index1), finder.find(pair.name2, pair.index2)) for pair in pairs]
    folds = None if pairs[0].fold is None else [pair.fold for pair in pairs]
    return pair_set_from_paths(path, paths, [pair.same for pair in pairs], folds, skip_missing)


def _read_lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise FacetrainError(f"cannot read pairs file {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise FacetrainError(f"{path}: not a text pairs file (it is not UTF-8)") from None


def _parse_line(path: str | Path, number: int, fields: list[str], fold: int | None) -> LfwPair:
    if len(fields) == 3:
        name1, index1, index2 = fields
        name2 = name1
    elif len(fields) == 4:
        name1, index1, name2, index2 = fields
    else:
        raise FacetrainError(
            f"{path} line {number}: expected 'name i j' or 'name1 i name2 j', got {len(fields)} fields"
        )
    if not (COUNT.fullmatch(index1) and COUNT.fullmatch(index2)):
        raise FacetrainError(
            f"{path} line {number}: image numbers must be positive integers, got {index1[:20]!r} and {index2[:20]!r}"
        )
    return LfwPair(name1, int(index1), name2, int(index2), len(fields) == 3, fold, number)


class _ImageFinder:
    """Finds `root/name/name_%04d.<ext>`, listing each person's folder once instead of globbing per image."""

    def __init__(self, root: Path):
        self.root = root
        self._folders: dict[str, dict[str, str]] = {}

    def find(self, name: str, index: int) -> Path:
        stem = f"{name}_{index:04d}"
        filename = self._listing(name).get(stem)
        return self.root / name / (filename or f"{stem}.*")

    def _listing(self, name: str) -> dict[str, str]:
        if name not in self._folders:
            try:
                entries = sorted(os.listdir(self.root / name))
            except (OSError, ValueError):  # missing, or a name with a NUL byte or over 255 bytes
                entries = []
            listing: dict[str, str] = {}
            for entry in entries:
                stem, extension = os.path.splitext(entry)
                if extension.lower() in IMAGE_EXTENSIONS:
                    listing.setdefault(stem, entry)
            self._folders[name] = listing
        return self._folders[name]
