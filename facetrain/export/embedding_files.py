"""Writing embeddings to .npy, .parquet or .csv, chosen by the output's extension.

Tables have a `path` column then one float column per dimension (`e0`, `e1`, ...), which every
dataframe library reads without facetrain. A .npy holds only the matrix, so the image paths go to a
`.paths.txt` beside it, one per row in the same order.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.errors import FacetrainError
from facetrain.files import atomic_target, atomic_write_text, refuse_to_overwrite
from facetrain.registry import Registry

EmbeddingWriter = Callable[[Path, list[str], np.ndarray], list[Path]]
EMBEDDING_WRITERS: Registry[list[Path]] = Registry("embeddings file extension")


def paths_file(out: Path) -> Path:
    return out.with_name(out.stem + ".paths.txt")


def _table(names: list[str], embeddings: np.ndarray) -> pd.DataFrame:
    columns = {f"e{index}": embeddings[:, index] for index in range(embeddings.shape[1])}
    return pd.DataFrame({"path": names, **columns})


def _require_parquet_engine(out: Path) -> None:
    if importlib.util.find_spec("pyarrow") is None and importlib.util.find_spec("fastparquet") is None:
        raise FacetrainError(
            f"{out}: writing parquet needs pyarrow (pip install pyarrow); or write .npy or .csv"
        )


@EMBEDDING_WRITERS.register(".npy")
def write_npy(out: Path, names: list[str], embeddings: np.ndarray) -> list[Path]:
    with atomic_target(out) as tmp, tmp.open("wb") as handle:
        np.save(handle, embeddings)
    atomic_write_text(paths_file(out), "".join(f"{name}\n" for name in names))
    return [out, paths_file(out)]


@EMBEDDING_WRITERS.register(".csv")
def write_csv(out: Path, names: list[str], embeddings: np.ndarray) -> list[Path]:
    with atomic_target(out) as tmp:
        _table(names, embeddings).to_csv(tmp, index=False, float_format="%.8g")
    return [out]


@EMBEDDING_WRITERS.register(".parquet")
def write_parquet(out: Path, names: list[str], embeddings: np.ndarray) -> list[Path]:
    with atomic_target(out) as tmp:
        _table(names, embeddings).to_parquet(tmp, index=False)
    return [out]


def embeddings_writer(out: Path, overwrite: bool = False) -> Callable[[list[str], np.ndarray], list[Path]]:
    """Check `out` before any work is done, and return `write(names, embeddings) -> files written`."""
    suffix = out.suffix.lower()
    if suffix not in EMBEDDING_WRITERS:
        raise FacetrainError(
            f"-o {out}: unknown format {out.suffix!r}; use one of {', '.join(EMBEDDING_WRITERS)}"
        )
    if suffix == ".parquet":
        _require_parquet_engine(out)
    if not overwrite:
        refuse_to_overwrite([out, paths_file(out)] if suffix == ".npy" else [out])
    writer: EmbeddingWriter = EMBEDDING_WRITERS.get(suffix)

    def write(names: list[str], embeddings: np.ndarray) -> list[Path]:
        out.parent.mkdir(parents=True, exist_ok=True)
        return writer(out, names, embeddings)

    return write
