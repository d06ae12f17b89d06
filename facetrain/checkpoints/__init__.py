"""Reading facetrain checkpoints, for training and for everything after it (eval, export, embed).

A checkpoint is `<run>/checkpoints/step_NNNNNNNN/`: a torch.distributed.checkpoint directory of flat
tensor entries, plus `meta.json`, `config.yaml` and `classes.json`. `last` and `best` are small pointer
files naming a checkpoint directory. The head and its optimizer state are stored per class range
(`head/weight/<start>-<count>`), so any number of ranks can read any other number's shards. Writing is
the trainer's business (`facetrain.train.checkpoint`).
"""

from facetrain.checkpoints.reader import (
    POINTERS,
    complete_checkpoints,
    find_damage,
    find_resume_point,
    holds_checkpoints,
    is_checkpoint,
    is_range_key,
    latest_checkpoint,
    load_backbone,
    load_backbone_weights,
    load_full_head,
    parse_range_key,
    range_key,
    read_class_rows,
    read_class_rows_at,
    read_classes,
    read_config,
    read_meta,
    resolve_checkpoint,
)

__all__ = [
    "POINTERS",
    "complete_checkpoints",
    "find_damage",
    "find_resume_point",
    "holds_checkpoints",
    "is_checkpoint",
    "is_range_key",
    "latest_checkpoint",
    "load_backbone",
    "load_backbone_weights",
    "load_full_head",
    "parse_range_key",
    "range_key",
    "read_class_rows",
    "read_class_rows_at",
    "read_classes",
    "read_config",
    "read_meta",
    "resolve_checkpoint",
]
