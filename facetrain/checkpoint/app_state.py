"""What a training checkpoint holds, as the one `Stateful` that DCP saves and loads (`{"app": state}`).

The model parts (the backbone or this rank's pipeline stage, and the head where this rank holds one)
and the optimizers (the trainer's, and the tiled head's fused one) go through torch's
`get_/set_model_state_dict` and `get_/set_optimizer_state_dict`, so torch decides where each value
lives (AdamW's `step` stays on the CPU) and checks the names. Two things are facetrain's own:

- The head's weight and per-class optimizer state are saved as this rank's rows of one C-row tensor
  (`storage.rows_of`), so DCP reshards them N -> M for any split of the classes, even `class_range`'s
  (the first C mod N ranks hold one class more), which a DTensor's `Shard(0)` cannot describe.
- Only replica 0 of each stage saves the backbone and its optimizer state: batch-norm statistics come
  from each replica's own batch, and replica 0's are the ones verified. Param groups are not saved:
  the config gives them, and the schedule the learning rate at the resumed step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from facetrain.checkpoint.names import OPTIM_STATE, PREFIX
from facetrain.checkpoint.ranks import RankRoles
from facetrain.checkpoint.storage import rows_of
from facetrain.heads import ShardedMarginHead

HEAD = "head.weight"


class WeightAverage(Protocol):
    """A run's weight average (`facetrain.train.ema.WeightEma`): the averaged copy of the backbone and
    how many steps it has averaged, which a resumed average carries on from."""

    module: nn.Module
    updates: int


@dataclass
class CheckpointStates:
    """Everything a checkpoint holds of a run: `train_state` (where the run is: step, sample position,
    best verification) goes to meta.json, `config` to config.yaml, `class_names` to classes.json, the
    model parts, optimizer, scaler and weight average to DCP (`AppState`)."""

    train_state: Stateful
    config: Any  # the run's config tree: checkpoint/ reads its model section only
    class_names: list[str]
    backbone: nn.Module  # unwrapped, or this rank's pipeline stage
    head: ShardedMarginHead | None  # None on a stage without one
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    ema: WeightAverage | None = None


class AppState(Stateful):
    """A rank's share of a checkpoint: what it saves, or (after `to_load`) what it loads."""

    def __init__(self, dims: RankRoles, backbone: nn.Module, head: ShardedMarginHead | None,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None,
                 ema: nn.Module | None = None):  # fmt: skip
        self.dims, self.head, self.scaler, self.ema = dims, head, scaler, ema
        self.parts = nn.ModuleDict({"backbone": backbone, **({"head": head} if head is not None else {})})
        self.optimizers = [o for o in (optimizer, getattr(head, "fused_optimizer", None)) if o is not None]
        self.stored: dict[str, TensorStorageMetadata] | None = None  # set by `to_load`, with what to load

    def to_load(self, stored: dict, keep_optimizer: bool, keep_head: bool, same_world: bool) -> AppState:
        """Load from a checkpoint of index `stored`: its optimizer state when it fits this run's
        optimizer, its head rows when they are this run's classes in this order, its RNG streams when
        it was written by as many ranks (they do not map onto other ranks)."""
        self.stored, self.keep_optimizer, self.keep_head = stored, keep_optimizer, keep_head
        self.same_world = same_world
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.stored is not None:
            return self._targets()
        entries = {}
        for key, value in get_model_state_dict(self.parts).items():
            if key.startswith(HEAD) or self.dims.writes_backbone:  # this rank's head rows, or replica 0
                entries[f"model.{key}"] = value.detach().cpu()
        for optimizer in [o for o in self.optimizers if o.state]:  # torch would fill an empty one
            for name, values in get_optimizer_state_dict(self.parts, optimizer)["state"].items():
                if name.startswith(HEAD) or self.dims.writes_backbone:
                    for state, value in values.items():
                        entries[f"optim.state.{name}.{state}"] = torch.as_tensor(value).detach().cpu()
        head = self.head
        for key in [k for k in entries if k.startswith(("model.head.", "optim.state.head."))]:
            if entries[key].shape[:1] == head.weight.shape[:1]:  # per class: as this rank's rows
                entries[key] = rows_of(head.per_class(entries[key]), head.class_start, head.num_classes)
        if self.ema is not None and self.dims.writes_backbone:
            entries.update({f"ema.{k}": v.detach().cpu() for k, v in self.ema.state_dict().items()})
        if self.scaler is not None and self.scaler.is_enabled() and self.dims.is_primary:
            entries["scaler.scale"] = torch.tensor(self.scaler.get_scale())
            entries["scaler.growth_tracker"] = torch.tensor(self.scaler.state_dict()["_growth_tracker"])
        entries[f"rng.{self.dims.rank}.torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            entries[f"rng.{self.dims.rank}.cuda"] = torch.cuda.get_rng_state()
        return entries

    def _targets(self) -> dict[str, torch.Tensor]:
        wanted = [f"model.{k}" for k in get_model_state_dict(self.parts) if k != HEAD or self.keep_head]
        if self.keep_optimizer:
            names = {n for n, p in self.parts.named_parameters() if n != HEAD or self.keep_head}
            for key in [k for k in self.stored if k.startswith(OPTIM_STATE)]:
                if key[len(OPTIM_STATE) :].rsplit(".", 1)[0] in names:  # optim.state.<param>.<state>
                    wanted.append(key[len(PREFIX) :])
        if self.ema is not None:
            wanted += [f"ema.{k}" for k in self.ema.state_dict()]
        wanted += ["scaler.scale", "scaler.growth_tracker"] if self.scaler is not None else []
        if self.same_world:
            wanted += [f"rng.{self.dims.rank}.torch", f"rng.{self.dims.rank}.cuda"]
        targets = {}
        for key in [k for k in wanted if PREFIX + k in self.stored]:  # empty, shaped and typed as stored
            meta = self.stored[PREFIX + key]
            if key == f"model.{HEAD}" or (key.startswith(f"optim.state.{HEAD}.") and len(meta.size) == 2):
                empty = torch.empty((self.head.class_count, meta.size[1]), dtype=meta.properties.dtype)
                targets[key] = rows_of(empty, self.head.class_start, meta.size[0])  # this rank's rows
            else:
                targets[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        return targets

    def load_state_dict(self, loaded: dict[str, torch.Tensor]) -> None:
        head = self.head
        model = {k[len("model.") :]: v for k, v in loaded.items() if k.startswith("model.")}
        if HEAD in model:
            model[HEAD] = model[HEAD].view_as(head.weight)
        set_model_state_dict(self.parts, model, options=StateDictOptions(strict=False))
        states: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in loaded.items():
            if key.startswith("optim.state."):
                name, state = key[len("optim.state.") :].rsplit(".", 1)
                is_rows = name == HEAD and value.dim() == 2 and value.shape[0] == head.class_count
                states.setdefault(name, {})[state] = value.view_as(head.weight) if is_rows else value
        for optimizer in self.optimizers:
            set_optimizer_state(self.parts, optimizer, states)
        if self.ema is not None and any(k.startswith("ema.") for k in loaded):
            self.ema.load_state_dict({k[len("ema.") :]: v for k, v in loaded.items() if k.startswith("ema.")})
        if "scaler.scale" in loaded and self.scaler is not None and self.scaler.is_enabled():
            scale, growth = float(loaded["scaler.scale"]), int(loaded["scaler.growth_tracker"])
            self.scaler.load_state_dict(
                {**self.scaler.state_dict(), "scale": scale, "_growth_tracker": growth}
            )
        rank = self.dims.rank
        if f"rng.{rank}.torch" in loaded:
            torch.set_rng_state(loaded[f"rng.{rank}.torch"])
            if torch.cuda.is_available() and f"rng.{rank}.cuda" in loaded:
                torch.cuda.set_rng_state(loaded[f"rng.{rank}.cuda"])


def set_optimizer_state(parts: nn.Module, optimizer: torch.optim.Optimizer, states: dict) -> None:
    """Give `optimizer` the loaded state of its parameters through torch's `set_optimizer_state_dict`,
    with this run's param groups (hyperparameters come from the config, not the checkpoint)."""
    names = {param: name for name, param in parts.named_parameters()}
    groups = [{**group, "params": [names[p] for p in group["params"]]} for group in optimizer.param_groups]
    mine = {name: states[name] for group in groups for name in group["params"] if name in states}
    if not mine:
        return
    for values in mine.values():
        if "step" in values:  # stored as torch makes it: a 0-d float32 tensor
            values["step"] = torch.tensor(float(values["step"]), dtype=torch.float32)
    state_dict = {"state": mine, "param_groups": groups}
    set_optimizer_state_dict(parts, optimizer, state_dict, options=StateDictOptions(strict=False))
