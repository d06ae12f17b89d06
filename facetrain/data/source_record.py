"""What a training data source is (`data.source`), in one record registered beside its reader.

A record holds everything the rest of facetrain asks of a source: how to scan `data.path` into a
`SampleTable`, whether that path is a file or a folder, the one line a message uses to say what it
must be, and how `facetrain data` recognises a path of its kind. A new source is one reader file
that registers its record and one import in `facetrain.data.sources`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from facetrain.registry import Registry

if TYPE_CHECKING:
    from facetrain.data.dataset import SampleTable


@dataclass(frozen=True)
class DataSource:
    """One source; calling it scans a path, so `SOURCES.build(name, path)` returns the sample table."""

    scan: Callable[[str], SampleTable]
    # what data.path must be: "file", "folder", or None where either is read
    path_kind: Literal["file", "folder"] | None
    # what data.path is, for messages: "a CSV/TSV list of path,label"
    description: str
    # True for a path of this source's own form (`facetrain data` guesses --source from it)
    recognise: Callable[[Path], bool] | None = None
    # read a path of its path_kind that no source recognises (a plain image folder)
    fallback: bool = False
    # a run generates the set on first use: the config check does not look for it and `facetrain data`
    # does not offer it
    made_by_the_run: bool = False

    def __call__(self, path: str) -> SampleTable:
        return self.scan(path)


SOURCES: Registry[SampleTable] = Registry("data source")


def register_source(name: str, source: DataSource) -> None:
    SOURCES.register(name)(source)


def source_record(name: str) -> DataSource:
    """The record of a registered source (`SOURCES.get` raises the one-line error for another name)."""
    record = SOURCES.get(name)
    assert isinstance(record, DataSource), f"data source {name!r} is registered without its record"
    return record


def inspectable_sources() -> list[str]:
    """The sources `facetrain data --source` reads: every one a user's path holds."""
    return [name for name in SOURCES.names() if not source_record(name).made_by_the_run]
