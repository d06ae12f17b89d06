"""The `checkpoint` section of a run's config: when a run writes a checkpoint and how many it keeps.

The `Checkpointer` reads it whole, so a new checkpoint setting is a field here and the code in
`checkpointer.py` that acts on it. Until #59 these keys lived in `train` (`train.checkpoint_every`,
`train.checkpoint_every_minutes`, `train.keep_checkpoints`); configs, `--set` and the config.yaml of
older runs and checkpoints that still say so are read as the keys here (`formerly`).
"""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.config.checks import Within, at_least, setting


@dataclass
class CheckpointConfig:
    every: int = setting(500, at_least(1), formerly="train.checkpoint_every")  # steps
    # also by time, by rank 0's clock: bounds what a stop without warning (SIGKILL, a lost node) loses
    every_minutes: float | None = setting(
        None, Within(0, 30 * 24 * 60, "(]"), formerly="train.checkpoint_every_minutes"
    )
    # the newest kept (at least 1), besides the best; older ones are pruned at each save
    keep: int = setting(3, at_least(1), formerly="train.keep_checkpoints")
