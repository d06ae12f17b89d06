"""Importing an insightface arcface_torch run (its `checkpoint_gpu_N.pt` files) with its head.

With `save_all_states`, arcface_torch writes one `checkpoint_gpu_{rank}.pt` per rank at the end of
each epoch: the backbone (the same on every rank), `state_dict_softmax_fc` (that rank's Partial FC
shard, `weight` of its classes' rows), the optimizer's state, `epoch` and `global_step`. Partial FC V2
deals C classes to N ranks as contiguous ranges, the first C mod N ranks one class more, the split
facetrain's head uses (`facetrain.heads.partition.class_range`).

The import is a facetrain training checkpoint: the shards, joined, are its head of C rows, so
`facetrain train --resume` reshards it onto any number of ranks, as it does facetrain's own. The SGD
momentum (or AdamW moments) comes along, mapped by parameter order (the order arcface_torch passes its
backbone's parameters and then the head's weight to the optimizer), with the step and epoch. Every
file is read weights-only; nothing in them runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from facetrain.checkpoint.names import BACKBONE, HEAD_STATE, HEAD_WEIGHT, OPTIM_STATE
from facetrain.errors import FacetrainError
from facetrain.heads.config import HeadConfig
from facetrain.heads.partition import class_range
from facetrain.interop.imported_config import ImportedConfig, ImportedRunConfig
from facetrain.interop.insightface_import import (
    SOURCE_FORMAT,
    backbone_state,
    check_destination,
    file_sha256,
    imported_backbone,
    imported_config,
    infer_architecture,
    load_weights_only,
    write_imported_checkpoint,
)
from facetrain.progress import ProgressBar

RUN_FORMAT = "insightface arcface_torch checkpoint_gpu_N.pt"
SHARD_NAME = re.compile(r"checkpoint_gpu_([0-9]+)\.pt")  # ASCII digits: int() takes others
HEAD_KEY = "state_dict_softmax_fc"
# An optimizer state entry names which optimizer wrote it.
OPTIMIZER_BY_STATE = {"momentum_buffer": "sgd", "exp_avg": "adamw"}


@dataclass(frozen=True)
class RunImportResult:
    checkpoint: Path
    architecture: str
    embedding_size: int
    num_classes: int
    ranks: int
    step: int


def is_insightface_run(path: Path) -> bool:
    return path.is_dir() and any(SHARD_NAME.fullmatch(p.name) for p in path.iterdir())


def import_insightface_run(
    run_dir: str | Path,
    architecture: str | None,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
) -> RunImportResult:
    """The run in `run_dir` (arcface_torch's `cfg.output`) as a facetrain checkpoint at `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_destination(out_dir, overwrite)
    paths = shard_paths(run_dir)
    with ProgressBar(total=len(paths) + 1, desc="import", unit="file", disable=not progress) as bar:
        shards = []
        for path in paths:
            shards.append(_checked_shard(load_weights_only(path), path))
            bar.update()
        first = paths[0]
        state = backbone_state(shards[0], first)
        architecture = architecture or infer_architecture(state, first)
        backbone = imported_backbone(state, architecture, first)
        heads = [_head_rows(shard, path) for shard, path in zip(shards, paths)]
        num_classes = sum(rows.shape[0] for rows in heads)
        entries = {BACKBONE + key: value.detach().cpu() for key, value in backbone.state_dict().items()}
        head_state: dict[str, list[torch.Tensor]] = {}
        optimizer = None
        parameter_names = [name for name, _ in backbone.named_parameters()]
        for rank, (shard, rows, path) in enumerate(zip(shards, heads, paths)):
            count = class_range(num_classes, len(paths), rank).count
            if rows.shape[0] != count or rows.shape[1] != backbone.embedding_size:
                raise FacetrainError(
                    f"{path}: its head holds {list(rows.shape)} rows x dims; Partial FC gives rank {rank} of "
                    f"{len(paths)} {count} of the {num_classes} classes, {backbone.embedding_size} dims each"
                )
            found = _optimizer_entries(shard, path, parameter_names)
            if found is not None:
                optimizer = found[0]
                for key, value in found[1].items():
                    if key.startswith(HEAD_STATE) and value.dim() and value.shape[0] == count:
                        head_state.setdefault(key, []).append(value)
                    elif rank == 0:
                        entries[key] = value
        entries[HEAD_WEIGHT] = torch.cat(heads)
        entries.update({key: torch.cat(rows) for key, rows in head_state.items()})
        config = _run_config(imported_config(architecture, backbone.embedding_size), optimizer)
        meta = {
            "num_classes": num_classes,
            "step": _count(shards[0], "global_step", first),
            "epoch": _count(shards[0], "epoch", first),
            "world_size": len(paths),
            "embedding_size": backbone.embedding_size,
            "imported_from": {
                "format": RUN_FORMAT,
                "architecture": architecture,
                "folder": str(run_dir.resolve()),
                "files": {path.name: file_sha256(path) for path in paths},
                "optimizer": optimizer,
                "backbone_format": SOURCE_FORMAT,
            },
        }
        # arcface_torch keeps no class names: row k is label k of the set it trained on, which the resume
        # cannot check by name (train.remap_classes has nothing to map), only by count
        write_imported_checkpoint(entries, meta, config, [], out_dir)
        bar.update()
    return RunImportResult(
        out_dir, architecture, backbone.embedding_size, num_classes, len(paths), meta["step"]
    )


def shard_paths(run_dir: Path) -> list[Path]:
    """checkpoint_gpu_0.pt ... checkpoint_gpu_{N-1}.pt, all of them: N files are ranks 0 to N-1, so a
    rank number is judged against the files there are, never counted up to (a file naming rank 10**20
    would have been a list of 10**20 ranks)."""
    ranks: dict[int, Path] = {}
    for path in sorted(run_dir.iterdir()):
        if not (match := SHARD_NAME.fullmatch(path.name)):
            continue
        rank = int(match.group(1))
        if rank in ranks:
            raise FacetrainError(
                f"{run_dir}: {ranks[rank].name} and {path.name} both name rank {rank}; keep the one "
                f"arcface_torch wrote (checkpoint_gpu_{rank}.pt)"
            )
        ranks[rank] = path
    if not ranks:
        raise FacetrainError(
            f"{run_dir} holds no checkpoint_gpu_N.pt; pass the folder arcface_torch trained into"
        )
    count = len(ranks)
    missing = [rank for rank in range(count) if rank not in ranks]
    if missing:  # as many files as ranks 0 to count-1 but one missing: some file names a rank past them
        beyond = min(rank for rank in ranks if rank >= count)
        raise FacetrainError(
            f"{run_dir} lacks checkpoint_gpu_{missing[0]}.pt: {count} checkpoint_gpu_N.pt files are ranks "
            f"0-{count - 1}, and {ranks[beyond].name} is not one of them; each rank holds a part of the head, "
            "so copy every rank's file and nothing else"
        )
    return [ranks[rank] for rank in range(count)]


def _checked_shard(loaded: object, path: Path) -> Mapping:
    if not isinstance(loaded, Mapping) or not isinstance(loaded.get(HEAD_KEY), Mapping):
        raise FacetrainError(
            f"{path} holds no {HEAD_KEY!r}; it is not a checkpoint arcface_torch wrote with save_all_states"
        )
    return loaded


def _head_rows(shard: Mapping, path: Path) -> torch.Tensor:
    weight = shard[HEAD_KEY].get("weight")
    if not torch.is_tensor(weight) or weight.dim() != 2 or not weight.is_floating_point():
        raise FacetrainError(f"{path}: {HEAD_KEY}['weight'] is not a 2-D tensor of floats (classes x dims)")
    if not torch.isfinite(weight).all():
        raise FacetrainError(f"{path}: the head holds NaN or infinite values; the run had diverged")
    return weight.detach().float().cpu().contiguous()


def _count(shard: Mapping, key: str, path: Path) -> int:
    value = shard.get(key)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FacetrainError(f"{path}: {key!r} is {value!r:.40}, not a count of steps or epochs")
    return value


def _optimizer_entries(
    shard: Mapping, path: Path, parameter_names: list[str]
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """The optimizer's state in facetrain's entries, or None when the file holds none facetrain knows.

    arcface_torch's optimizer has two groups, the backbone's parameters in `named_parameters` order
    and the head's one weight, so position i of group 0 is the i-th parameter name.
    """
    saved = shard.get("state_optimizer")
    if not isinstance(saved, Mapping) or not isinstance(saved.get("param_groups"), list):
        return None
    groups = [group.get("params", []) for group in saved["param_groups"] if isinstance(group, Mapping)]
    if len(groups) != 2 or len(groups[0]) != len(parameter_names) or len(groups[1]) != 1:
        raise FacetrainError(
            f"{path}: its optimizer has groups of {[len(g) for g in groups]} parameters where arcface_torch's "
            f"has [{len(parameter_names)}, 1] (the backbone's, then the head's weight)"
        )
    states = saved.get("state", {})
    kinds = {key for values in states.values() if isinstance(values, Mapping) for key in values}
    names = {OPTIMIZER_BY_STATE[key] for key in kinds if key in OPTIMIZER_BY_STATE}
    if len(names) != 1:
        return None
    entries: dict[str, torch.Tensor] = {}
    for position, name in zip(groups[0], parameter_names):
        for key, value in states.get(position, {}).items():
            entries[f"{OPTIM_STATE}backbone.{name}.{key}"] = _tensor(value)
    for key, value in states.get(groups[1][0], {}).items():
        entries[HEAD_STATE + key] = _tensor(value)
    return names.pop(), entries


def _tensor(value: object) -> torch.Tensor:
    return (value if torch.is_tensor(value) else torch.tensor(value)).detach().cpu()


def _run_config(config: ImportedConfig, optimizer: str | None) -> ImportedRunConfig:
    """arcface_torch's defaults where facetrain's differ: ArcFace at scale 64 and margin 0.5, and the
    optimizer whose state came along (a resumed run with another keeps the weights, not the state)."""
    head = HeadConfig(margin="arcface", scale=64.0, margin_params={"m": 0.5})
    optim = {"name": optimizer} if optimizer else {}
    return ImportedRunConfig(data=config.data, model=config.model, head=head, optim=optim)
