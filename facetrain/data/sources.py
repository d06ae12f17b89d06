"""The training data sources by name (`data.source`): each reads `data.path` into a `SampleTable`."""

from __future__ import annotations

from pathlib import Path

from facetrain.data.dataset import SampleTable
from facetrain.data.folder import scan_image_folder
from facetrain.data.listfile import scan_list_file
from facetrain.data.market1501 import scan_market1501_train
from facetrain.data.recordio import scan_recordio
from facetrain.data.reid_images import scan_reid_train
from facetrain.errors import FacetrainError
from facetrain.registry import Registry

SOURCES: Registry[SampleTable] = Registry("data source")


@SOURCES.register("folder")
def _folder(path: str) -> SampleTable:
    return scan_image_folder(path)


@SOURCES.register("list")
def _list(path: str) -> SampleTable:
    return scan_list_file(path)


@SOURCES.register("recordio")
def _recordio(path: str) -> SampleTable:
    return scan_recordio(path)


@SOURCES.register("market1501")
def _market(path: str) -> SampleTable:
    return scan_market1501_train(path)


@SOURCES.register("reid")
def _reid(path: str) -> SampleTable:
    return scan_reid_train(path)


@SOURCES.register("synthetic")
def _synthetic(path: str) -> SampleTable:
    train = Path(path) / "train"
    if not train.is_dir():
        raise FacetrainError(
            f"no synthetic set at {path}: run `facetrain synth -o {path}` (facetrain train makes it itself)"
        )
    return scan_image_folder(train)
