"""Weights & Biases: a W&B run per start of the facetrain run, its files under `RUN/wandb`.

W&B's own settings apply (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE=offline for `wandb sync` later).
Figures are logged against facetrain's step as a metric of its own, not W&B's step counter: a resumed
run logs again the steps after its last checkpoint, which W&B's counter would drop as going back.
"""

from __future__ import annotations

from pathlib import Path

from facetrain.train.trackers.base import TRACKERS, missing


class WandbTracker:
    module, package, extra = "wandb", "wandb", "wandb"  # imported, installed, facetrain's extra

    def __init__(self, run_dir: Path):
        try:
            import wandb
        except ImportError:
            raise missing("wandb") from None
        self.run = wandb.init(dir=str(run_dir), name=run_dir.resolve().name, reinit="create_new")
        self.run.define_metric("*", step_metric="step")

    def log_config(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "step": step})

    def close(self) -> None:
        self.run.finish()


TRACKERS.register("wandb")(WandbTracker)
