"""Training checkpoints: written atomically by all ranks, resumable on any number of ranks.

A checkpoint is `<run>/checkpoints/step_NNNNNNNN/`: a torch.distributed.checkpoint directory of flat
tensor entries, plus `meta.json`, `config.yaml` and `classes.json`. It is first written as `*.tmp` and
renamed only once complete, so a directory without the suffix is always whole. `last` and `best` are
small pointer files naming a checkpoint directory.

The head and its optimizer state are stored per class range (`head/weight/<start>-<count>`), so a
checkpoint written by N ranks is resharded onto M ranks by reading the overlapping ranges.
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

from facetrain.config import Config, from_dict, save_config
from facetrain.errors import FacetrainError
from facetrain.files import atomic_write_text
from facetrain.heads import ShardedMarginHead
from facetrain.parallel import comm
from facetrain.parallel.checkpoint_io import load_tensors, save_tensors, tensor_index

POINTERS = ("last", "best")


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    consumed: int = 0  # samples all ranks together have used in the current epoch
    best_accuracy: float | None = None
    best_step: int | None = None


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


def read_meta(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "meta.json").read_text())


def read_config(checkpoint: Path) -> Config:
    import yaml

    path = checkpoint / "config.yaml"
    return from_dict(Config, yaml.safe_load(path.read_text()), source=str(path))


def _range_key(prefix: str, start: int, count: int) -> str:
    return f"{prefix}/{start}-{count}"


def _parse_range(key: str) -> tuple[int, int]:
    start, count = key.rsplit("/", 1)[1].split("-")
    return int(start), int(count)


def _as_tensor(value) -> torch.Tensor:
    """Optimizer state holds tensors and, for some optimizers, plain numbers (a step count)."""
    return value if torch.is_tensor(value) else torch.tensor(value)


def _optimizer_entries(
    optimizer: torch.optim.Optimizer, named: dict[str, nn.Parameter], head: ShardedMarginHead
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
            entries[_range_key(f"optim/head/{key}", head.class_start, head.class_count)] = tensor
        else:
            entries[f"optim/head/{key}"] = tensor
    return entries


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    config: Config,
    backbone: nn.Module,
    head: ShardedMarginHead,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    class_names: list[str],
    evaluation: dict | None = None,
    is_best: bool = False,
    keep: int = 3,
    writes_backbone: bool | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory.

    `head` is None on pipeline stages that hold no head. `writes_backbone` says whether this rank's
    backbone (or pipeline stage) goes in; by default rank 0 alone writes it.
    """
    root = run_dir / "checkpoints"
    final = root / f"step_{state.step:08d}"
    tmp = root / f"step_{state.step:08d}.tmp"
    primary = comm.rank() == 0
    if primary:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    comm.barrier()

    # The backbone is written by rank 0 alone: its parameters match on every rank, but batch-norm
    # running statistics are updated from each rank's own batch, and rank 0's are the ones verified.
    writes_backbone = primary if writes_backbone is None else writes_backbone
    named = dict(backbone.named_parameters()) if writes_backbone else {}
    entries = {f"backbone/{k}": v for k, v in backbone.state_dict().items()} if writes_backbone else {}
    if head is not None:
        entries[_range_key("head/weight", head.class_start, head.class_count)] = head.weight.detach()
    entries.update(_optimizer_entries(optimizer, named, head))
    if scaler is not None and scaler.is_enabled():
        entries["scaler/scale"] = torch.tensor(scaler.get_scale())
        entries["scaler/growth_tracker"] = torch.tensor(scaler._get_growth_tracker())
    entries[f"rng/{comm.rank()}/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        entries[f"rng/{comm.rank()}/cuda"] = torch.cuda.get_rng_state()
    save_tensors({k: v.detach().cpu() for k, v in entries.items()}, tmp)

    if primary:
        meta = {
            **asdict(state),
            "world_size": comm.world_size(),
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
    device = next(backbone.parameters()).device
    load_backbone_weights(checkpoint, backbone, index)
    named = dict(backbone.named_parameters())
    backbone_keys = [k for k in index if k.startswith("optim/backbone/") and _param_name(k) in named]
    for key, value in load_tensors(checkpoint, backbone_keys, index).items():
        optimizer.state[named[_param_name(key)]][key.rsplit("/", 1)[1]] = value.to(device)
    if head is not None:
        _load_head(checkpoint, index, head, optimizer)

    if scaler is not None and scaler.is_enabled() and "scaler/scale" in index:
        values = load_tensors(checkpoint, ["scaler/scale", "scaler/growth_tracker"], index)
        scaler.update(float(values["scaler/scale"]))
        scaler._init_growth_tracker = int(values["scaler/growth_tracker"])
    rng_key, cuda_key = f"rng/{comm.rank()}/torch", f"rng/{comm.rank()}/cuda"
    if meta["world_size"] == comm.world_size() and rng_key in index:
        torch.set_rng_state(load_tensors(checkpoint, [rng_key], index)[rng_key])
        if torch.cuda.is_available() and cuda_key in index:
            torch.cuda.set_rng_state(load_tensors(checkpoint, [cuda_key], index)[cuda_key])
    else:  # another world size: the old per-rank streams do not map onto the new ranks
        torch.manual_seed(meta["step"] * 1009 + comm.rank())
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
    for key in {k.rsplit("/", 1)[0] if _is_range(k) else k for k in index if k.startswith("optim/head/")}:
        state_key = key[len("optim/head/") :]
        if any(_is_range(k) and k.rsplit("/", 1)[0] == key for k in index):
            value = read_class_rows(checkpoint, index, key, head.class_start, head.class_count)
        else:
            value = load_tensors(checkpoint, [key], index)[key]
        head_state[state_key] = value.to(head.weight.device)


def _is_range(key: str) -> bool:
    tail = key.rsplit("/", 1)[-1]
    start, _, count = tail.partition("-")
    return start.isdigit() and count.isdigit()


def read_class_rows(checkpoint: Path, index: dict, prefix: str, start: int, count: int) -> torch.Tensor:
    """Rows [start, start + count) of a per-class tensor stored as range shards under `prefix`."""
    shards = sorted((_parse_range(k), k) for k in index if _is_range(k) and k.rsplit("/", 1)[0] == prefix)
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
    index = tensor_index(checkpoint) if index is None else index
    own = backbone.state_dict()
    keys = [f"backbone/{k}" for k in own]
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


def latest_checkpoint(run_dir: Path) -> Path | None:
    """What `--resume auto` resumes from: the run's `last` checkpoint, if it has one."""
    pointer = run_dir / "checkpoints" / "last"
    return resolve_checkpoint(pointer) if pointer.is_file() else None
