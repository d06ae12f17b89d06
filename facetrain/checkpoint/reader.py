"""Reading a checkpoint back: a run resuming (collective, through the `Checkpointer`'s `load`), and
everything after training without a group (eval, export, embed, `--init`), from a checkpoint written
by any number of ranks.

Loading a checkpoint's model for inference is `facetrain.interop.load_model`, the one way to load any
model; it builds the backbone from `saved_model_config`, checks it with `check_config_describes_weights`
and fills it with `load_backbone_weights`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from facetrain.checkpoint.app_state import AppState
from facetrain.checkpoint.layout import complete_checkpoints, read_config_yaml, read_meta, resolve_checkpoint
from facetrain.checkpoint.names import BACKBONE, EMA, HEAD_PREFIX, HEAD_WEIGHT, TRAIN_STATE_KEYS
from facetrain.checkpoint.ranks import RankRoles
from facetrain.checkpoint.storage import load_entries, rows_of, stored, stored_entries
from facetrain.config.loader import from_dict
from facetrain.data.config import DataConfig
from facetrain.errors import FacetrainError, PeerFailed
from facetrain.heads import ShardedMarginHead, collectives
from facetrain.logger import logger
from facetrain.models.config import ModelConfig
from facetrain.models.state_match import first_nonfinite


def load_checkpoint(
    path: str | Path,
    dims: RankRoles,
    backbone: nn.Module,
    head: ShardedMarginHead | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    keep_optimizer: bool = True,
    class_rows: list[int | None] | None = None,
) -> dict:
    """Collective: restore everything into already-built objects (`backbone` may be one pipeline stage,
    `head` None on a stage without one), the head resharded onto this run's ranks. Returns where the
    run was, `names.TRAIN_STATE_KEYS`: what the trainer's `load_state_dict` takes.

    `keep_optimizer` False starts the optimizer's state fresh: the run changed optimizer (optim.name),
    and SGD's momentum means nothing to AdamW's moments; the weights, step and schedule carry on.
    `class_rows` (train.remap_classes, `facetrain.train.class_remap`) gives each class of this run
    its checkpoint row or None: the head's rows are then taken by class, its optimizer state fresh.
    """
    checkpoint = resolve_checkpoint(path)
    meta = read_meta(checkpoint)
    classes_fit = head is None or class_rows is not None or meta["num_classes"] == head.num_classes
    if head is not None and not (classes_fit and meta["embedding_size"] == head.embedding_size):
        raise FacetrainError(
            f"checkpoint {checkpoint} has {meta['num_classes']} classes x {meta['embedding_size']} dims, "
            f"but this run has {head.num_classes} x {head.embedding_size}; is it the same dataset and model?"
        )
    index = stored(checkpoint)
    _check_backbone_fits(checkpoint, index, backbone)
    if head is not None and HEAD_WEIGHT not in index:
        raise FacetrainError(f"checkpoint {checkpoint} holds no head; start a run from it with --init")
    if head is not None and index[HEAD_WEIGHT].size[1] != head.sub_centers * head.embedding_size:
        raise FacetrainError(
            f"{checkpoint}: its head has {index[HEAD_WEIGHT].size[1] // head.embedding_size} sub-centers "
            f"a class, this run {head.sub_centers}; set head.sub_centers to match"
        )
    if head is not None:
        _check_margin_state(checkpoint, index, head, dims.is_primary)
    same_world = meta["world_size"] == dims.world_size
    app = AppState(dims, backbone, head, optimizer, scaler)
    load_entries({"app": app.to_load(index, keep_optimizer, class_rows is None, same_world)}, checkpoint,
                 dims.control_group, collective=True)  # fmt: skip
    if head is not None and class_rows is not None:
        _load_head_by_class(checkpoint, head, class_rows)
    _check_loaded_values(checkpoint, app, dims)
    if not same_world:  # the old per-rank streams do not map onto the new ranks
        torch.manual_seed(meta["step"] * 1009 + dims.rank)
    return {key: meta[key] for key in TRAIN_STATE_KEYS}


def _check_backbone_fits(checkpoint: Path, index: dict, backbone: nn.Module) -> None:
    """One line naming the model the checkpoint was trained with when its weights cannot fill this
    run's backbone (another model.backbone, embedding size or data.image_size)."""
    for name, tensor in backbone.state_dict().items():
        entry = index.get(BACKBONE + name)
        if entry is not None and tuple(entry.size) == tuple(tensor.shape):
            continue
        found = "lacks it" if entry is None else f"has {list(entry.size)}"
        try:
            model, data = saved_model_config(checkpoint)
            settings = (
                f"model.backbone={model.backbone}, model.embedding_size="
                f"{model.embedding_size}, data.image_size={list(data.image_size)}"
            )
        except (OSError, FacetrainError):
            settings = "other model settings"
        raise FacetrainError(
            f"checkpoint {checkpoint} was trained with {settings} and does not fit this run's backbone "
            f"({name}: this run has {list(tensor.shape)}, the checkpoint {found}); resume with the "
            "settings it was trained with, or choose another train.output_dir"
        )


def _check_margin_state(checkpoint: Path, index: dict, head: ShardedMarginHead, primary: bool) -> None:
    """The margin's running state (AdaFace's norm statistics, CurricularFace's t, ElasticFace's step)
    as this run keeps it: another shape was a size-mismatch traceback; a missing one (a checkpoint of
    a margin without state, or from before the state was saved) starts from its initial values, said."""
    for name, tensor in head.state_dict().items():
        entry = index.get(f"{HEAD_PREFIX}{name}")
        if name == "weight" or (entry is not None and tuple(entry.size) == tuple(tensor.shape)):
            continue
        if entry is None:
            if primary:
                logger.warning(
                    f"warning: checkpoint {checkpoint} holds no head.{name}, the margin's running state; "
                    f"it starts from its initial value, {tensor.item():g}"
                )
            continue
        raise FacetrainError(
            f"checkpoint {checkpoint}: its head.{name} has shape {list(entry.size)}, where this run's "
            f"margin keeps {list(tensor.shape)}; the checkpoint is damaged or was not written by facetrain: "
            "use another checkpoint"
        )


def _check_loaded_values(checkpoint: Path, app: AppState, dims: RankRoles) -> None:
    """Every loaded weight, running state and optimizer state finite, on every rank (each holds its own
    rows): a NaN resumed from would make the first step's loss NaN, blamed on the learning rate."""
    names = {param: name for name, param in app.parts.named_parameters()}
    values = dict(app.parts.state_dict())
    for optimizer in app.optimizers:
        for param, state in optimizer.state.items():
            values.update(
                {f"optim.state.{names.get(param, '?')}.{key}": value for key, value in state.items()}
            )
    problem = first_nonfinite(values)
    flag = torch.tensor([int(problem is not None)], device=collectives.collective_device(dims.control_group))
    if not collectives.all_reduce_(flag, "max", dims.control_group).item():
        return
    if problem is None:
        raise PeerFailed("another rank's share of the checkpoint holds NaN or infinite values")
    earlier = [p for p in complete_checkpoints(checkpoint.parent.parent) if p.name < checkpoint.name]
    offer = f"resume from an earlier one, --resume {earlier[-1]}" if earlier else "start a new run"
    raise FacetrainError(
        f"checkpoint {checkpoint}: {problem}; it comes from a diverged run or is damaged: {offer}"
    )


def _load_head_by_class(checkpoint: Path, head: ShardedMarginHead, class_rows: list[int | None]) -> None:
    """Fill this rank's rows of classes the checkpoint has from their rows there, reading each stored
    range that holds any of them once; the others keep their fresh initialisation."""
    mine = class_rows[head.class_start : head.class_stop]
    wanted = torch.tensor([-1 if row is None else row for row in mine])
    rows = head.per_class(head.weight)
    for chunk in stored(checkpoint)[HEAD_WEIGHT].chunks:
        start, count = chunk.offsets[0], chunk.sizes[0]
        inside = (wanted >= start) & (wanted < start + count)
        if inside.any():
            values = read_rows(checkpoint, HEAD_WEIGHT, start, count)[wanted[inside] - start]
            with torch.no_grad():
                rows[inside.nonzero().squeeze(1).to(rows.device)] = values.to(rows.device, rows.dtype)


def read_rows(checkpoint: Path, key: str, start: int, count: int) -> torch.Tensor:
    """Rows [start, start + count) of a checkpoint's per-class tensor, without a group."""
    entry = stored_entries(checkpoint, [key])[key]
    rows = rows_of(torch.empty((count, *entry.size[1:]), dtype=entry.properties.dtype), start, entry.size[0])
    load_entries({key: rows}, checkpoint)
    return rows.view(count, *entry.size[1:])


def read_entries(checkpoint: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """Whole tensors of a checkpoint by key, without a group."""
    entries = stored_entries(checkpoint, keys)
    values = {key: torch.empty(entry.size, dtype=entry.properties.dtype) for key, entry in entries.items()}
    load_entries(values, checkpoint)
    return values


def load_full_head(path: str | Path) -> torch.Tensor:
    """The head's full C x (K x D) weight, from however many ranks wrote it."""
    checkpoint = resolve_checkpoint(path)
    return read_rows(checkpoint, HEAD_WEIGHT, 0, read_meta(checkpoint)["num_classes"])


def load_backbone_weights(checkpoint: Path, backbone: nn.Module) -> None:
    """Fill `backbone` (the whole model, or one pipeline stage of it) from the checkpoint with the weights
    to use: the weight average when the run kept one."""
    prefix = EMA if any(key.startswith(EMA) for key in stored(checkpoint)) else BACKBONE
    values = {f"{prefix}{k}": torch.empty_like(v, device="cpu") for k, v in backbone.state_dict().items()}
    load_entries(values, checkpoint)
    backbone.load_state_dict({k[len(prefix) :]: v for k, v in values.items()})


def load_ema_weights(path: str | Path, ema: nn.Module) -> bool:
    """Restore a weight average into `ema`; False when the checkpoint holds none (its run had
    model.ema_decay 0), and the average then starts from the restored weights."""
    checkpoint = resolve_checkpoint(path)
    if not any(key.startswith(EMA) for key in stored(checkpoint)):
        return False
    load_backbone_weights(checkpoint, ema)
    return True


def saved_model_config(checkpoint: Path) -> tuple[ModelConfig, DataConfig]:
    """The model and data sections of a checkpoint's config.yaml: what its backbone was built from.
    The whole tree is the run's to read (`facetrain.train.run_config.checkpoint_config`)."""
    raw, source = read_config_yaml(checkpoint), str(checkpoint / "config.yaml")
    if not isinstance(raw, dict):
        raise FacetrainError(f"config {source}: the top level must be a mapping")
    model = from_dict(ModelConfig, raw.get("model", {}), source, "model.")
    data = from_dict(DataConfig, raw.get("data", {}), source, "data.")
    return model, data


def check_config_describes_weights(checkpoint: Path, backbone: nn.Module) -> None:
    """The backbone a checkpoint's own config.yaml builds must take its stored weights; when it does
    not (an edited embedding_size), loading was a size-mismatch traceback."""
    index = stored(checkpoint)
    prefix = EMA if any(key.startswith(EMA) for key in index) else BACKBONE
    for name, tensor in backbone.state_dict().items():
        entry = index.get(prefix + name)
        if entry is None or tuple(entry.size) != tuple(tensor.shape):
            found = "lacks it" if entry is None else f"holds {list(entry.size)}"
            raise FacetrainError(
                f"checkpoint {checkpoint} is damaged: its config.yaml builds a backbone whose {name} is "
                f"{list(tensor.shape)}, but the checkpoint {found}; restore the config.yaml it was saved with"
            )
