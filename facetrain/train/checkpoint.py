"""Training checkpoints: written atomically by all ranks, resumable on any number of ranks.

The layout is described in `facetrain.checkpoints`. A checkpoint is first written as `*.tmp` and
renamed only once complete, so a directory without the suffix is always whole. The head and its
optimizer state are stored per class range, so a checkpoint written by N ranks is resharded onto M
ranks by reading the overlapping ranges.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from facetrain.checkpoints import (
    is_range_key,
    load_backbone_weights,
    range_key,
    read_class_rows,
    read_meta,
    resolve_checkpoint,
)
from facetrain.config import Config, save_config
from facetrain.errors import FacetrainError
from facetrain.files import atomic_write_text
from facetrain.heads import ShardedMarginHead
from facetrain.parallel import comm
from facetrain.parallel.checkpoint_io import load_tensors, save_tensors, tensor_index
from facetrain.parallel.dims import ParallelDims


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    consumed: int = 0  # samples all ranks together have used in the current epoch
    best_accuracy: float | None = None
    best_step: int | None = None


def _as_tensor(value) -> torch.Tensor:
    """Optimizer state holds tensors and, for some optimizers, plain numbers (a step count)."""
    return value if torch.is_tensor(value) else torch.tensor(value)


def _optimizer_entries(
    optimizer: torch.optim.Optimizer, named: dict[str, nn.Parameter], head: ShardedMarginHead | None
):
    """Flat tensor entries of the optimizer state: backbone by parameter name, head by class range."""
    entries = {}
    for name, param in named.items():
        for key, value in optimizer.state.get(param, {}).items():
            entries[f"optim/backbone/{name}/{key}"] = _as_tensor(value)
    if head is None:
        return entries
    for key, value in optimizer.state.get(head.weight, {}).items():
        tensor = _as_tensor(value)
        if tensor.dim() and tensor.shape[0] == head.class_count:
            entries[range_key(f"optim/head/{key}", head.class_start, head.class_count)] = tensor
        else:
            entries[f"optim/head/{key}"] = tensor
    return entries


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    config: Config,
    dims: ParallelDims,
    backbone: nn.Module,
    head: ShardedMarginHead | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    class_names: list[str],
    evaluation: dict | None = None,
    is_best: bool = False,
    keep: int = 3,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory.

    `backbone` is the unwrapped backbone (or this rank's pipeline stage); `head` is None on pipeline
    stages that hold no head. Replica 0 of each stage writes the backbone (`dims.writes_backbone`):
    parameters match over replicas, but batch-norm running statistics are updated from each replica's
    own batch, and replica 0's are the ones verified.
    """
    root = run_dir / "checkpoints"
    final = root / f"step_{state.step:08d}"
    tmp = root / f"step_{state.step:08d}.tmp"
    if dims.is_primary:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    comm.barrier()

    named = dict(backbone.named_parameters()) if dims.writes_backbone else {}
    entries = {f"backbone/{k}": v for k, v in backbone.state_dict().items()} if dims.writes_backbone else {}
    if head is not None:
        entries[range_key("head/weight", head.class_start, head.class_count)] = head.weight.detach()
    entries.update(_optimizer_entries(optimizer, named, head))
    if scaler is not None and scaler.is_enabled():
        scaler_state = scaler.state_dict()
        entries["scaler/scale"] = torch.tensor(scaler_state["scale"])
        entries["scaler/growth_tracker"] = torch.tensor(scaler_state["_growth_tracker"])
    entries[f"rng/{dims.rank}/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        entries[f"rng/{dims.rank}/cuda"] = torch.cuda.get_rng_state()
    save_tensors({k: v.detach().cpu() for k, v in entries.items()}, tmp)

    if dims.is_primary:
        meta = {
            **asdict(state),
            "world_size": dims.world_size,
            "num_classes": len(class_names),
            "embedding_size": config.model.embedding_size,
            "evaluation": evaluation or {},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        (tmp / "classes.json").write_text(json.dumps(class_names))
        save_config(config, tmp / "config.yaml")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_text(root / "last", final.name)
        if is_best:
            atomic_write_text(root / "best", final.name)
        _prune(root, keep)
    comm.barrier()
    return final


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints, and whatever `best` names."""
    best = (root / "best").read_text().strip() if (root / "best").is_file() else None
    complete = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in complete[: max(0, len(complete) - keep)]:
        if old.name != best:
            shutil.rmtree(old)


def load_checkpoint(
    path: str | Path,
    dims: ParallelDims,
    backbone: nn.Module,
    head: ShardedMarginHead | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
) -> TrainState:
    """Restore everything into already-built objects; the head is resharded by class range.

    `backbone` may be one pipeline stage (its parameter names are a subset of the whole backbone's),
    and `head` None on a stage without one.
    """
    checkpoint = resolve_checkpoint(path)
    meta = read_meta(checkpoint)
    if head is not None and (meta["num_classes"], meta["embedding_size"]) != (
        head.num_classes,
        head.embedding_size,
    ):
        raise FacetrainError(
            f"checkpoint {checkpoint} has {meta['num_classes']} classes x {meta['embedding_size']} dims, "
            f"but this run has {head.num_classes} x {head.embedding_size}; is it the same dataset and model?"
        )
    index = tensor_index(checkpoint)
    load_backbone_weights(checkpoint, backbone, index)
    named = dict(backbone.named_parameters())
    backbone_keys = [k for k in index if k.startswith("optim/backbone/") and _param_name(k) in named]
    for key, value in load_tensors(checkpoint, backbone_keys, index).items():
        param = named[_param_name(key)]
        optimizer.state[param][key.rsplit("/", 1)[1]] = value.to(param.device)
    if head is not None:
        _load_head(checkpoint, index, head, optimizer)

    if scaler is not None and scaler.is_enabled() and "scaler/scale" in index:
        values = load_tensors(checkpoint, ["scaler/scale", "scaler/growth_tracker"], index)
        scaler.load_state_dict(
            {
                **scaler.state_dict(),
                "scale": float(values["scaler/scale"]),
                "_growth_tracker": int(values["scaler/growth_tracker"]),
            }
        )
    rng_key, cuda_key = f"rng/{dims.rank}/torch", f"rng/{dims.rank}/cuda"
    if meta["world_size"] == dims.world_size and rng_key in index:
        torch.set_rng_state(load_tensors(checkpoint, [rng_key], index)[rng_key])
        if torch.cuda.is_available() and cuda_key in index:
            torch.cuda.set_rng_state(load_tensors(checkpoint, [cuda_key], index)[cuda_key])
    else:  # another world size: the old per-rank streams do not map onto the new ranks
        torch.manual_seed(meta["step"] * 1009 + dims.rank)
    fields = {k: meta[k] for k in ("step", "epoch", "consumed", "best_accuracy", "best_step")}
    return TrainState(**fields)


def _param_name(optimizer_key: str) -> str:
    return optimizer_key[len("optim/backbone/") :].rsplit("/", 1)[0]


def _load_head(
    checkpoint: Path, index: dict, head: ShardedMarginHead, optimizer: torch.optim.Optimizer
) -> None:
    with torch.no_grad():
        head.weight.copy_(
            read_class_rows(checkpoint, index, "head/weight", head.class_start, head.class_count)
        )
    head_state = optimizer.state[head.weight]
    for key in {k.rsplit("/", 1)[0] if is_range_key(k) else k for k in index if k.startswith("optim/head/")}:
        state_key = key[len("optim/head/") :]
        if any(is_range_key(k) and k.rsplit("/", 1)[0] == key for k in index):
            value = read_class_rows(checkpoint, index, key, head.class_start, head.class_count)
        else:
            value = load_tensors(checkpoint, [key], index)[key]
        head_state[state_key] = value.to(head.weight.device)
