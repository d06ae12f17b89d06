"""The outputs of `facetrain bench pipeline`: JSON, a markdown table, a bar chart and a split-size sweep."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from facetrain.bench.report import ReportFiles, markdown_table


def _timing_cells(run: dict) -> list[str]:
    return [f"{run['mean_s']:.3f} ± {run['std_s']:.3f}", f"{run['min_s']:.3f}", f"{run['images_per_s']:.1f}"]


def table(report: dict) -> str:
    settings = report["settings"]
    timings = ["s/step (mean ± std)", "best s/step", "images/s"]
    counts = {"model_parallel": 1, "pipelined": settings["microbatches"]}
    runs = [
        [name.replace("_", " "), str(counts.get(name, "-")), *_timing_cells(run)]
        for name, run in report["runs"].items()
    ]
    sweep = [
        [str(row["split_size"]), str(row["microbatches"]), *_timing_cells(row)] for row in report["sweep"]
    ]
    lines = [
        *markdown_table(["run", "micro-batches", *timings], runs),
        "",
        *markdown_table(["split size", "micro-batches", *timings], sweep),
    ]
    target, machine = report["target"], report["machine"]
    lines += [
        "",
        f"- {target['status']}: {target['name']} {target['threshold']}: {target['measured']:.2f}x on means "
        f"({report['pipelined_over_model_parallel_best_runs']:.2f}x on the best runs)",
        f"- pipelined against one device with {settings['stages']} threads: "
        f"{report['pipelined_over_single_device_same_cores']:.2f}x the throughput",
        f"- {settings['backbone']} at {settings['image_size']}x{settings['image_size']}, batch "
        f"{settings['batch_size']}, split at {', '.join(settings['split_points'])}, {settings['schedule']}",
        f"- {machine['cpu_model']}, {machine['cores']} cores, torch {machine['torch']}, {machine['date']}, "
        f"load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in machine['load_average_at_start'])} at "
        f"the start, {' '.join(f'{x:.2f}' for x in machine['load_average_1_5_15'])} at the end",
    ]
    return "\n".join(lines) + "\n"


def plot_bars(report: dict, path: Path) -> None:
    names = list(report["runs"])
    runs = [report["runs"][name] for name in names]
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    axis.bar(
        [name.replace("_", "\n") for name in names],
        [run["mean_s"] for run in runs],
        yerr=[run["std_s"] for run in runs],
        capsize=6,
        color=["#9aa", "#799", "#c96", "#49c"],
    )
    settings = report["settings"]
    axis.set_ylabel("seconds per training step")
    axis.set_title(
        f"{settings['backbone']}, batch {settings['batch_size']} at {settings['image_size']}px, "
        f"{settings['stages']} stages, {settings['microbatches']} micro-batches (mean ± std)"
    )
    axis.grid(True, axis="y", alpha=0.3)
    figure.savefig(path, dpi=100, format="png")


def plot_sweep(report: dict, path: Path) -> None:
    rows = report["sweep"]
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    sizes = [row["split_size"] for row in rows]
    axis.errorbar(
        sizes,
        [row["mean_s"] for row in rows],
        yerr=[row["std_s"] for row in rows],
        marker="o",
        capsize=4,
        label=f"{report['settings']['stages']} stages",
    )
    for name, style in (
        ("single_device_1_thread", ":"),
        (f"single_device_{report['settings']['stages']}_threads", "--"),
    ):
        axis.axhline(
            report["runs"][name]["mean_s"], linestyle=style, color="gray", label=name.replace("_", " ")
        )
    axis.set_xscale("log", base=2)
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.set_xlabel("split size (images per micro-batch; the largest is plain model parallel)")
    axis.set_ylabel("seconds per training step")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.savefig(path, dpi=100, format="png")


FILES = ReportFiles(
    json="bench_pipeline.json",
    table="bench_pipeline.md",
    plots={
        "bars": ("bench_pipeline_bars.png", plot_bars),
        "sweep": ("bench_pipeline_split_sizes.png", plot_sweep),
    },
)
