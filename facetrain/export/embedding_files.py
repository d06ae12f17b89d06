"""Writing embeddings to .npy, .parquet or .csv, chosen by the output's extension.

Tables have a `path` column then one float column per dimension (`e0`, `e1`, ...), which every
dataframe library reads without facetrain. A .npy holds only the matrix, so the image paths go to a
`.paths.txt` beside it, one per row in the same order. With the norms (`embed --norms`), tables get a
`norm` column after `path`, and a .npy a `.norms.npy` beside it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.errors import FacetrainError
from facetrain.files import atomic_target, atomic_write_text, refuse_to_overwrite
from facetrain.output_files import refuse_what_is_no_file
from facetrain.registry import Registry

EmbeddingWriter = Callable[[Path, list[str], np.ndarray, "np.ndarray | None"], list[Path]]
EMBEDDING_WRITERS: Registry[list[Path]] = Registry("embeddings file extension")


def paths_file(out: Path) -> Path:
    return out.with_name(out.stem + ".paths.txt")


def norms_file(out: Path) -> Path:
    return out.with_name(out.stem + ".norms.npy")


def _table(names: list[str], embeddings: np.ndarray, norms: np.ndarray | None) -> pd.DataFrame:
    columns = {f"e{index}": embeddings[:, index] for index in range(embeddings.shape[1])}
    return pd.DataFrame({"path": names, **({} if norms is None else {"norm": norms}), **columns})


def _require_parquet_engine(out: Path) -> None:
    if importlib.util.find_spec("pyarrow") is None and importlib.util.find_spec("fastparquet") is None:
        raise FacetrainError(
            f"{out}: writing parquet needs pyarrow (pip install pyarrow); or write .npy or .csv"
        )


@EMBEDDING_WRITERS.register(".npy")
def write_npy(out: Path, names: list[str], embeddings: np.ndarray, norms: np.ndarray | None) -> list[Path]:
    matrices = [(out, embeddings)] + ([] if norms is None else [(norms_file(out), norms)])
    for path, matrix in matrices:
        with atomic_target(path) as tmp, tmp.open("wb") as handle:
            np.save(handle, matrix)
    atomic_write_text(paths_file(out), "".join(f"{name}\n" for name in names))
    return [path for path, _ in matrices[:1]] + [paths_file(out)] + [path for path, _ in matrices[1:]]


@EMBEDDING_WRITERS.register(".csv")
def write_csv(out: Path, names: list[str], embeddings: np.ndarray, norms: np.ndarray | None) -> list[Path]:
    with atomic_target(out) as tmp:
        _table(names, embeddings, norms).to_csv(tmp, index=False, float_format="%.8g")
    return [out]


@EMBEDDING_WRITERS.register(".parquet")
def write_parquet(
    out: Path, names: list[str], embeddings: np.ndarray, norms: np.ndarray | None
) -> list[Path]:
    with atomic_target(out) as tmp:
        _table(names, embeddings, norms).to_parquet(tmp, index=False)
    return [out]


def embeddings_writer(
    out: Path, overwrite: bool = False, with_norms: bool = False
) -> Callable[[list[str], np.ndarray, np.ndarray | None], list[Path]]:
    """Check `out` before any work is done, and return `write(names, embeddings, norms) -> files
    written` (`norms` None unless `with_norms`)."""
    suffix = out.suffix.lower()
    if suffix not in EMBEDDING_WRITERS:
        raise FacetrainError(
            f"-o {out}: unknown format {out.suffix!r}; use one of {', '.join(EMBEDDING_WRITERS)}"
        )
    if suffix == ".parquet":
        _require_parquet_engine(out)
    beside = [paths_file(out), *([norms_file(out)] if with_norms else [])]
    outputs = [out, *beside] if suffix == ".npy" else [out]
    refuse_what_is_no_file(outputs)
    if not overwrite:
        refuse_to_overwrite(outputs)
    writer: EmbeddingWriter = EMBEDDING_WRITERS.get(suffix)

    def write(names: list[str], embeddings: np.ndarray, norms: np.ndarray | None = None) -> list[Path]:
        out.parent.mkdir(parents=True, exist_ok=True)
        return writer(out, names, embeddings, norms if with_norms else None)

    return write
