"""Training checkpoints (layer 2): written by every rank, read back on any number of ranks, or without any.

    runs/NAME/checkpoints/
      step_00005000/    a torch.distributed.checkpoint (DCP) directory + meta.json, config.yaml, classes.json
      last, best        small files naming a checkpoint directory

A run talks to one object, `checkpointer.Checkpointer` (torchtitan's `CheckpointManager` idea), made
from the run's `checkpoint` config section (`config`): it claims the run directory (`run_dir`: what
may be there, the lock), finds what to resume from (`resume_point`), and, given the states, restores
the whole run from it, says when a checkpoint is due and writes it. Read `app_state` (what a checkpoint
holds) first, then `writer` (atomic writing, pruning), `reader`, `layout` (finding one and its small
files), `storage` (DCP with a safe index reader), `names` (the keys) and `legacy`. The ranks
are known through `ranks.RankRoles` (what `parallel.ParallelDims` answers), so checkpoint/ does not
import parallel/. checkpoint/ knows the model and data sections of a saved config.yaml
(`saved_model_config`), not the run's whole tree (train/'s); `facetrain.interop.load_model`, the one way
to load a model, builds a checkpoint's backbone from them and fills it with `load_backbone_weights`.
"""

from facetrain.checkpoint.app_state import CheckpointStates
from facetrain.checkpoint.checkpointer import Checkpointer, SaveClock
from facetrain.checkpoint.layout import (
    find_resume_point,
    holds_checkpoints,
    read_classes,
    read_meta,
    resolve_checkpoint,
)
from facetrain.checkpoint.reader import (
    check_config_describes_weights,
    load_backbone_weights,
    load_full_head,
    read_entries,
    saved_model_config,
)
from facetrain.checkpoint.storage import check_row_shards_supported, stored

# what callers outside the package use (facetrain/ and tools/); tests may import the modules
__all__ = [
    "CheckpointStates",
    "Checkpointer",
    "SaveClock",
    "check_config_describes_weights",
    "check_row_shards_supported",
    "find_resume_point",
    "holds_checkpoints",
    "load_backbone_weights",
    "load_full_head",
    "read_classes",
    "read_entries",
    "read_meta",
    "resolve_checkpoint",
    "saved_model_config",
    "stored",
]
