"""Every file or folder a run's config reads must exist when the config is checked.

A path that is missing would otherwise be found only once the ranks have started, imported torch and
scanned the data, a minute later on a laptop. The folders a run creates (`train.output_dir`, the
synthetic set that `facetrain train` generates on first use) are not looked for.
"""

from __future__ import annotations

from pathlib import Path

from facetrain.config.validate import Problem
from facetrain.data.config import DataConfig
from facetrain.data.sources import source_record
from facetrain.eval.config import EvalConfig
from facetrain.models.config import ModelConfig


def missing_path(data: DataConfig, evaluation: EvalConfig, model: ModelConfig) -> Problem | None:
    """(key, value, what to do) for the first path the config reads that is not there, else None."""
    if not source_record(data.source).made_by_the_run:
        problem = _data_path_problem(data.source, Path(data.path))
        if problem is not None:
            return "data.path", data.path, problem
    several = isinstance(evaluation.pairs, list)
    for index, pairs in enumerate(evaluation.pairs_files()):
        if not _made_by_the_run(data, pairs) and not Path(pairs).is_file():
            key = f"eval.pairs[{index}]" if several else "eval.pairs"
            fix = "drop it from eval.pairs" if several else "set eval.pairs=null"
            return key, pairs, _absent(pairs, "file", f"{fix} or give the file")
    if evaluation.images is not None and not _made_by_the_run(data, evaluation.images):
        if not Path(evaluation.images).is_dir():
            return (
                "eval.images",
                evaluation.images,
                _absent(
                    evaluation.images,
                    "folder",
                    "set eval.images=null (the pairs file's folder) or give the folder",
                ),
            )
    if model.init is not None and not Path(model.init).exists():
        return "model.init", model.init, "does not exist; pass a checkpoint, a run or an export directory"
    return None


def _data_path_problem(source: str, path: Path) -> str | None:
    kind = source_record(source).path_kind
    what = source_record(source).description
    if not path.exists():
        return f"does not exist; give {what}: --set data.path=PATH"
    if (kind == "folder" and not path.is_dir()) or (kind == "file" and not path.is_file()):
        return f"is not a {kind}; data.source {source!r} reads {what}"
    return None


def _absent(path: str, kind: str, fix: str) -> str:
    return f"{f'is not a {kind}' if Path(path).exists() else 'does not exist'}; {fix}"


def _made_by_the_run(data: DataConfig, path: str) -> bool:
    """A path inside the synthetic set that the trainer will generate before it reads it."""
    if data.source != "synthetic" or (Path(data.path) / "train").is_dir():
        return False
    return Path(path).resolve().is_relative_to(Path(data.path).resolve())
