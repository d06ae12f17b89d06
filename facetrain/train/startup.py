"""How long a run takes to reach its first step, and where that time goes (issue 56, item 4).

A run's first minutes are not training: joining the process group, scanning the data, building and
parallelizing the model, loading a checkpoint (`setup`); then the loader's workers start and decode the
first batches (`first_batch`); then the first step itself, which compiles the backbone
(`model.compile`), times cuDNN's algorithms (`cudnn.benchmark`) and allocates the caches
(`first_step`). The run logs the three once and keeps them in its summary, so a slow start is seen
and its part named instead of being averaged into the first log interval's images/s.

The first step is timed to the end of its kernels: the clock waits for the device once, at step 1.
"""

from __future__ import annotations

import time

import torch


class StartupClock:
    """Started when the run starts; `setup_done` as the training loop begins, then `batches_ready` and
    `step_done` mark the first step only (later calls do nothing), and `parts` then holds the seconds
    of each part and their total."""

    def __init__(self):
        self.began = self.last = time.perf_counter()
        self.parts: dict[str, float] | None = None
        self._marks: dict[str, float] = {}

    def _mark(self, name: str) -> None:
        now = time.perf_counter()
        self._marks[name] = now - self.last
        self.last = now

    def setup_done(self) -> None:
        self._mark("setup_s")

    def batches_ready(self) -> None:
        if self.parts is None and "first_batch_s" not in self._marks:
            self._mark("first_batch_s")

    def step_done(self, device: torch.device) -> bool:
        """True once, right after the first step (waiting for `device` to finish it): the figures are
        then in `parts`."""
        if self.parts is not None or "first_batch_s" not in self._marks:
            return False
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._mark("first_step_s")
        self.parts = {**self._marks, "total_s": self.last - self.began}
        return True

    def line(self) -> str:
        parts = self.parts or {}
        return (
            f"start-up: first step done {parts['total_s']:.1f} s after the run started (setup "
            f"{parts['setup_s']:.1f} s, first batch {parts['first_batch_s']:.1f} s, first step "
            f"{parts['first_step_s']:.1f} s)"
        )
