"""TensorBoard: event files in `RUN/tensorboard`, the default tracker (`tensorboard` is in the app extra)."""

from __future__ import annotations

import threading
from pathlib import Path

from facetrain.train.trackers.base import TRACKERS, missing


class TensorBoardTracker:
    module, package, extra = "tensorboard", "tensorboard", "app"  # imported, installed, facetrain's extra

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing("tensorboard") from None
        _quiet_writer_threads()
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log_config(self, config: dict) -> None:
        """The config stays in RUN/config.yaml; TensorBoard's scalars need no copy of it."""

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


def _quiet_writer_threads() -> None:
    """TensorBoard writes its event file from a thread, which keeps a failed write's OSError for the
    writer's next call (where `MetricsLog` says it in one line and goes on without TensorBoard) and
    then ends with it, which Python would print as a traceback: that traceback is left out."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def excepthook(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.thread, _AsyncWriterThread) and issubclass(args.exc_type, OSError)):
            previous(args)

    excepthook.quiets_tensorboard = True
    threading.excepthook = excepthook


TRACKERS.register("tensorboard")(TensorBoardTracker)
