"""How a verification set is named: by its file's stem, as insightface names lfw.bin "lfw"; the report
files `facetrain eval` writes add the file's folder and a hash of its path, since they share a folder.

Kept free of torch, because the eval section's checks use it (`eval.best_by` must name one of `eval.pairs`'s
sets) before any process or model exists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

KEPT_PAIRS_SUFFIX = ".pairs"


def report_name(pairs_source: str | Path) -> str:
    """The pairs file's (or `--folder`'s) stem, which names the report files (lfw_pairs.json, ...). The
    pairs that `eval --folder NAME` keeps, NAME.pairs.csv, name them NAME as that evaluation did:
    scoring them again (with --overwrite) replaces its report instead of writing a near-twin beside it."""
    return Path(pairs_source).stem.removesuffix(KEPT_PAIRS_SUFFIX)


def report_file_name(pairs_source: str | Path) -> str:
    """The name of `facetrain eval`'s report files for `pairs_source`: its parent folder and stem, readable,
    and a short hash of its resolved path, so two files called pairs.txt never share a report and no report
    takes the name of the trainer's own files in RUN/eval (step_*.json). Kept pairs (NAME.pairs.csv) are
    already named so: scoring them again replaces the report of the evaluation that kept them."""
    path = Path(pairs_source)
    if path.stem.endswith(KEPT_PAIRS_SUFFIX):
        return report_name(path)
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:6]
    return f"{resolved.parent.name or 'root'}-{report_name(path)}-{digest}"


def set_names(pairs_files: Sequence[str | Path]) -> list[str]:
    """The name of each verification set, in order (duplicates are left for the caller to refuse)."""
    return [report_name(path) for path in pairs_files]


def duplicate_name(pairs_files: Sequence[str | Path]) -> tuple[str, list[str]] | None:
    """(name, the files) for the first name two of `pairs_files` share, else None: two sets named alike
    would log, report and be chosen by `eval.best_by` as one."""
    by_name: dict[str, list[str]] = {}
    for path, name in zip(pairs_files, set_names(pairs_files)):
        by_name.setdefault(name, []).append(str(path))
    return next(((name, files) for name, files in by_name.items() if len(files) > 1), None)
