"""Finding a checkpoint, and reading its backbone, its head shards and its metadata without a group."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from torch import nn

from facetrain.config import Config, from_dict
from facetrain.errors import FacetrainError
from facetrain.parallel.checkpoint_io import load_tensors, tensor_index

POINTERS = ("last", "best")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from itself, a `last`/`best` pointer, a checkpoints dir or a run dir."""
    path = Path(path)
    for candidate in (path, path / "last", path / "checkpoints" / "last"):
        if candidate.is_file() and candidate.name in POINTERS:
            target = candidate.parent / candidate.read_text().strip()
            if (target / ".metadata").is_file():
                return target
            raise FacetrainError(f"{candidate} points to {target.name}, which is missing or incomplete")
        if (candidate / ".metadata").is_file() and (candidate / "meta.json").is_file():
            return candidate
    raise FacetrainError(
        f"no checkpoint at {path}: expected a checkpoint directory, a run directory or a pointer"
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """What `--resume auto` resumes from: the run's `last` checkpoint, if it has one."""
    pointer = run_dir / "checkpoints" / "last"
    return resolve_checkpoint(pointer) if pointer.is_file() else None


def read_meta(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "meta.json").read_text())


def read_config(checkpoint: Path) -> Config:
    path = checkpoint / "config.yaml"
    return from_dict(Config, yaml.safe_load(path.read_text()), source=str(path))


def range_key(prefix: str, start: int, count: int) -> str:
    return f"{prefix}/{start}-{count}"


def parse_range_key(key: str) -> tuple[int, int]:
    start, count = key.rsplit("/", 1)[1].split("-")
    return int(start), int(count)


def is_range_key(key: str) -> bool:
    tail = key.rsplit("/", 1)[-1]
    start, _, count = tail.partition("-")
    return start.isdigit() and count.isdigit()


def read_class_rows(checkpoint: Path, index: dict, prefix: str, start: int, count: int) -> torch.Tensor:
    """Rows [start, start + count) of a per-class tensor stored as range shards under `prefix`."""
    shards = sorted(
        (parse_range_key(k), k) for k in index if is_range_key(k) and k.rsplit("/", 1)[0] == prefix
    )
    pieces = []
    for (shard_start, shard_count), key in shards:
        low, high = max(start, shard_start), min(start + count, shard_start + shard_count)
        if low < high:
            tensor = load_tensors(checkpoint, [key], index)[key]
            pieces.append(tensor[low - shard_start : high - shard_start])
    rows = torch.cat(pieces) if pieces else torch.empty(0)
    if rows.shape[0] != count:
        raise FacetrainError(
            f"checkpoint {checkpoint} does not cover classes {start}..{start + count} of {prefix}"
        )
    return rows


def load_backbone_weights(checkpoint: Path, backbone: nn.Module, index: dict | None = None) -> None:
    """Fill `backbone` (the whole model, or one pipeline stage of it) from the checkpoint's entries."""
    index = tensor_index(checkpoint) if index is None else index
    keys = [f"backbone/{k}" for k in backbone.state_dict()]
    values = load_tensors(checkpoint, keys, index)
    backbone.load_state_dict({k[len("backbone/") :]: v for k, v in values.items()})


def load_backbone(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, Config, dict]:
    """The trained backbone of any checkpoint (any number of ranks), in eval mode, without a group."""
    from facetrain.models import build_backbone

    checkpoint = resolve_checkpoint(path)
    config = read_config(checkpoint)
    backbone = build_backbone(config.model, tuple(config.data.image_size))
    load_backbone_weights(checkpoint, backbone)
    return backbone.to(device).eval(), config, read_meta(checkpoint)


def load_full_head(path: str | Path) -> torch.Tensor:
    """The head's full C x D weight, gathered from the shards of however many ranks wrote it."""
    checkpoint = resolve_checkpoint(path)
    meta = read_meta(checkpoint)
    return read_class_rows(checkpoint, tensor_index(checkpoint), "head/weight", 0, meta["num_classes"])
