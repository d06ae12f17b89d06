"""Checkpoints of facetrain's first format, read as today's: the one conversion path.

The first format (until the `facetrain.checkpoint` package) had flat keys of its own: `backbone/K`
(the weight average when `trained/backbone/K` held the trained weights), each rank's head rows under
`head/weight/<start>-<count>` and `optim/head/<state>/<start>-<count>`, `optim/backbone/<param>/<state>`,
`scaler/<x>` and `rng/<rank>/<device>`. Each entry was one chunk of one data file, so renaming the index
is enough: class ranges become chunks of one tensor at their row offsets, which DCP reads and reshards
like any checkpoint's. Nothing on disk changes.
"""

from __future__ import annotations

from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from facetrain.checkpoint.names import BACKBONE, EMA, HEAD_STATE, HEAD_WEIGHT, OPTIM_STATE, PREFIX

_TRAINED = "trained/backbone/"


def _renamed(key: str, averaged: bool) -> tuple[str, int | None]:
    """Today's key for a first-format one, and the first row of a class-range entry (else None)."""
    start, _, count = key.rsplit("/", 1)[-1].partition("-")
    first_row = int(start) if start.isdigit() and count.isdigit() else None
    base = key.rsplit("/", 1)[0] if first_row is not None else key
    if base == "head/weight":
        return HEAD_WEIGHT, first_row
    if base.startswith("optim/head/"):
        return HEAD_STATE + base[len("optim/head/") :], first_row
    if base.startswith("optim/backbone/"):
        return OPTIM_STATE + "backbone." + base[len("optim/backbone/") :].replace("/", "."), None
    if base.startswith(_TRAINED):
        return BACKBONE + base[len(_TRAINED) :], None
    if base.startswith("backbone/"):
        return (EMA if averaged else BACKBONE) + base[len("backbone/") :], None
    return PREFIX + base.replace("/", "."), None  # scaler/scale, rng/0/torch


def upgrade_first_format(metadata: Metadata) -> Metadata:
    """The index of a first-format checkpoint under today's keys, pointing at the same bytes; today's
    index as it is."""
    if any(key.startswith(PREFIX) for key in metadata.state_dict_metadata):
        return metadata
    averaged = any(key.startswith(_TRAINED) for key in metadata.state_dict_metadata)
    entries: dict[str, TensorStorageMetadata] = {}
    offsets: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, old in metadata.state_dict_metadata.items():
        if not isinstance(old, TensorStorageMetadata):
            continue
        name, first_row = _renamed(key, averaged)
        if first_row is None:
            entries[name], offsets[key] = old, (name, tuple(old.chunks[0].offsets))
            continue
        offset = (first_row, *([0] * (len(old.size) - 1)))
        merged = entries.setdefault(name, TensorStorageMetadata(old.properties, old.size, []))
        merged.chunks.append(ChunkStorageMetadata(offsets=type(old.size)(offset), sizes=old.size))
        rows = max(merged.size[0], first_row + old.size[0])
        merged.size = type(old.size)((rows, *old.size[1:]))
        offsets[key] = (name, offset)
    storage = {
        MetadataIndex(*offsets[k.fqn]): v for k, v in metadata.storage_data.items() if k.fqn in offsets
    }
    return Metadata(state_dict_metadata=entries, planner_data=None, storage_data=storage)
