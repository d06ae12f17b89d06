"""Between two steps: fetch the next step's batches, then let every rank agree whether to take it.

Two things stop a run between steps rather than in the middle of one. A stop signal (SIGTERM from a
scheduler that preempts the job or from torchrun's agent, SIGUSR1 from a scheduler's warning before
the time limit, SIGINT from Ctrl-C) only sets a flag, in the training process (its DataLoader workers
ignore them: `facetrain.data.loader_workers`); and a data error (an image that became unreadable
mid-run) is caught while fetching. Either may reach one rank only, and a rank that
stops alone leaves the others waiting in a collective, so before each step the ranks all-reduce two
flags and all stop together, at the same step, able to write one last checkpoint together.

The same all-reduce carries a third flag: rank 0's clock says a checkpoint is due
(`checkpoint.every_minutes`, the checkpointer's `SaveClock`). Clocks differ between hosts, so rank 0
alone asks and every rank learns it before the step, at no extra collective; the checkpointer then
saves on every rank after the step.

The agreement is a three-integer all-reduce on a gloo group over the CPU (`ParallelDims.control_group`):
a few tens of microseconds per step, and on GPUs it synchronizes the hosts but never the device
streams, so it does not stall the GPU queue the way a device all-reduce read back each step would.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import torch

from facetrain.checkpoint import SaveClock
from facetrain.data.decode import DataError
from facetrain.data.loader_workers import STOP_SIGNALS
from facetrain.heads import collectives
from facetrain.parallel.dims import ParallelDims
from facetrain.train.state import TrainState

_received: signal.Signals | None = None  # the first stop signal since the handlers went in
_received_at: float | None = None  # its time.monotonic(): how long the stop took is measured from it


def _record(signum: int, frame) -> None:
    global _received, _received_at
    if _received is None:
        _received, _received_at = signal.Signals(signum), time.monotonic()


class StopSignals:
    """SIGTERM, SIGINT and SIGUSR1, once installed, record that a stop was asked for instead of killing.

    A repeated signal changes nothing (torchrun's agent forwards the Ctrl-C every process already
    got); the stop takes at most one step and a checkpoint, and SIGKILL still ends a process at once.
    Installs nest: a rank may catch the signals for its whole life and the training loop again for
    its own, and a signal caught by either is the loop's. Handlers can only be installed from the
    main thread; elsewhere the signals are left as they are.
    """

    def __init__(self):
        self._previous: dict = {}

    @property
    def received(self) -> signal.Signals | None:
        return _received

    @property
    def received_at(self) -> float | None:
        return _received_at

    def install(self) -> StopSignals:
        global _received, _received_at
        try:
            if signal.getsignal(signal.SIGTERM) is not _record:
                _received, _received_at = None, None
            self._previous = {sig: signal.signal(sig, _record) for sig in STOP_SIGNALS}
        except ValueError:  # not the main thread
            self._previous = {}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def ignore_stop_signals() -> None:
    """From now until the process exits, stop signals are ignored: call it once the run's work is done.

    The interpreter puts the default handlers back while it shuts down, so a stop signal then (a
    scheduler's second one, a storm of Ctrl-C) would kill a process that has already written its
    checkpoint, with the signal as its exit status instead of the run's own."""
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


class StepGate:
    """Fetches each step's micro-batches ahead of the step and holds the ranks' verdict on it."""

    def __init__(
        self,
        batches: Iterator,
        accumulation: int,
        state: TrainState,
        dims: ParallelDims,
        clock: SaveClock | None = None,
    ):
        self.batches, self.accumulation, self.state, self.dims = batches, accumulation, state, dims
        self.clock = clock
        self.checkpoint_due = False  # after the step the gate let through, by rank 0's clock
        self.stop_signal: signal.Signals | None = None
        self.data_error: DataError | None = None  # this rank's, when its data failed
        self.data_failed = False  # on some rank

    @property
    def stopped(self) -> bool:
        return self.stop_signal is not None or self.data_failed

    def next_step(self, signals: StopSignals) -> list | None:
        """The next step's micro-batches, or None when the ranks agreed to stop before it.

        On a stop the sample position in `state` is put back to where this step began, so a checkpoint
        written now resumes with exactly the batches this step would have used.
        """
        position = (self.state.epoch, self.state.consumed)
        micro_batches = []
        try:
            for _ in range(self.accumulation):
                micro_batches.append(next(self.batches))
        except DataError as error:
            self.data_error = error
        clock_due = self.dims.is_primary and self.clock is not None and self.clock.due()
        local = [int(signals.received or 0), int(self.data_error is not None), int(clock_due)]
        flags = torch.tensor(
            local, dtype=torch.int64, device=collectives.collective_device(self.dims.control_group)
        )
        collectives.all_reduce_(flags, "max", self.dims.control_group)
        signal_number, data_failed, checkpoint_due = flags.tolist()
        self.checkpoint_due = bool(checkpoint_due)
        if not (signal_number or data_failed):
            return micro_batches
        self.stop_signal = signal.Signals(signal_number) if signal_number else None
        self.data_failed = bool(data_failed)
        self.state.epoch, self.state.consumed = position
        return None
