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
from tqdm import tqdm

from facetrain.checkpoints import (
    is_checkpoint,
    is_range_key,
    load_backbone_weights,
    range_key,
    read_class_rows,
    read_class_rows_at,
    read_config,
    read_meta,
    resolve_checkpoint,
)
from facetrain.config import Config, save_config
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.files import atomic_write_text, fsync_directory
from facetrain.heads import ShardedMarginHead
from facetrain.parallel import comm
from facetrain.parallel.checkpoint_io import load_tensors, save_tensors, tensor_index
from facetrain.parallel.dims import ParallelDims

# With model.ema_decay > 0, `backbone/` holds the weight average (what eval, export and load_backbone
# read) and this prefix the weights the optimizer trains, which a resumed run continues from.
TRAINED_PREFIX = "trained/backbone/"


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
    # the optimizer that updates the head's weight: the tiled head's own, or the trainer's
    head_state = (head.fused_optimizer or optimizer).state.get(head.weight, {})
    for key, value in head_state.items():
        tensor = _as_tensor(value)
        if tensor.shape == head.weight.shape:
            tensor = head.per_class(tensor)
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
    ema: nn.Module | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory.

    `backbone` is the unwrapped backbone (or this rank's pipeline stage); `head` is None on pipeline
    stages that hold no head. Replica 0 of each stage writes the backbone (`dims.writes_backbone`):
    parameters match over replicas, but batch-norm running statistics are updated from each replica's
    own batch, and replica 0's are the ones verified. `ema`, the weight average when there is one, is
    stored as the backbone and `backbone` under TRAINED_PREFIX.
    """
    root = run_dir / "checkpoints"
    final = root / f"step_{state.step:08d}"
    tmp = root / f"step_{state.step:08d}.tmp"
    comm.primary_first(
        lambda: _writable(lambda: _clear_leftovers(root), root, final),
        also_others=False,
        group=dims.control_group,
    )

    named = dict(backbone.named_parameters()) if dims.writes_backbone else {}
    entries = {}
    if dims.writes_backbone:
        entries = {f"backbone/{k}": v for k, v in (ema or backbone).state_dict().items()}
        if ema is not None:
            entries.update({f"{TRAINED_PREFIX}{k}": v for k, v in backbone.state_dict().items()})
    if head is not None:
        entries[range_key("head/weight", head.class_start, head.class_count)] = head.per_class(
            head.weight.detach()
        )
    entries.update(_optimizer_entries(optimizer, named, head))
    if scaler is not None and scaler.is_enabled():
        scaler_state = scaler.state_dict()
        entries["scaler/scale"] = torch.tensor(scaler_state["scale"])
        entries["scaler/growth_tracker"] = torch.tensor(scaler_state["_growth_tracker"])
    entries[f"rng/{dims.rank}/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        entries[f"rng/{dims.rank}/cuda"] = torch.cuda.get_rng_state()
    try:
        save_tensors({k: v.detach().cpu() for k, v in entries.items()}, tmp)
    except OSError as error:  # every rank raises it, whichever rank failed
        if dims.is_primary:
            shutil.rmtree(tmp, ignore_errors=True)
        raise EveryRankError(_write_failure(error, root, final)) from None

    def finish() -> None:
        meta = {
            **asdict(state),
            "world_size": dims.world_size,
            "num_classes": len(class_names),
            "embedding_size": config.model.embedding_size,
            "evaluation": evaluation or {},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elastic_run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        }
        atomic_write_text(tmp / "classes.json", json.dumps(class_names))
        save_config(config, tmp / "config.yaml")
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2))
        fsync_directory(tmp)
        _commit(tmp, final)
        atomic_write_text(root / "last", final.name)
        if is_best:
            atomic_write_text(root / "best", final.name)
        _prune(root, keep, final)

    comm.primary_first(
        lambda: _writable(finish, root, final, cleanup=tmp), also_others=False, group=dims.control_group
    )
    return final


def _writable(write, root: Path, final: Path, cleanup: Path | None = None) -> None:
    """Run `write`; a full disk or an unwritable folder becomes one line saying the rest is intact."""
    try:
        write()
    except OSError as error:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        raise FacetrainError(_write_failure(error, root, final)) from None


def _write_failure(error: OSError, root: Path, final: Path) -> str:
    reason = f"{error.strerror or error} ({error.filename or root})"
    last = root / "last"
    kept = (
        f"the last complete one, {last.read_text().strip()}, is intact"
        if last.is_file()
        else "none was written before"
    )
    return (
        f"cannot write checkpoint {final}: {reason}; {kept}. Free space or fix the folder's permissions, "
        "then resume with --resume auto"
    )


def _clear_leftovers(root: Path) -> None:
    """Remove what a crash left behind: a half-written `.tmp`, a checkpoint half-way through removal
    (`.deleting`), or one that was being replaced (`.replaced`). None of them is ever read."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob("step_*.*"):
        if leftover.is_dir() and leftover.suffix in (".tmp", ".deleting", ".replaced"):
            shutil.rmtree(leftover)


def _commit(tmp: Path, final: Path) -> None:
    """Make the finished `tmp` the checkpoint `final` in one rename.

    A checkpoint already at `final` (a run resumed from an earlier step reaches it again) is moved
    aside first and removed only after, so a crash in between leaves the old one or the new one.
    """
    replaced = final.with_name(final.name + ".replaced")
    if final.exists():
        os.replace(final, replaced)
    os.replace(tmp, final)
    fsync_directory(final.parent)
    if replaced.exists():
        shutil.rmtree(replaced)


def _prune(root: Path, keep: int, written: Path) -> None:
    """Keep the newest `keep` checkpoints, never the one just written nor whatever `best` names.

    Runs only after `last` names the new checkpoint. Each old one is renamed to `.deleting` before its
    files go, so a crash half-way never leaves a partial directory that looks like a checkpoint.
    """
    best = (root / "best").read_text().strip() if (root / "best").is_file() else None
    complete = sorted(p for p in root.glob("step_*") if is_checkpoint(p))
    removable = [p for p in complete if p.name not in (written.name, best)]
    for old in removable[: max(0, len(complete) - keep)]:
        doomed = old.with_name(old.name + ".deleting")
        os.replace(old, doomed)
        fsync_directory(root)
        shutil.rmtree(doomed)


def load_checkpoint(
    path: str | Path,
    dims: ParallelDims,
    backbone: nn.Module,
    head: ShardedMarginHead | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    optimizer_name: str | None = None,
    class_rows: list[int | None] | None = None,
) -> TrainState:
    """Restore everything into already-built objects; the head is resharded by class range.

    `backbone` may be one pipeline stage (its parameter names are a subset of the whole backbone's),
    and `head` None on a stage without one. A run resumed with another `optimizer_name` (optim.name)
    than the checkpoint's starts that optimizer's state fresh, with a warning: one optimizer's state
    (SGD's momentum) means nothing to another (AdamW's moments), and the weights, step and schedule
    are what a run continues from. `class_rows` (train.remap_classes, see
    `facetrain.train.class_remap`) gives, for each class of this run, its row in the checkpoint or None:
    the head's rows are then taken by class, and its optimizer state starts fresh.
    """
    checkpoint = resolve_checkpoint(path)
    meta = read_meta(checkpoint)
    trained_with = None if optimizer_name is None else read_config(checkpoint).optim.name
    keep_state = trained_with == optimizer_name
    if not keep_state and dims.is_primary:
        tqdm.write(
            f"warning: checkpoint {checkpoint} was trained with optim.name={trained_with}, this run uses "
            f"{optimizer_name}: {trained_with}'s state cannot seed {optimizer_name}'s, so {optimizer_name} "
            f"starts with fresh state; the weights, step {meta['step']} and the schedule carry on"
        )
    classes_fit = head is None or class_rows is not None or meta["num_classes"] == head.num_classes
    if head is not None and not (classes_fit and meta["embedding_size"] == head.embedding_size):
        raise FacetrainError(
            f"checkpoint {checkpoint} has {meta['num_classes']} classes x {meta['embedding_size']} dims, "
            f"but this run has {head.num_classes} x {head.embedding_size}; is it the same dataset and model?"
        )
    index = tensor_index(checkpoint)
    prefix = TRAINED_PREFIX if _has_average(index) else "backbone/"
    _check_backbone_fits(checkpoint, index, backbone, prefix)
    load_backbone_weights(checkpoint, backbone, index, prefix)
    named = dict(backbone.named_parameters())
    backbone_keys = [k for k in index if k.startswith("optim/backbone/") and _param_name(k) in named]
    restored: dict[nn.Parameter, dict[str, torch.Tensor]] = {}
    for key, value in load_tensors(checkpoint, backbone_keys if keep_state else [], index).items():
        restored.setdefault(named[_param_name(key)], {})[key.rsplit("/", 1)[1]] = value
    restore_optimizer_state(optimizer, restored)
    if head is not None and class_rows is not None:
        _load_head_by_class(checkpoint, index, head, class_rows)
    elif head is not None:
        head_state = _load_head(checkpoint, index, head, keep_state)
        if head_state:
            restore_optimizer_state(head.fused_optimizer or optimizer, {head.weight: head_state})

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


def _check_backbone_fits(checkpoint: Path, index: dict, backbone: nn.Module, prefix: str) -> None:
    """One line naming the model the checkpoint was trained with when its weights cannot fill this
    run's backbone (another model.backbone, embedding size or data.image_size)."""
    for name, tensor in backbone.state_dict().items():
        stored = index.get(f"{prefix}{name}")
        if stored is not None and tuple(stored.size) == tuple(tensor.shape):
            continue
        found = "lacks it" if stored is None else f"has {list(stored.size)}"
        try:
            trained = read_config(checkpoint)
            settings = (
                f"model.backbone={trained.model.backbone}, model.embedding_size="
                f"{trained.model.embedding_size}, data.image_size={list(trained.data.image_size)}"
            )
        except (OSError, FacetrainError):
            settings = "other model settings"
        raise FacetrainError(
            f"checkpoint {checkpoint} was trained with {settings} and does not fit this run's backbone "
            f"({name}: this run has {list(tensor.shape)}, the checkpoint {found}); resume with the "
            "settings it was trained with, or choose another train.output_dir"
        )


def _has_average(index: dict) -> bool:
    return any(key.startswith(TRAINED_PREFIX) for key in index)


def load_ema_weights(path: str | Path, ema: nn.Module) -> bool:
    """Restore a weight average into `ema`; False when the checkpoint holds none (its run had
    model.ema_decay 0), and the average then starts from the restored weights."""
    checkpoint = resolve_checkpoint(path)
    index = tensor_index(checkpoint)
    if not _has_average(index):
        return False
    load_backbone_weights(checkpoint, ema, index)
    return True


def _param_name(optimizer_key: str) -> str:
    return optimizer_key[len("optim/backbone/") :].rsplit("/", 1)[0]


def _load_head(
    checkpoint: Path, index: dict, head: ShardedMarginHead, with_state: bool = True
) -> dict[str, torch.Tensor]:
    """Restore the head's weight; returns (`with_state`) the optimizer state for it, as per-class
    tensors of this rank's shard under torch.optim's names."""
    weight = read_class_rows(checkpoint, index, "head/weight", head.class_start, head.class_count)
    if weight.numel() != head.weight.numel():
        raise FacetrainError(
            f"{checkpoint}: its head has {weight.shape[1] // head.embedding_size} sub-centers a class, "
            f"this run {head.sub_centers}; set head.sub_centers to match"
        )
    with torch.no_grad():
        head.weight.copy_(weight.view_as(head.weight))
    if not with_state:
        return {}
    # The same entries whichever mode wrote them, so a run may switch between the untiled head (state in
    # the trainer's optimizer, in the weight's dtype) and the tiled one (in its fused optimizer's dtype).
    values = {}
    for key in {k.rsplit("/", 1)[0] if is_range_key(k) else k for k in index if k.startswith("optim/head/")}:
        state_key = key[len("optim/head/") :]
        if any(is_range_key(k) and k.rsplit("/", 1)[0] == key for k in index):
            rows = read_class_rows(checkpoint, index, key, head.class_start, head.class_count)
            values[state_key] = rows.view_as(head.weight) if rows.numel() == head.weight.numel() else rows
        else:
            values[state_key] = load_tensors(checkpoint, [key], index)[key]
    return values


def _load_head_by_class(
    checkpoint: Path, index: dict, head: ShardedMarginHead, class_rows: list[int | None]
) -> None:
    """Fill this rank's rows of classes the checkpoint has from their rows there; the others keep
    their fresh initialisation."""
    mine = class_rows[head.class_start : head.class_stop]
    positions = [position for position, row in enumerate(mine) if row is not None]
    if not positions:
        return
    weight = read_class_rows_at(checkpoint, index, "head/weight", [mine[p] for p in positions])
    rows = head.per_class(head.weight)
    if weight.shape[1] != rows.shape[1]:
        raise FacetrainError(
            f"{checkpoint}: its head has {weight.shape[1] // head.embedding_size} sub-centers a class, "
            f"this run {head.sub_centers}; set head.sub_centers to match"
        )
    with torch.no_grad():
        rows[torch.tensor(positions, device=rows.device)] = weight.to(rows.device, rows.dtype)


def restore_optimizer_state(
    optimizer: torch.optim.Optimizer, restored: dict[nn.Parameter, dict[str, torch.Tensor]]
) -> None:
    """Put `restored` (CPU tensors by parameter) into `optimizer` through its own `load_state_dict`.

    Written into `optimizer.state` directly, AdamW's `step` would follow its parameter onto the GPU,
    where torch's multi-tensor AdamW then reads it back with one `.item()` a parameter every step.
    `load_state_dict` places each value by torch's rules instead: `step` stays on the CPU (on the
    device only for fused or capturable optimizers, which want it there), the rest goes to its
    parameter's device and dtype. `step` is stored as torch creates it, a 0-d float32 tensor, whatever
    form an older checkpoint or the tiled head's fused optimizer wrote it in.
    """
    current = optimizer.state_dict()
    position = {
        param: index
        for group, saved in zip(optimizer.param_groups, current["param_groups"])
        for param, index in zip(group["params"], saved["params"])
    }
    state = {position[param]: dict(values) for param, values in optimizer.state.items() if param in position}
    for param, values in restored.items():
        values = dict(values)
        if "step" in values:
            values["step"] = torch.tensor(float(values["step"]), dtype=torch.float32)
        state.setdefault(position[param], {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": current["param_groups"]})
