"""Opening any supported pairs file, chosen by its extension."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from facetrain.errors import FacetrainError
from facetrain.eval.csv_pairs import load_csv_pairs
from facetrain.eval.insightface_bin import load_insightface_bin
from facetrain.eval.lfw_pairs import load_lfw_pairs
from facetrain.eval.pair_set import PairSet
from facetrain.registry import Registry

PAIR_FORMATS: Registry[PairSet] = Registry("pairs file extension")
PAIR_FORMATS.register(".txt")(load_lfw_pairs)
PAIR_FORMATS.register(".csv")(load_csv_pairs)
PAIR_FORMATS.register(".bin")(load_insightface_bin)

PairLoader = Callable[[Path, Path | None, bool], PairSet]


def load_pairs(
    path: str | Path, images_root: str | Path | None = None, skip_missing: bool = False
) -> PairSet:
    """LFW pairs.txt, a pairs CSV or an insightface .bin, with every referenced image checked.

    Missing images raise one FacetrainError with their count and the first few paths, unless
    `skip_missing`, which drops the pairs that use them and records what was dropped in the PairSet.
    """
    path = Path(path)
    if not path.is_file():
        raise FacetrainError(f"pairs file {path} does not exist")
    root = None if images_root is None else Path(images_root)
    if root is not None and not root.is_dir():
        raise FacetrainError(f"image root {root} is not a folder")
    if path.suffix.lower() not in PAIR_FORMATS:
        raise FacetrainError(
            f"{path}: unknown pairs format {path.suffix!r}; use one of {', '.join(PAIR_FORMATS.names())}"
        )
    loader: PairLoader = PAIR_FORMATS.get(path.suffix.lower())
    return loader(path, root, skip_missing)
