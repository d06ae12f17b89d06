"""A run's training figures: written as it trains and watched.

Rank 0 appends a row per log interval (means over it) to `metrics.csv` beside the run, and sends it
to the trackers `train.trackers` names (TensorBoard by default; `facetrain.train.trackers`).
Once, at UNDERFIT_CHECK_SHARE of the schedule, the logged training accuracy is compared with chance:
a recipe fitted to a few dozen identities can leave a run on thousands near chance for its whole
schedule (docs/accuracy.md measured 8 % training accuracy after 1,800 steps on 1,505 LFW people), which the loss alone does not tell a newcomer. Not before the lr's
warmup is over, and not in a run too short to judge (UNDERFIT_MIN_STEPS): at 2 of 6 steps every
recipe is near chance, so a warning there would be about the run's length, not its recipe.

`facetrain/train/curves.py` reads these rows back and draws them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from facetrain.checkpoint.run_dir import METRICS_COLUMNS as COLUMNS
from facetrain.files import append_to_record, write_failure_advice
from facetrain.logger import logger
from facetrain.train.trackers import open_trackers, tracker_failed

# Checked once, when this share of the schedule is done: late enough for any sane warmup to be over,
# early enough that stopping saves most of the run.
UNDERFIT_CHECK_SHARE = 0.3
# Runs shorter than this are smoke tests: no recipe is past chance within their first steps.
UNDERFIT_MIN_STEPS = 30
# "Near chance": training accuracy within this many points of 1 / classes.
UNDERFIT_MARGIN = 0.05


class MetricsLog:
    """Appends rows to `<run>/metrics.csv` and sends them to the trackers; a resumed run continues the
    same file.

    A record that cannot be written (made read-only, a full disk) never stops training, whose weights
    matter more: it is one warning naming the file, and the run goes on checkpointing. metrics.csv is
    opened for each row, so its rows are kept again once it takes them; a tracker that failed is
    dropped (TensorBoard's writer is gone with its error)."""

    def __init__(self, run_dir: Path, enabled: bool, trackers: list[str] = (), config: dict | None = None):
        self.enabled = enabled
        self.path = run_dir / "metrics.csv"
        self.trackers = []
        self.failing: set[Path] = set()  # metrics.csv, while its writes fail (said once)
        if not enabled:
            return
        if not self.path.exists():
            self._append(COLUMNS)
        self.trackers = open_trackers(list(trackers), run_dir)
        self._to_trackers(lambda tracker: tracker.log_config(config or {}))

    def log(self, row: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._append([row.get(c, "") for c in COLUMNS])
        figures = {f"train/{key}": value for key, value in row.items() if key not in ("step", "epoch")}
        self._to_trackers(lambda tracker: tracker.log_metrics(row["step"], figures))

    def log_eval(self, step: int, results: dict[str, float]) -> None:
        figures = {f"eval/{key}": value for key, value in results.items() if isinstance(value, int | float)}
        self._to_trackers(lambda tracker: tracker.log_metrics(step, figures))

    def close(self) -> None:
        self._to_trackers(lambda tracker: tracker.close())

    def _append(self, values: list) -> None:
        error = append_to_record(self.path, lambda handle: csv.writer(handle).writerow(values), self.failing)
        if error is not None:
            logger.warning(
                f"warning: cannot write {self.path}: {error.strerror or error}; training goes on, its rows "
                f"unrecorded until you {write_failure_advice(error)}"
            )

    def _to_trackers(self, call) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except OSError as error:
                self.trackers.remove(tracker)
                logger.warning(tracker_failed(error, tracker.module, self.path.parent))


@dataclass
class UnderfitWatch:
    """Looks at the logged training accuracy once, at UNDERFIT_CHECK_SHARE of the schedule, after the
    warmup and UNDERFIT_MIN_STEPS; a run that ends before that is never judged."""

    total_steps: int
    num_classes: int
    warmup_steps: int = 0
    checked: bool = False

    @property
    def check_step(self) -> float:
        return max(UNDERFIT_CHECK_SHARE * self.total_steps, self.warmup_steps, UNDERFIT_MIN_STEPS)

    def check(self, step: int, accuracy: float) -> str | None:
        """The warning to print, once, if the run is near chance at the check point; else None."""
        if self.checked or step < self.check_step:
            return None
        self.checked = True
        chance = 1.0 / max(self.num_classes, 1)
        if accuracy >= chance + UNDERFIT_MARGIN:
            return None
        return (
            f"warning: the model looks under-fitted: training accuracy {100 * accuracy:.2f} % after "
            f"{step} of {self.total_steps} steps, near chance ({100 * chance:.2f} % for "
            f"{self.num_classes} classes); more steps, a higher optim.lr or a recipe for this data size "
            "(docs/accuracy.md) would help"
        )
