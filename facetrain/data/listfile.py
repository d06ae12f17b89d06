"""List-file source: a CSV or TSV with columns path, label and optionally camera.

A header row naming the columns is optional; without one the columns are taken in that order. A
header may say `pid` for `label`, as re-id lists do.
Relative paths resolve against the list file's folder so a dataset can be moved as a whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.data.dataset import PathReader, SampleTable
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError

COLUMNS = ("path", "label", "camera")
LIST_SUFFIXES = (".csv", ".tsv", ".txt")


def _separator(path: Path, first_line: str) -> str:
    if path.suffix.lower() == ".tsv" or "\t" in first_line:
        return "\t"
    return ","


def read_list_file(list_path: str | Path) -> pd.DataFrame:
    """Columns path (absolute), label (int) and camera (int, -1 when absent); one row per image."""
    list_path = Path(list_path)
    try:
        text_lines = list_path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise FacetrainError(f"cannot read list file {list_path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise FacetrainError(
            f"list file {list_path}: not UTF-8 text (byte {error.start}); save it as UTF-8"
        ) from None
    if not any(line.strip() for line in text_lines):
        raise FacetrainError(f"list file {list_path} is empty; expected lines of path,label[,camera]")
    separator = _separator(list_path, text_lines[0])
    first_fields = [field.strip().lower() for field in text_lines[0].split(separator)]
    has_header = "path" in first_fields and bool({"label", "pid"} & set(first_fields))
    try:
        frame = pd.read_csv(
            list_path,
            sep=separator,
            header=0 if has_header else None,
            dtype=str,
            encoding="utf-8",
            keep_default_na=False,
            skip_blank_lines=False,
        )
    except pd.errors.ParserError as error:
        raise FacetrainError(f"list file {list_path}: {str(error).strip()[:200]}") from None
    except pd.errors.EmptyDataError:
        raise FacetrainError(
            f"list file {list_path} lists no images; expected lines of path,label[,camera]"
        ) from None
    if has_header:
        frame.columns = [str(column).strip().lower() for column in frame.columns]
        frame = frame.rename(columns={"pid": "label"})
    else:
        if frame.shape[1] > len(COLUMNS):
            raise FacetrainError(f"list file {list_path} line 1: expected path,label[,camera] columns")
        frame.columns = list(COLUMNS[: frame.shape[1]])
    if "path" not in frame or "label" not in frame:
        raise FacetrainError(f"list file {list_path}: needs the columns path and label")
    first_data_line = 2 if has_header else 1
    frame["line"] = np.arange(len(frame)) + first_data_line
    fields = [column for column in frame.columns if column != "line"]
    blank = (frame[fields].apply(lambda column: column.str.strip()) == "").all(axis=1)
    frame = frame[~blank]
    pathless = frame["path"].str.strip() == ""
    if pathless.any():
        line = frame["line"][pathless].iloc[0]
        raise FacetrainError(
            f"list file {list_path} line {line}: the path is empty; expected path,label[,camera]"
        )
    if frame.empty:
        raise FacetrainError(f"list file {list_path} lists no images")
    result = pd.DataFrame(
        {
            "path": [_resolve(list_path, raw, line) for raw, line in zip(frame["path"], frame["line"])],
            "label": _integers(frame, "label", list_path),
            "camera": _integers(frame, "camera", list_path) if "camera" in frame else -1,
        }
    )
    return result


def _resolve(list_path: Path, raw: str, line: int) -> str:
    path = Path(raw.strip())
    if not path.is_absolute():
        path = list_path.parent / path
    try:
        exists = path.is_file()
    except (OSError, ValueError) as error:  # a name over 255 bytes, a NUL byte
        reason = getattr(error, "strerror", None) or str(error)
        raise FacetrainError(
            f"list file {list_path} line {line}: image path {str(path)[:120]!r}: {reason}"
        ) from None
    if not exists:
        raise FacetrainError(f"list file {list_path} line {line}: image {str(path)[:300]} does not exist")
    return str(path)


def _integers(frame: pd.DataFrame, column: str, list_path: Path) -> np.ndarray:
    values = pd.to_numeric(frame[column].str.strip(), errors="coerce")
    # past 2**53 a float no longer tells integers apart (and 10**20 wrapped to a negative int64)
    bad = values.isna() | (values != values.round()) | ~(values.abs() < 2**53)
    if bad.any():
        row = frame[bad.to_numpy()].iloc[0]
        raise FacetrainError(
            f"list file {list_path} line {row['line']}: {column} {row[column][:40]!r} is not an integer "
            "(of at most 15 digits)"
        )
    return values.to_numpy().astype(np.int64)


def scan_list_file(list_path: str | Path) -> SampleTable:
    """Labels are remapped to 0..C-1 in the order of the list's integer labels."""
    frame = read_list_file(list_path)
    original, labels = np.unique(frame["label"].to_numpy(), return_inverse=True)
    return SampleTable(
        PathReader([Path(p) for p in frame["path"]]),
        labels,
        [str(value) for value in original],
        description=str(list_path),
        cameras=frame["camera"].to_numpy(np.int64),
    )


def is_list_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in LIST_SUFFIXES


register_source(
    "list", DataSource(scan_list_file, "file", "a CSV/TSV list of path,label", recognise=is_list_file)
)
