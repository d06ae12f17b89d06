"""The training data sources by name (`data.source`): each reader module registers its record.

Importing this module imports every reader, so `SOURCES` holds them all; a new source is its reader
file (with its `register_source` call) and one import line here.
"""

from __future__ import annotations

from facetrain.data.folder import scan_image_folder
from facetrain.data.listfile import scan_list_file
from facetrain.data.market1501 import scan_market1501_train
from facetrain.data.recordio import scan_recordio
from facetrain.data.reid_images import scan_reid_train
from facetrain.data.source_record import SOURCES, DataSource, inspectable_sources, source_record
from facetrain.data.synthetic_source import scan_synthetic_set

# imported for their registrations
READERS = (
    scan_image_folder,
    scan_list_file,
    scan_market1501_train,
    scan_recordio,
    scan_reid_train,
    scan_synthetic_set,
)

__all__ = ["READERS", "SOURCES", "DataSource", "inspectable_sources", "source_record"]
