"""torch.distributed.checkpoint reads and writes, without ever unpickling an arbitrary object.

DCP stores tensors with weights-only serialization, but pickles its `.metadata` index. The reader here
unpickles that index with an allow-list of DCP's own metadata classes, so a tampered checkpoint is
refused instead of running code. Every entry facetrain writes is a plain tensor under a flat key.

A damaged checkpoint (a data file cut short by a full disk or a crash, or rewritten by someone) is
reported in one line naming the file: `find_damage` compares each data file with the byte ranges the
index says it holds, without reading the tensors, and `load_tensors` reads one file at a time so a
failure names its file.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
import warnings
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from facetrain.errors import FacetrainError

_ALLOWED_MODULE_PREFIXES = ("torch.distributed.checkpoint.",)
_ALLOWED_GLOBALS = {
    ("torch", "Size"),
    ("torch", "float32"),
    ("torch", "float64"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
    ("torch", "int64"),
    ("torch", "int32"),
    ("torch", "uint8"),
    ("torch", "bool"),
    ("torch", "strided"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith(_ALLOWED_MODULE_PREFIXES) or (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


class SafeFileSystemReader(FileSystemReader):
    """A DCP reader whose metadata index is unpickled with an allow-list."""

    def read_metadata(self) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except OSError as error:
            raise FacetrainError(f"cannot read checkpoint index {path}: {error.strerror}") from None
        except (pickle.UnpicklingError, AttributeError, EOFError) as error:
            raise FacetrainError(f"refusing checkpoint index {path}: {error}") from None
        if not isinstance(metadata, Metadata):
            raise FacetrainError(f"{path} is not a torch.distributed.checkpoint index")
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


def save_tensors(tensors: dict[str, torch.Tensor], directory: Path, process_group=None) -> None:
    """Collective: every rank passes its entries; keys held by several ranks are written once.

    When writing fails on any rank, every rank raises an OSError saying why: the rank's own error, or
    ENOSPC when the disk has less room left than this rank's tensors need (torch's zip writer reports a
    full disk only as "unexpected pos")."""
    distributed = dist.is_available() and dist.is_initialized()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        try:
            dcp.save(
                tensors, checkpoint_id=str(directory), process_group=process_group, no_dist=not distributed
            )
        except CheckpointException as error:
            failure = first_failure(error)
            if isinstance(failure, OSError):
                raise failure from None
            needed = sum(t.numel() * t.element_size() for t in tensors.values())
            if shutil.disk_usage(directory if directory.exists() else directory.parent).free < needed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory)) from None
            raise OSError(errno.EIO, f"writing failed ({failure})", str(directory)) from None


def read_index(directory: Path) -> Metadata:
    """The checkpoint's index, read once per version of the file (loading asks for it per tensor group)."""
    try:
        version = (directory / ".metadata").stat().st_mtime_ns
    except OSError:
        version = None
    return _read_index(str(directory), version)


@lru_cache(maxsize=8)
def _read_index(directory: str, version: int | None) -> Metadata:
    return SafeFileSystemReader(directory).read_metadata()


def tensor_index(directory: Path) -> dict[str, TensorStorageMetadata]:
    """Key -> (size, dtype) of every tensor in a checkpoint."""
    metadata = read_index(directory)
    return {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def _files_of_keys(metadata: Metadata, keys: list[str]) -> dict[str, list[str]]:
    """Data file name -> the keys stored in it (a key lives in one file: every entry is one chunk)."""
    wanted, files = set(keys), defaultdict(list)
    for item, storage in metadata.storage_data.items():
        if item.fqn in wanted:
            wanted.discard(item.fqn)
            files[storage.relative_path].append(item.fqn)
    return dict(files)


def find_damage(directory: Path) -> str | None:
    """Why the checkpoint cannot be read, or None: its index is unreadable, or a data file is missing
    or shorter than the bytes the index places in it. Reads file sizes only, so it is cheap."""
    try:
        metadata = read_index(directory)
    except FacetrainError as error:
        return str(error)
    needed: dict[str, int] = defaultdict(int)
    for storage in metadata.storage_data.values():
        needed[storage.relative_path] = max(needed[storage.relative_path], storage.offset + storage.length)
    for name, size in sorted(needed.items()):
        path = directory / name
        if not path.is_file():
            return f"data file {path} is missing"
        if path.stat().st_size < size:
            return f"data file {path} is cut short ({path.stat().st_size} of {size} bytes)"
    return None


def first_failure(error: CheckpointException) -> BaseException:
    """The exception a rank met inside DCP, which wraps each rank's with its traceback."""
    failure = next(iter(error.failures.values()), error)
    return failure[0] if isinstance(failure, tuple) else failure


def load_tensors(directory: Path, keys: list[str], index: dict[str, TensorStorageMetadata] | None = None):
    """Read the named tensors on this rank alone (no collectives), so ranks may read different keys."""
    index = tensor_index(directory) if index is None else index
    missing = [k for k in keys if k not in index]
    if missing:
        raise FacetrainError(
            f"checkpoint {directory} has no entry {missing[0]}; was it written by facetrain?"
        )
    tensors = {k: torch.empty(index[k].size, dtype=index[k].properties.dtype) for k in keys}
    if not tensors:
        return tensors
    for name, file_keys in _files_of_keys(read_index(directory), keys).items():
        path = directory / name
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=".*assuming the intent is to load in a single process"
                )
                warnings.filterwarnings("ignore", message=".*pickle protocol")
                dcp.load(
                    {k: tensors[k] for k in file_keys},
                    storage_reader=SafeFileSystemReader(str(directory)),
                    no_dist=True,
                )
        except CheckpointException as error:
            failure = first_failure(error)
            if isinstance(failure, pickle.UnpicklingError):
                raise FacetrainError(
                    f"refusing checkpoint data {path}: it holds something other than plain tensors "
                    "(tampered or not written by facetrain); use another checkpoint"
                ) from None
            reason = failure.strerror if isinstance(failure, OSError) else type(failure).__name__
            raise FacetrainError(
                f"cannot read checkpoint data {path} ({reason}): the file is damaged; use another checkpoint"
            ) from None
    return tensors
