"""Training curves: a run's figures read back as logged (a resumed run's repeated steps once), drawn for
one run or several, and `facetrain plot`'s refusals."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.train.curves import MIN_ACCURACY_SPAN, curves_figure, plot_curves, read_run_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fake_run(
    root: Path,
    name: str,
    rows: list[tuple[int, float, float]],
    evaluations: dict[int, float],
    stds: dict[int, float] | None = None,
) -> Path:
    """A run directory as the trainer leaves it; the lr falls linearly from 0.1, by 1e-4 a step, and `stds`
    gives verifications their spread over folds (accuracy_std)."""
    run = root / name
    (run / "eval").mkdir(parents=True)
    with (run / "metrics.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "epoch", "loss", "accuracy", "lr", "images_per_s", "elapsed_s"])
        for step, loss, accuracy in rows:
            writer.writerow([step, 0, loss, accuracy, 0.1 * (1 - step / 1000), 100.0, step / 10])
    for step, accuracy in evaluations.items():
        result = {"step": step, "accuracy": accuracy, "best_by": "lfw"}
        if stds and step in stds:
            result["accuracy_std"] = stds[step]
        (run / "eval" / f"step_{step:08d}.json").write_text(json.dumps(result))
    return run


def test_a_resumed_run_keeps_the_later_row_of_each_step(tmp_path):
    # steps 20 and 30 were logged, the run died after the checkpoint at 20 and resumed from it
    rows = [(10, 4.0, 0.1), (20, 3.0, 0.3), (30, 2.9, 0.35), (30, 2.5, 0.4), (40, 2.0, 0.6)]
    run = fake_run(tmp_path, "orl", rows, {40: 0.9, 20: 0.8})
    curves = read_run_curves(run)
    assert curves.label == "orl"
    assert curves.steps == [10, 20, 30, 40]
    assert curves.loss == [4.0, 3.0, 2.5, 2.0] and curves.accuracy == [0.1, 0.3, 0.4, 0.6]
    assert curves.eval_steps == [20, 40] and curves.eval_accuracy == [0.8, 0.9]
    assert read_run_curves(run, "baseline").label == "baseline"


def test_plot_writes_a_png_for_runs_with_and_without_verification(tmp_path):
    with_eval = read_run_curves(fake_run(tmp_path, "a", [(10, 3.0, 0.2), (20, 2.0, 0.5)], {20: 0.7}))
    without = read_run_curves(fake_run(tmp_path, "b", [(10, 3.5, 0.1), (20, 2.5, 0.4)], {}))
    for runs, name in (([with_eval, without], "both.png"), ([without], "plain.png")):
        out = plot_curves(runs, tmp_path / name)
        assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 10_000
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically, nothing left beside it


def test_a_single_evaluation_sits_on_the_training_step_axis(tmp_path):
    run = read_run_curves(
        fake_run(tmp_path, "a", [(10, 3.0, 0.2), (50, 2.0, 0.5), (100, 1.5, 0.7)], {50: 0.7})
    )
    loss_axes, _, eval_axes, _ = curves_figure([run]).axes
    low, high = eval_axes.get_xlim()
    assert (low, high) == loss_axes.get_xlim() and low <= 10 and high >= 100


def test_the_verification_axis_holds_the_folds_spread_and_draws_it_as_a_band(tmp_path):
    """The issue's run: means 0.600-0.608 whose folds spread ± 23.6 %; autoscaling showed 0.600-0.608."""
    rows = [(10, 3.0, 0.2), (20, 2.0, 0.5), (30, 1.5, 0.7)]
    run = read_run_curves(
        fake_run(tmp_path, "wide", rows, {10: 0.600, 20: 0.608, 30: 0.604}, {10: 0.2, 20: 0.236, 30: 0.2})
    )
    assert run.eval_std == [0.2, 0.236, 0.2] and run.eval_set == "lfw"
    eval_axes = curves_figure([run]).axes[2]
    low, high = eval_axes.get_ylim()
    assert low <= 0.600 - 0.2 and high >= 0.608 + 0.236
    (band,) = eval_axes.collections
    assert band.get_label() == "± 1 std over folds"
    heights = band.get_paths()[0].vertices[:, 1]
    assert heights.min() == pytest.approx(0.608 - 0.236) and heights.max() == pytest.approx(0.608 + 0.236)
    assert "60.4 ± 20.0 % at step 30" in eval_axes.get_lines()[0].get_label()
    assert eval_axes.get_title() == "verification accuracy on lfw"


def test_a_steady_verification_is_not_zoomed_onto_its_noise(tmp_path):
    run = read_run_curves(
        fake_run(tmp_path, "flat", [(10, 3.0, 0.2), (20, 2.0, 0.5)], {10: 0.991, 20: 0.993})
    )
    low, high = curves_figure([run]).axes[2].get_ylim()
    assert high - low >= MIN_ACCURACY_SPAN and low <= 0.991 and 0.993 <= high <= 1.01


def test_every_panel_has_a_title_and_legend_and_the_lr_is_drawn(tmp_path):
    first = read_run_curves(fake_run(tmp_path, "a", [(10, 3.0, 0.2), (20, 2.0, 0.5)], {20: 0.7}, {20: 0.05}))
    second = read_run_curves(fake_run(tmp_path, "b", [(10, 3.5, 0.1), (30, 2.5, 0.4)], {}), "no EMA")
    figure = curves_figure([first, second])
    assert figure.get_suptitle() == "a: step 20, no EMA: step 30"
    for axes in figure.axes:
        assert axes.get_title() and axes.get_legend() is not None
    lr_axes = figure.axes[3]
    assert lr_axes.get_title() == "learning rate"
    assert [line.get_label() for line in lr_axes.get_lines()] == ["a", "no EMA"]
    assert list(lr_axes.get_lines()[1].get_ydata()) == pytest.approx([0.099, 0.097]) == second.lr


def test_panels_without_figures_say_what_is_missing(tmp_path):
    run = fake_run(tmp_path, "old", [(10, 3.0, 0.2)], {})
    (run / "metrics.csv").write_text("step,epoch,loss,accuracy\n10,0,3.0,0.2\n20,0,2.0,0.4\n")
    curves = read_run_curves(run)
    assert curves.lr is None and curves.eval_std == []
    eval_axes, lr_axes = curves_figure([curves]).axes[2:]
    assert [text.get_text() for text in eval_axes.texts] == ["no verification: set eval.pairs"]
    assert [text.get_text() for text in lr_axes.texts] == ["no lr column in metrics.csv"]
    assert lr_axes.get_title() == "learning rate" and not lr_axes.get_lines()


def test_bad_runs_are_one_line_errors(tmp_path):
    with pytest.raises(FacetrainError, match="has no metrics.csv; give a run directory"):
        read_run_curves(tmp_path)
    run = fake_run(tmp_path, "broken", [(10, 3.0, 0.2)], {})
    (run / "metrics.csv").write_text("step,epoch,loss,accuracy\n10,0,three,0.2\n")
    with pytest.raises(FacetrainError, match=r"metrics.csv line 2: expected step, loss and accuracy"):
        read_run_curves(run)
    (run / "metrics.csv").write_text("step,epoch,loss,accuracy\n10,0,3.0,0.2\n")
    (run / "eval" / "step_00000010.json").write_text("{not json")
    with pytest.raises(FacetrainError, match=r"step_00000010.json is not a verification result"):
        read_run_curves(run)


def test_plot_command_compares_runs_and_never_overwrites_unasked(tmp_path):
    first = fake_run(tmp_path, "first", [(10, 3.0, 0.2), (20, 2.0, 0.5)], {20: 0.7})
    second = fake_run(tmp_path, "second", [(10, 3.2, 0.2), (20, 2.2, 0.4)], {20: 0.6})
    out = tmp_path / "compare.png"
    runner = CliRunner()
    args = ["plot", str(first), str(second), "--label", "EMA", "--label", "no EMA", "-o", str(out)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "(2 runs)" in result.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    before = out.read_bytes()

    refused = runner.invoke(main, args)
    assert refused.exit_code == 2 and "already exists; pass --overwrite" in refused.output
    assert out.read_bytes() == before
    assert runner.invoke(main, [*args, "--overwrite"]).exit_code == 0

    mismatched = runner.invoke(main, ["plot", str(first), str(second), "--label", "one", "-o", str(out)])
    assert mismatched.exit_code == 2 and "1 --label for 2 runs" in mismatched.output
    missing = runner.invoke(main, ["plot", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.png")])
    assert missing.exit_code == 2 and "has no metrics.csv" in missing.output
    help_text = runner.invoke(main, ["plot", "--help"]).output
    assert "Examples:" in help_text and "facetrain plot runs/orl_small" in help_text


@pytest.mark.parametrize("loss", [float("inf"), float("nan"), -float("inf"), 1e308])
def test_a_diverged_or_damaged_metric_is_a_gap_in_its_line_drawn_without_warnings(tmp_path, loss):
    rows = [(10, 3.0, 0.2), (20, loss, loss), (30, loss, 0.4)]
    run = fake_run(tmp_path, "diverged", rows, {30: 0.6})
    with (run / "metrics.csv").open("a") as handle:  # and an lr no axis can hold
        handle.write(f"40,0,2.0,0.5,{loss},100.0,4.0\n")
    curves = read_run_curves(run)
    assert curves.loss[0] == 3.0 and all(value != value for value in curves.loss[1:3])  # nan: a gap
    assert curves.lr[-1] != curves.lr[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_curves([curves], tmp_path / "diverged.png")
    assert out.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("result", [{"accuracy": float("inf")}, {"accuracy": 0.9, "accuracy_std": float("nan")},
                                    {"accuracy": 7}, {"accuracy": -0.1}, {"accuracy": 0.9, "step": float("inf")}])  # fmt: skip
def test_a_verification_result_that_is_no_fraction_is_one_line(tmp_path, result):
    run = fake_run(tmp_path, "damaged", [(10, 3.0, 0.2)], {})
    (run / "eval" / "step_00000010.json").write_text(
        json.dumps({"step": 10, **result}).replace("1e+400", "1e400")
    )
    with pytest.raises(FacetrainError, match=r"step_00000010.json is not a verification result"):
        read_run_curves(run)
