"""Training curves: loss, batch accuracy and verification accuracy against the step, for one run or several.

Drawn from what every run writes anyway: `metrics.csv` (a row per log interval, means over it) and
`eval/step_N.json` (each verification, `eval.every`). The trainer draws its own run into
`RUN/curves.png` when it finishes; `facetrain plot` draws several runs on one figure to compare them.
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
    """`curves_figure` written atomically to `out` (PNG)."""
    figure = curves_figure(runs)
    out = Path(out)
    write_atomic(out, lambda tmp: figure.savefig(tmp, format="png"))
    return out


def write_run_curves(run_dir: Path) -> Path:
    """RUN/curves.png of the run itself, replaced each time the run finishes (a resumed run too)."""
    return plot_curves([read_run_curves(run_dir)], Path(run_dir) / CURVES_FILE)
