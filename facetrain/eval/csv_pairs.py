"""A generic pairs CSV: `path1,path2,same`, optionally a fourth `fold` column and a header row.

Relative paths are taken from the image root (default: the CSV's folder) so a pairs file can travel
with its images; `same` accepts 1/0, true/false and yes/no.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from facetrain.errors import FacetrainError
from facetrain.eval.pair_set import PairSet, pair_set_from_paths

HEADER = ("path1", "path2", "same", "fold")
TRUE_WORDS = {"1", "true", "yes", "y", "t"}
FALSE_WORDS = {"0", "false", "no", "n", "f"}
FOLD_NUMBER = re.compile(r"[0-9]{1,7}")
MAX_FOLD = 1_000_000


def load_csv_pairs(path: Path, images_root: Path | None, skip_missing: bool) -> PairSet:
    root = images_root or path.parent
    rows = _read_rows(path)
    if rows and tuple(field.strip().lower() for field in rows[0][1]) == HEADER[: len(rows[0][1])]:
        rows = rows[1:]
    if not rows:
        raise FacetrainError(f"{path}: the pairs CSV has no pairs")
    width = len(rows[0][1])
    paths, issame, folds = [], [], []
    for number, fields in rows:
        if len(fields) not in (3, 4) or len(fields) != width:
            raise FacetrainError(
                f"{path} line {number}: expected path1,path2,same[,fold] like the first line, got {len(fields)} fields"
            )
        paths.append((root / fields[0].strip(), root / fields[1].strip()))
        issame.append(_parse_same(path, number, fields[2]))
        if len(fields) == 4:
            folds.append(_parse_fold(path, number, fields[3]))
    return pair_set_from_paths(path, paths, issame, folds or None, skip_missing)


def _read_rows(path: Path) -> list[tuple[int, list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as file:
            reader = csv.reader(file)
            return [(reader.line_num, fields) for fields in reader if any(field.strip() for field in fields)]
    except OSError as error:
        raise FacetrainError(f"cannot read pairs file {path}: {error.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise FacetrainError(f"{path}: not a readable pairs CSV ({error})") from None


def _parse_same(path: Path, number: int, value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise FacetrainError(
        f"{path} line {number}: 'same' must be 1/0, true/false or yes/no, got {value[:40]!r}"
    )


def _parse_fold(path: Path, number: int, value: str) -> int:
    """A fold number: ASCII digits, at most MAX_FOLD (an int64 array holds the folds, and int() alone
    takes superscripts, underscores and 5000-digit numbers)."""
    if not FOLD_NUMBER.fullmatch(value.strip()) or int(value) > MAX_FOLD:
        raise FacetrainError(
            f"{path} line {number}: 'fold' must be an integer from 0 to {MAX_FOLD}, got {value[:40]!r}"
        )
    return int(value)
