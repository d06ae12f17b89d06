"""A run's training figures: written as it trains, watched, read back and drawn.

Rank 0 appends a row per log interval (means over it) to `metrics.csv` beside the run, and to
TensorBoard when it is installed. Once, at UNDERFIT_CHECK_SHARE of the schedule, the logged training
accuracy is compared with chance: a recipe fitted to a few dozen identities can leave a run on
thousands near chance for its whole schedule (docs/accuracy.md measured 8 % training accuracy after
1,800 steps on 1,505 LFW people), which the loss alone does not tell a newcomer. Not before the lr's
warmup is over, and not in a run too short to judge (UNDERFIT_MIN_STEPS): at 2 of 6 steps every
recipe is near chance, so a warning there would be about the run's length, not its recipe.

The curves (loss, batch accuracy and verification accuracy against the step) are drawn from
`metrics.csv` and `eval/step_N.json` (each verification, `eval.every`): the trainer draws its own run
into `RUN/curves.png` when it finishes; `facetrain plot` draws several runs on one figure.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from facetrain.errors import FacetrainError
from facetrain.files import write_atomic

CURVES_FILE = "curves.png"
COLUMNS = ["step", "epoch", "loss", "accuracy", "lr", "images_per_s", "elapsed_s"]
# Checked once, when this share of the schedule is done: late enough for any sane warmup to be over,
# early enough that stopping saves most of the run.
UNDERFIT_CHECK_SHARE = 0.3
# Runs shorter than this are smoke tests: no recipe is past chance within their first steps.
UNDERFIT_MIN_STEPS = 30
# "Near chance": training accuracy within this many points of 1 / classes.
UNDERFIT_MARGIN = 0.05


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


@dataclass
class RunCurves:
    label: str
    steps: list[int]
    loss: list[float]
    accuracy: list[float]
    eval_steps: list[int]
    eval_accuracy: list[float]


def read_run_curves(run_dir: Path, label: str | None = None) -> RunCurves:
    """A run's logged figures, one value per step: a resumed run logs again the steps after its last
    checkpoint, and the later row (the run that went on) wins."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.csv"
    if not metrics.is_file():
        raise FacetrainError(f"{run_dir} has no metrics.csv; give a run directory (train.output_dir)")
    rows: dict[int, tuple[float, float]] = {}
    with metrics.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                rows[int(row["step"])] = (float(row["loss"]), float(row["accuracy"]))
            except (KeyError, TypeError, ValueError):
                raise FacetrainError(
                    f"{metrics} line {line}: expected step, loss and accuracy columns with numbers"
                ) from None
    evaluations: dict[int, float] = {}
    for path in sorted((run_dir / "eval").glob("step_*.json")):
        try:
            result = json.loads(path.read_text())
            evaluations[int(result["step"])] = float(result["accuracy"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise FacetrainError(f"{path} is not a verification result (step, accuracy)") from None
    steps = sorted(rows)
    eval_steps = sorted(evaluations)
    return RunCurves(
        label=label or run_dir.name,
        steps=steps,
        loss=[rows[step][0] for step in steps],
        accuracy=[rows[step][1] for step in steps],
        eval_steps=eval_steps,
        eval_accuracy=[evaluations[step] for step in eval_steps],
    )


def curves_figure(runs: list[RunCurves]) -> Figure:
    """One figure, three panels, a line per run. The panels share the step axis, so a run with one
    evaluation so far shows it at its step, not alone on an axis of its own making."""
    figure = Figure(figsize=(15, 4.2), dpi=100, layout="constrained")
    loss_axes, accuracy_axes, eval_axes = figure.subplots(1, 3, sharex=True)
    for run in runs:
        (line,) = loss_axes.plot(run.steps, run.loss, label=run.label)
        accuracy_axes.plot(run.steps, run.accuracy, color=line.get_color())
        if run.eval_steps:
            eval_axes.plot(
                run.eval_steps, run.eval_accuracy, marker="o", markersize=3, color=line.get_color()
            )
    loss_axes.set(title="training loss", xlabel="step")
    accuracy_axes.set(title="training accuracy (top-1 on its batches)", xlabel="step")
    eval_axes.set(title="verification accuracy (eval.pairs)", xlabel="step")
    if not any(run.eval_steps for run in runs):
        eval_axes.text(
            0.5, 0.5, "no verification: set eval.pairs", ha="center", transform=eval_axes.transAxes
        )
    for axes in (loss_axes, accuracy_axes, eval_axes):
        axes.grid(alpha=0.3)
    loss_axes.legend(fontsize="small")
    return figure


def plot_curves(runs: list[RunCurves], out: Path) -> Path:
    figure = curves_figure(runs)
    write_atomic(Path(out), lambda tmp: figure.savefig(tmp, format="png"))
    return Path(out)
