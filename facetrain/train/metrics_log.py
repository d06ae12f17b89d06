"""Where training metrics go: a CSV beside the run (always) and TensorBoard (when installed)."""

from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = ["step", "epoch", "loss", "accuracy", "lr", "images_per_s", "elapsed_s"]


class MetricsLog:
    """Appends rows to `<run>/metrics.csv`; a resumed run continues the same file."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = run_dir / "metrics.csv"
        self.tensorboard = None
        if not enabled:
            return
        if not self.path.exists():
            with self.path.open("w", newline="") as handle:
                csv.writer(handle).writerow(COLUMNS)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, row: dict[str, float]) -> None:
        if not self.enabled:
            return
        with self.path.open("a", newline="") as handle:
            csv.writer(handle).writerow([row.get(c, "") for c in COLUMNS])
        if self.tensorboard is not None:
            for key, value in row.items():
                if key not in ("step", "epoch"):
                    self.tensorboard.add_scalar(f"train/{key}", value, row["step"])

    def log_eval(self, step: int, results: dict[str, float]) -> None:
        if self.enabled and self.tensorboard is not None:
            for key, value in results.items():
                if isinstance(value, int | float):
                    self.tensorboard.add_scalar(f"eval/{key}", value, step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
