"""The `train` section of a run's config: batch, steps, precision and logging (checkpointing has its
own section, `facetrain.checkpoint.config`); the trackers are checked against those
`facetrain.train.trackers` registers."""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.choices import TRAIN_PRECISIONS
from facetrain.config.bounds import BATCH_SIZE, SEED
from facetrain.config.checks import NotEmpty, OneOf, RegisteredEach, Within, at_least, setting
from facetrain.train.trackers import TRACKERS


@dataclass
class TrainConfig:
    output_dir: str = setting("runs/default", NotEmpty(), path=True)
    batch_size: int = setting(128, BATCH_SIZE)  # per rank and micro-batch
    # Images per optimizer step over all ranks, held on any world size by accumulating micro-batches
    # (optim.grad_accumulation is then derived); None: batch_size x ranks x optim.grad_accumulation.
    global_batch: int | None = setting(None, Within(1, 2**30))
    steps: int = setting(1000, Within(1, 10**9))  # optimizer steps; 1e20 would never end
    seed: int = setting(0, SEED)
    # fp32 | bf16 | fp16 (CUDA) | auto: bf16 where the device computes it natively (a GPU from Ampere
    # on; a CPU with AVX512-BF16 or AMX), else fp32; the run's saved config and log hold the choice
    precision: str = setting("fp32", OneOf(TRAIN_PRECISIONS))
    deterministic: bool = False
    log_every: int = setting(10, at_least(1))
    max_nonfinite_steps: int = setting(
        20, at_least(0)
    )  # fp16 scaler skips tolerated in a row before stopping
    # resuming on data whose classes differ from the checkpoint's (by name, in order) is refused; true:
    # head rows follow their class by name, new classes start fresh, classes no longer there are dropped
    remap_classes: bool = False
    # where rank 0 also sends the figures of metrics.csv (facetrain.train.trackers): tensorboard, wandb,
    # mlflow; each an optional package (wandb and mlflow are extras of their own); []: metrics.csv alone
    trackers: list[str] = setting(["tensorboard"], RegisteredEach(TRACKERS))
