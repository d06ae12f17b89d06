"""Each rank's entry point: one rank's whole training run under torch elastic's `@record`.

`facetrain train` calls it in its own process (alone, or as a rank torchrun started); `--nproc` starts it
as each of its ranks (`parallel.launch.launch_local`). `@record` leaves an unexpected error's traceback
in the file torch elastic names for the rank (`TORCHELASTIC_ERROR_FILE`), where torchrun's summary and
the `--nproc` launcher read it. A user error is one line instead: a `--nproc` rank records it there
(`parallel.launch.record_user_error`) and exits 2, its launcher printing the first cause; elsewhere the
command line prints and records it.

A stop signal is caught for the rank's whole life (`step_gate.StopSignals`): the training loop stops at
its next step boundary, and under a launcher's agent, which stops the other ranks with SIGTERM once one
failed, the rank finishes reporting why it stops instead of dying silently.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from facetrain.errors import FacetrainError
from facetrain.logger import warnings_beside_info
from facetrain.parallel.launch import USER_ERROR_EXIT, launched_locally, rank_threads, record_user_error
from facetrain.parallel.launcher_watch import run_watched
from facetrain.train.run_config import Config
from facetrain.train.step_gate import StopSignals, ignore_stop_signals
from facetrain.train.trainer import train


@record
def train_rank(cfg: Config, resume: str | None, report_summary: Callable[[dict], None]) -> None:
    """Train with `cfg` (`resume`: None, "auto" or a checkpoint path) and hand the summary to
    `report_summary`. A `--nproc` rank takes OMP_NUM_THREADS threads, or else its share of the cores
    (torchrun sets OMP_NUM_THREADS itself); under torchrun's agent the rank ends within
    `parallel.timeout_s` of the agent's death (`launcher_watch`; `--nproc` watches its ranks itself)."""
    StopSignals().install()
    if launched_locally():
        torch.set_num_threads(rank_threads())
    try:
        with warnings_beside_info():  # a run's warnings on stdout, in order with its other lines
            if "TORCHELASTIC_RUN_ID" in os.environ and not launched_locally():
                summary = run_watched(train, os.getppid(), cfg.parallel.timeout_s, cfg, resume)
            else:
                summary = train(cfg, resume)
    except FacetrainError as error:
        if not launched_locally():
            raise  # the command line prints it, once over all ranks
        record_user_error(error)
        sys.exit(USER_ERROR_EXIT)
    finally:
        ignore_stop_signals()
    report_summary(summary)
