"""The built-in synthetic set as a training source: its `train/` image folder, once generated.

`facetrain train` generates the set on first use (`facetrain.data.prepare_train_data`); this reader
only says how to make it when a run's path holds none.
"""

from __future__ import annotations

from pathlib import Path

from facetrain.data.dataset import SampleTable
from facetrain.data.folder import scan_image_folder
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError


def scan_synthetic_set(path: str) -> SampleTable:
    train = Path(path) / "train"
    if not train.is_dir():
        raise FacetrainError(
            f"no synthetic set at {path}: run `facetrain synth -o {path}` (facetrain train makes it itself)"
        )
    return scan_image_folder(train)


register_source(
    "synthetic",
    DataSource(
        scan_synthetic_set,
        "folder",
        "the synthetic set's folder (train/ and heldout/), made on first use",
        made_by_the_run=True,
    ),
)
