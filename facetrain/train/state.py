"""Where a run is: the step, the sample position in the epoch, and the best verification so far.

The trainer owns it; the checkpointer saves and restores it as the run's train state (a `Stateful`,
torchtitan's `train_state`); a checkpoint keeps it in meta.json
(`facetrain.checkpoint.names.TRAIN_STATE_KEYS`), so the checkpoint layer needs no class of the
trainer's to write or read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from torch.distributed.checkpoint.stateful import Stateful


@dataclass
class TrainState(Stateful):
    step: int = 0
    epoch: int = 0
    consumed: int = 0  # samples all ranks together have used in the current epoch
    best_accuracy: float | None = None
    best_step: int | None = None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        for field in fields(self):
            setattr(self, field.name, state_dict[field.name])
