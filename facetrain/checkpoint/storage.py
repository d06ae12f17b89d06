"""torch.distributed.checkpoint (DCP) reads and writes: safe to open, damage named by file, rows by offset.

DCP stores tensors weights-only but pickles its `.metadata` index: `SafeReader` unpickles it with an
allow-list of DCP's own metadata classes, so a tampered checkpoint is refused instead of running code,
and names the data file any read fails on. Every entry facetrain writes is a plain tensor, flat key.
"""

from __future__ import annotations

import errno
import importlib.util
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
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.stateful import Stateful

from facetrain.checkpoint.legacy import upgrade_first_format
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.files import file_size_limit
from facetrain.input_files import files_in, unchanged_while_read
from facetrain.pickle_scan import far_memo_index

_ALLOWED_GLOBALS = {
    *(("torch", dtype) for dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32")),
    *(("torch", name) for name in ("uint8", "bool", "Size", "strided")),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


class SafeReader(FileSystemReader):
    """A DCP reader whose index is unpickled with an allow-list (and a first-format index renamed to
    today's keys, `facetrain.checkpoint.legacy`), and whose failures name their data file."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_index(Path(self.path))
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner):
        per_file = defaultdict(list)
        for item in plan.items:
            per_file[self.storage_data[item.storage_index].relative_path].append(item)
        for name, items in per_file.items():
            path = Path(self.path) / name
            try:
                super().read_data(LoadPlan(items, plan.storage_data, plan.planner_data), planner).wait()
            except pickle.UnpicklingError:
                raise FacetrainError(
                    f"refusing checkpoint data {path}: it holds something other than plain tensors "
                    "(tampered or not written by facetrain); use another checkpoint"
                ) from None
            except Exception as error:  # noqa: BLE001 - whatever a damaged file makes torch.load raise
                reason = error.strerror if isinstance(error, OSError) else type(error).__name__
                raise FacetrainError(
                    f"cannot read checkpoint data {path} ({reason}): the file is damaged; use another checkpoint"
                ) from None
        done = torch.futures.Future()
        done.set_result(None)
        return done


def read_index(directory: Path) -> Metadata:
    """The checkpoint's index, read once per version of the file."""
    path = directory / ".metadata"
    try:
        return _read_index(path, path.stat().st_mtime_ns)
    except OSError as error:
        raise FacetrainError(f"cannot read checkpoint index {path}: {error.strerror}") from None


@lru_cache(maxsize=8)
def _read_index(path: Path, version: int) -> Metadata:
    """Damaged bytes make an unpickler raise almost anything (UnicodeDecodeError, TypeError, ... found
    by the fuzzer), each the same news: the index is damaged."""
    data = path.read_bytes()
    far_memo = far_memo_index(data)
    if far_memo is not None:
        raise FacetrainError(
            f"refusing checkpoint index {path}: it stores an object at memo slot {far_memo}, beyond any its "
            f"{len(data)} bytes could fill; the file is damaged: use another checkpoint"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, AttributeError, EOFError) as error:
        raise FacetrainError(f"refusing checkpoint index {path}: {str(error)[:200]}") from None
    except Exception as error:  # noqa: BLE001 - whatever damaged bytes make the unpickler raise
        raise FacetrainError(
            f"refusing checkpoint index {path}: it is damaged ({type(error).__name__}); use another checkpoint"
        ) from None
    if not isinstance(metadata, Metadata):
        raise FacetrainError(f"{path} is not a torch.distributed.checkpoint index")
    return upgrade_first_format(metadata)


def stored(directory: Path) -> dict[str, TensorStorageMetadata]:
    """Key -> global size and dtype of every tensor in a checkpoint."""
    entries = read_index(directory).state_dict_metadata
    return {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}


def stored_entries(directory: Path, keys: list[str]) -> dict[str, TensorStorageMetadata]:
    """The index entries of `keys`, read once; the first missing one is a one-line error."""
    index = stored(directory)
    missing = next((key for key in keys if key not in index), None)
    if missing is not None:
        raise FacetrainError(f"checkpoint {directory} has no entry {missing}; was it written by facetrain?")
    return {key: index[key] for key in keys}


def check_row_shards_supported() -> None:
    """Refuse a torch whose DCP predates the `CheckpointableTensor` protocol (torch < 2.14): it would
    store every rank's head rows under one key as if each were the whole tensor, keeping one rank's."""
    if importlib.util.find_spec("torch.distributed.checkpoint.protocol") is None:
        raise EveryRankError(
            f"a head sharded over several ranks needs torch >= 2.14 to checkpoint (this is {torch.__version__}: "
            "its torch.distributed.checkpoint would keep one rank's classes); upgrade torch "
            "(`make install`) or train on one rank"
        )


def rows_of(tensor: torch.Tensor, start: int, total: int) -> torch.Tensor:
    """`tensor` (rows x anything) as rows [start, start + rows) of a `total`-row tensor (torch's
    `CheckpointableTensor` protocol): DCP records where they sit, and a reader gets exactly its rows."""
    if (start, tensor.shape[0]) != (0, total):
        check_row_shards_supported()
    rows = tensor.view(tensor.shape[0], -1)
    rows.global_shape = (total, rows.shape[1])
    rows.global_offsets = ((start, 0),)
    rows.local_offsets = ((0, 0),)
    rows.local_sizes = (tuple(rows.shape),)
    return rows


def save_entries(entries: dict, directory: Path, group=None) -> None:
    """Collective: every rank passes its entries; a key several ranks hold is written once. When writing
    fails on any rank, every rank raises an OSError saying why: the rank's own error, or ENOSPC when the
    disk has less room left than this rank's tensors need (torch's zip writer says "unexpected pos")."""
    distributed = dist.is_initialized()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        try:
            dcp.save(entries, checkpoint_id=str(directory), process_group=group, no_dist=not distributed)
        except CheckpointException as error:
            failure = first_failure(error)
            if isinstance(failure, OSError):
                raise failure from None
            states = [e.state_dict() if isinstance(e, Stateful) else {0: e} for e in entries.values()]
            needed = sum(
                t.numel() * t.element_size() for s in states for t in s.values() if torch.is_tensor(t)
            )
            if shutil.disk_usage(directory if directory.exists() else directory.parent).free < needed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory)) from None
            limit = file_size_limit()
            if limit is not None and limit < needed:  # torch's zip writer says "unexpected pos" to EFBIG too
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(directory)) from None
            raise OSError(errno.EIO, f"writing failed ({failure})", str(directory)) from None


def load_entries(entries: dict, directory: Path, group=None, collective: bool = False) -> None:
    """Fill `entries` (tensors, or a Stateful under one key) in place from the checkpoint. `collective`:
    every rank of the group calls it (resuming); otherwise this process reads alone."""
    stored_entries(directory, [k for k, v in entries.items() if torch.is_tensor(v)])
    distributed = collective and dist.is_initialized()
    with unchanged_while_read(files_in(directory), "checkpoint file"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        warnings.filterwarnings("ignore", message=".*pickle protocol")
        try:
            dcp.load(
                entries, storage_reader=SafeReader(directory), process_group=group, no_dist=not distributed
            )
        except CheckpointException as error:
            failure = first_failure(error)
            if isinstance(failure, FacetrainError):
                raise (EveryRankError if distributed else FacetrainError)(str(failure)) from None
            raise


def find_data_damage(directory: Path) -> str | None:
    """Why the checkpoint's data cannot be read, or None: its index is unreadable, or a data file is
    missing or shorter than the bytes the index places in it. Reads file sizes only, so it is cheap."""
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
