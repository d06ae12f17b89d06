"""Training checkpoints: written by every rank, read back on any number of ranks, or without any.

    runs/NAME/checkpoints/
      step_00005000/    a torch.distributed.checkpoint (DCP) directory + meta.json, config.yaml, classes.json
      last, best        small files naming a checkpoint directory

Read in this order:

- `app_state`: what a checkpoint holds: one `Stateful` over the model parts and optimizers, saved and
  loaded by DCP through torch's `get_/set_model_state_dict` and `get_/set_optimizer_state_dict`; the
  head as row ranges of one C-row tensor, which DCP reshards N -> M by itself.
- `writer`: `save_checkpoint`, atomic (`step_N.tmp` renamed when whole), pruning old ones.
- `reader`: `load_checkpoint` to resume, and `load_backbone` / `load_full_head` without a group.
- `layout`: finding a checkpoint (`--resume auto`, pointers, damaged ones) and its small files.
- `storage`: DCP with a safe index reader; `names`: the keys; `legacy`: reading the first format.
"""

from facetrain.checkpoint.layout import (
    complete_checkpoints,
    find_damage,
    find_resume_point,
    holds_checkpoints,
    read_classes,
    read_config,
    read_meta,
    resolve_checkpoint,
)
from facetrain.checkpoint.reader import (
    load_backbone,
    load_backbone_weights,
    load_checkpoint,
    load_ema_weights,
    load_full_head,
    read_entries,
    read_rows,
)
from facetrain.checkpoint.storage import check_row_shards_supported, stored
from facetrain.checkpoint.writer import TrainState, save_checkpoint

__all__ = [
    "TrainState",
    "check_row_shards_supported",
    "complete_checkpoints",
    "find_damage",
    "find_resume_point",
    "holds_checkpoints",
    "load_backbone",
    "load_backbone_weights",
    "load_checkpoint",
    "load_ema_weights",
    "load_full_head",
    "read_classes",
    "read_config",
    "read_entries",
    "read_meta",
    "read_rows",
    "resolve_checkpoint",
    "save_checkpoint",
    "stored",
]
