"""torch.distributed.checkpoint reads and writes, without ever unpickling an arbitrary object.

DCP stores tensors with weights-only serialization, but pickles its `.metadata` index. The reader here
unpickles that index with an allow-list of DCP's own metadata classes, so a tampered checkpoint is
refused instead of running code. Every entry facetrain writes is a plain tensor under a flat key.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
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
    """Collective: every rank passes its entries; keys held by several ranks are written once."""
    distributed = dist.is_available() and dist.is_initialized()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        dcp.save(tensors, checkpoint_id=str(directory), process_group=process_group, no_dist=not distributed)


def tensor_index(directory: Path) -> dict[str, TensorStorageMetadata]:
    """Key -> (size, dtype) of every tensor in a checkpoint."""
    metadata = SafeFileSystemReader(str(directory)).read_metadata()
    return {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def load_tensors(directory: Path, keys: list[str], index: dict[str, TensorStorageMetadata] | None = None):
    """Read the named tensors on this rank alone (no collectives), so ranks may read different keys."""
    index = tensor_index(directory) if index is None else index
    missing = [k for k in keys if k not in index]
    if missing:
        raise FacetrainError(
            f"checkpoint {directory} has no entry {missing[0]}; was it written by facetrain?"
        )
    tensors = {k: torch.empty(index[k].size, dtype=index[k].properties.dtype) for k in keys}
    if tensors:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(tensors, storage_reader=SafeFileSystemReader(str(directory)), no_dist=True)
    return tensors
