"""TensorBoard: event files in `RUN/tensorboard`, the default tracker (`tensorboard` is in the app extra)."""

from __future__ import annotations

from pathlib import Path

from facetrain.train.trackers.base import TRACKERS, missing


class TensorBoardTracker:
    module, package, extra = "tensorboard", "tensorboard", "app"  # imported, installed, facetrain's extra

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing("tensorboard") from None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log_config(self, config: dict) -> None:
        """The config stays in RUN/config.yaml; TensorBoard's scalars need no copy of it."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


TRACKERS.register("tensorboard")(TensorBoardTracker)
