"""A run's curves, read back from what the trainer logged and drawn as a report would show them.

The figures come from `metrics.csv` (`facetrain/train/metrics.py`: loss, batch accuracy and lr per log
interval) and `eval/step_N.json` (each verification, `eval.every`, with its spread over folds). The
trainer draws its own run into `RUN/curves.png` when it finishes; `facetrain plot` draws several runs
on one figure. Matplotlib's autoscaling zooms the verification axis onto a wiggle smaller than the
folds disagree by (0.600-0.608 for a run whose folds spread ± 23.6 %), so the accuracy axes are set
here to hold every fold's band and at least MIN_ACCURACY_SPAN.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from facetrain.errors import FacetrainError
from facetrain.files import write_atomic

CURVES_FILE = "curves.png"
# The narrowest accuracy axis drawn (a fraction): differences below it are noise on any pair set.
MIN_ACCURACY_SPAN = 0.05
# The largest magnitude drawn; past about 1e300 matplotlib's tick locator overflows (a loss never gets near)
DRAWABLE_LIMIT = 1e100


@dataclass
class RunCurves:
    """One run's logged figures: `lr` is None where metrics.csv has no lr column, `eval_std` is each
    verification's standard deviation over its folds (None where the result did not record it)."""

    label: str
    steps: list[int]
    loss: list[float]
    accuracy: list[float]
    lr: list[float] | None
    eval_steps: list[int]
    eval_accuracy: list[float]
    eval_std: list[float | None]
    eval_set: str | None


def read_run_curves(run_dir: Path, label: str | None = None) -> RunCurves:
    """A run's logged figures, one value per step: a resumed run logs again the steps after its last
    checkpoint, and the later row (the run that went on) wins."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.csv"
    if not metrics.is_file():
        raise FacetrainError(f"{run_dir} has no metrics.csv; give a run directory (train.output_dir)")
    rows: dict[int, tuple[float, float, float | None]] = {}
    with metrics.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                lr = _drawable(float(row["lr"])) if row.get("lr") else None
                rows[int(row["step"])] = (
                    _drawable(float(row["loss"])),
                    _drawable(float(row["accuracy"])),
                    lr,
                )
            except (KeyError, TypeError, ValueError):
                raise FacetrainError(
                    f"{metrics} line {line}: expected step, loss and accuracy columns with numbers"
                ) from None
    evaluations: dict[int, tuple[float, float | None]] = {}
    eval_set = None
    for path in sorted((run_dir / "eval").glob("step_*.json")):
        try:
            result = json.loads(path.read_text())
            std = result.get("accuracy_std")
            accuracy, std = float(result["accuracy"]), None if std is None else float(std)
            evaluations[int(result["step"])] = (accuracy, std)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError):
            raise FacetrainError(f"{path} is not a verification result (step, accuracy)") from None
        # an accuracy is a fraction; anything else (inf, nan, 7) is a damaged or foreign file, and the
        # axis it would stretch cannot be drawn
        if not 0.0 <= accuracy <= 1.0 or not (std is None or 0.0 <= std <= 1.0):
            raise FacetrainError(
                f"{path} is not a verification result: accuracy {accuracy} ± {std} is not a fraction from 0 to 1"
            )
        eval_set = result.get("best_by") or eval_set
    steps = sorted(rows)
    eval_steps = sorted(evaluations)
    lr = [rows[step][2] for step in steps]
    return RunCurves(
        label=label or run_dir.name,
        steps=steps,
        loss=[rows[step][0] for step in steps],
        accuracy=[rows[step][1] for step in steps],
        lr=None if None in lr else lr,
        eval_steps=eval_steps,
        eval_accuracy=[evaluations[step][0] for step in eval_steps],
        eval_std=[evaluations[step][1] for step in eval_steps],
        eval_set=eval_set,
    )


def _drawable(value: float) -> float:
    """The value, or nan (a gap in its line) where no axis can hold it: inf and nan (a diverged step), or
    a magnitude past DRAWABLE_LIMIT, whose axis ticks matplotlib cannot compute (a damaged file)."""
    return value if abs(value) <= DRAWABLE_LIMIT else math.nan


def curves_figure(runs: list[RunCurves]) -> Figure:
    """Four panels (loss, training accuracy, verification accuracy with its fold band, lr), a line per
    run in one colour throughout and a legend in each. The panels share the step axis, so a run with
    one evaluation so far shows it at its step, not alone on an axis of its own making."""
    figure = Figure(figsize=(12, 8), dpi=100, layout="constrained")
    (loss_axes, accuracy_axes), (eval_axes, lr_axes) = figure.subplots(2, 2, sharex=True)
    figure.suptitle(figure_title(runs))
    for index, run in enumerate(runs):
        (line,) = loss_axes.plot(run.steps, run.loss, label=run.label)
        colour = line.get_color()
        accuracy_axes.plot(run.steps, run.accuracy, color=colour, label=run.label)
        if run.lr is not None:
            lr_axes.plot(run.steps, run.lr, color=colour, label=run.label)
        if run.eval_steps:
            _draw_verification(eval_axes, run, colour, band_label=index == 0)
    loss_axes.set(title="training loss", ylabel="loss")
    accuracy_axes.set(title="training accuracy (top-1 on its batches)", ylim=(0, None))
    sets = {run.eval_set for run in runs if run.eval_steps} - {None}
    eval_axes.set(title="verification accuracy" + (f" on {sets.pop()}" if len(sets) == 1 else ""))
    eval_axes.set_ylim(*accuracy_limits(runs))
    lr_axes.set(title="learning rate", ylabel="lr", ylim=(0, None))
    lr_axes.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    for axes in (accuracy_axes, eval_axes):
        axes.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    for axes in (eval_axes, lr_axes):
        axes.set_xlabel("step")
    for axes, missing in (
        (eval_axes, "no verification: set eval.pairs"),
        (lr_axes, "no lr column in metrics.csv"),
    ):
        if not axes.get_legend_handles_labels()[0]:
            axes.text(0.5, 0.5, missing, ha="center", transform=axes.transAxes)
    for axes in (loss_axes, accuracy_axes, eval_axes, lr_axes):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    return figure


def _draw_verification(axes: Axes, run: RunCurves, colour: str, band_label: bool) -> None:
    """The mean over folds with markers, labelled with the last figure, and a band of ± one standard
    deviation over folds where the results recorded it (labelled once, for the first run)."""
    last_std = run.eval_std[-1]
    spread = "" if last_std is None else f" ± {100 * last_std:.1f}"
    label = f"{run.label}: {100 * run.eval_accuracy[-1]:.1f}{spread} % at step {run.eval_steps[-1]}"
    axes.plot(run.eval_steps, run.eval_accuracy, marker="o", markersize=3, color=colour, label=label)
    banded = [
        (step, mean - std, mean + std)
        for step, mean, std in zip(run.eval_steps, run.eval_accuracy, run.eval_std)
        if std is not None
    ]
    if banded:
        steps, low, high = zip(*banded)
        axes.fill_between(
            steps, low, high, color=colour, alpha=0.2, label="± 1 std over folds" if band_label else None
        )


def accuracy_limits(runs: list[RunCurves]) -> tuple[float, float]:
    """The verification axis: every mean and fold band inside, at least MIN_ACCURACY_SPAN tall, within
    0-100 % plus a margin so a point at 100 % is not cut by the frame."""
    values = [0.5, 1.0]  # an empty panel: chance to perfect on balanced pairs
    points = [(mean, std or 0.0) for run in runs for mean, std in zip(run.eval_accuracy, run.eval_std)]
    if points:
        values = [mean - std for mean, std in points] + [mean + std for mean, std in points]
    low, high = max(min(values), 0.0), min(max(values), 1.0)
    if high - low < MIN_ACCURACY_SPAN:
        middle = min(max((low + high) / 2, MIN_ACCURACY_SPAN / 2), 1 - MIN_ACCURACY_SPAN / 2)
        low, high = middle - MIN_ACCURACY_SPAN / 2, middle + MIN_ACCURACY_SPAN / 2
    margin = 0.05 * (high - low)
    return low - margin, high + margin


def figure_title(runs: list[RunCurves]) -> str:
    """`orl_small: step 150` for one run; the runs and their last steps for several."""
    return ", ".join(f"{run.label}: step {run.steps[-1] if run.steps else 0}" for run in runs)


def plot_curves(runs: list[RunCurves], out: Path) -> Path:
    figure = curves_figure(runs)
    write_atomic(Path(out), lambda tmp: figure.savefig(tmp, format="png"))
    return Path(out)
