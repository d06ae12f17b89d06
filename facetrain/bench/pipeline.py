"""`facetrain bench pipeline`: single device against model parallel against pipelined, on a backbone.

The experiment of PyTorch's model-parallel tutorial, on facetrain's own backbones and pipeline
runtime: cutting a network into two stages on two devices alone makes a step slower (one stage idles
while the other works, and activations travel between them), and feeding the stages micro-batches
lets both work at once. On CPU each stage is a process with one thread; a single device is shown
with one thread and with as many threads as there are stages, so that both get the same cores.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from facetrain.bench.common import (
    WorkerPool,
    machine_info,
    mean_of_max_over_ranks,
    parse_int_list,
    timed_repeats,
)
from facetrain.config.schema import ModelConfig, ParallelConfig
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite, write_atomic
from facetrain.models import BACKBONES, build_backbone
from facetrain.parallel import comm
from facetrain.parallel.env import DistEnv
from facetrain.parallel.pipeline import PipelineRuntime
from facetrain.parallel.pipeline_split import (
    balanced_boundaries,
    boundaries_from_split_points,
    measure_unit_costs,
    pipeline_units,
)

OUTPUT_NAMES = {
    "json": "bench_pipeline.json",
    "bars": "bench_pipeline_bars.png",
    "sweep": "bench_pipeline_split_sizes.png",
    "table": "bench_pipeline.md",
}
SPEEDUP_TARGET = 1.5


@dataclass(frozen=True)
class PipelineBenchSettings:
    backbone: str = "r50"
    image_size: int = 56
    batch_size: int = 64
    embedding_size: int = 512
    stages: int = 2
    microbatches: int = 4
    split_sizes: tuple[int, ...] = (32, 16, 8)
    schedule: str = "gpipe"
    split_at: tuple[str, ...] = ()
    repeats: int = 3
    steps: int = 2
    warmup: int = 1
    seed: int = 0

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 3, self.image_size, self.image_size)

    def microbatch_counts(self) -> list[int]:
        """Model parallel (1), the pipelined bar, and every swept split size, as micro-batch counts."""
        counts = {1, self.microbatches} | {self.batch_size // size for size in self.split_sizes}
        return sorted(counts)

    def validate(self) -> None:
        BACKBONES.get(self.backbone)
        for size in (*self.split_sizes, self.batch_size // max(self.microbatches, 1)):
            if size < 1 or self.batch_size % size:
                raise FacetrainError(
                    f"micro-batch size {size} does not divide --batch-size {self.batch_size}; "
                    "choose --split-sizes and --microbatches that divide it"
                )
        if self.microbatches < 2 or self.batch_size % self.microbatches:
            raise FacetrainError(f"--microbatches {self.microbatches} must be >= 2 and divide --batch-size")
        if self.schedule == "1f1b" and min(c for c in self.microbatch_counts() if c > 1) < self.stages:
            raise FacetrainError(
                f"--schedule 1f1b needs at least --stages {self.stages} micro-batches per step"
            )


DEFAULTS = PipelineBenchSettings()


def training_data(settings: PipelineBenchSettings) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(settings.seed)
    images = torch.randn(settings.input_shape, generator=generator)
    return images, torch.randn(settings.batch_size, settings.embedding_size, generator=generator)


def make_backbone(settings: PipelineBenchSettings) -> torch.nn.Module:
    torch.manual_seed(settings.seed)
    cfg = ModelConfig(backbone=settings.backbone, embedding_size=settings.embedding_size)
    return build_backbone(cfg, (settings.image_size, settings.image_size))


def plan_split_points(settings: PipelineBenchSettings) -> list[str]:
    """One cut for every run (balanced on the pipelined micro-batch, one thread), so runs compare."""
    torch.set_num_threads(1)
    units = pipeline_units(make_backbone(settings))
    if settings.split_at:
        starts = boundaries_from_split_points(units, list(settings.split_at), settings.stages)
        return [units[start].name for start in starts]
    shape = (settings.batch_size // settings.microbatches, *settings.input_shape[1:])
    costs = measure_unit_costs(units, torch.randn(shape))
    return [units[start].name for start in balanced_boundaries(costs, settings.stages)]


def single_device_step_s(settings: PipelineBenchSettings, threads: int) -> float:
    """Mean seconds of one training step (forward, backward, SGD) of the whole backbone here."""
    torch.set_num_threads(threads)
    backbone = make_backbone(settings)
    optimizer = torch.optim.SGD(backbone.parameters(), lr=0.01, momentum=0.9)
    images, targets = training_data(settings)

    def step() -> None:
        optimizer.zero_grad()
        F.mse_loss(backbone(images), targets).backward()
        optimizer.step()

    return statistics.mean(timed_repeats(step, settings.steps, settings.warmup))


def pipeline_step_times(
    settings: PipelineBenchSettings, env: DistEnv, microbatches: int, split_points: list[str]
) -> list[float]:
    cfg = ParallelConfig(
        pipeline_stages=settings.stages,
        microbatches=microbatches,
        schedule=settings.schedule if microbatches >= settings.stages else "gpipe",
        split_points=split_points,
    )
    runtime = PipelineRuntime(make_backbone(settings), cfg, env, settings.input_shape)
    optimizer = torch.optim.SGD(runtime.parameters(), lr=0.01, momentum=0.9)
    images, targets = training_data(settings)

    def step() -> None:
        optimizer.zero_grad()
        runtime.step(images, targets, F.mse_loss)
        optimizer.step()

    return timed_repeats(step, settings.steps, settings.warmup, before_each=comm.barrier)


def pipeline_worker(
    rank: int, world_size: int, settings: PipelineBenchSettings, split_points: list[str]
) -> dict[int, list[float]]:
    """On every stage process: seconds of each timed step for every micro-batch count."""
    env = DistEnv(rank, world_size, rank, torch.device("cpu"))
    return {
        count: pipeline_step_times(settings, env, count, split_points)
        for count in settings.microbatch_counts()
    }


def summarize(step_s: list[float], batch_size: int) -> dict:
    mean = statistics.mean(step_s)
    return {
        "step_s": step_s,
        "mean_s": mean,
        "std_s": statistics.stdev(step_s) if len(step_s) > 1 else 0.0,
        "min_s": min(step_s),
        "images_per_s": batch_size / mean,
    }


def run_pipeline_benchmark(settings: PipelineBenchSettings, progress: bool = True) -> dict:
    settings.validate()
    load_before = list(os.getloadavg())
    split_points = plan_split_points(settings)
    single = {1: [], settings.stages: []}
    pipelined: dict[int, list[float]] = {count: [] for count in settings.microbatch_counts()}
    threads_before = torch.get_num_threads()
    with WorkerPool(settings.stages, threads_per_rank=1) as pool:
        for _ in tqdm(range(settings.repeats), desc="bench pipeline", unit="repeat", disable=not progress):
            for threads in single:
                single[threads].append(single_device_step_s(settings, threads))
            per_rank = pool.run(pipeline_worker, settings, split_points)
            for count in pipelined:
                pipelined[count].append(mean_of_max_over_ranks([rank[count] for rank in per_rank]))
    torch.set_num_threads(threads_before)
    batch = settings.batch_size
    runs = {
        "single_device_1_thread": summarize(single[1], batch),
        f"single_device_{settings.stages}_threads": summarize(single[settings.stages], batch),
        "model_parallel": summarize(pipelined[1], batch),
        "pipelined": summarize(pipelined[settings.microbatches], batch),
    }
    sweep = [
        {"split_size": batch // count, "microbatches": count, **summarize(pipelined[count], batch)}
        for count in sorted(pipelined, reverse=True)
    ]
    speedup = runs["model_parallel"]["mean_s"] / runs["pipelined"]["mean_s"]
    against_single = runs[f"single_device_{settings.stages}_threads"]["mean_s"] / runs["pipelined"]["mean_s"]
    return {
        "benchmark": "pipeline",
        "machine": {**machine_info(), "load_average_at_start": load_before},
        "settings": {**asdict(settings), "split_points": split_points, "device": "cpu", "dtype": "float32"},
        "method": "training step = forward + backward + SGD step with an MSE loss to random targets; each "
        "run times --steps steps after --warmup untimed ones (stage processes meet at a barrier before "
        "each step; the slowest stage counts); mean and std are over --repeats runs, interleaved",
        "runs": runs,
        "sweep": sweep,
        "pipelined_over_model_parallel": speedup,
        "pipelined_over_model_parallel_best_runs": runs["model_parallel"]["min_s"]
        / runs["pipelined"]["min_s"],
        "pipelined_over_single_device_same_cores": against_single,
        "target": {
            "name": f"pipelined throughput / model parallel throughput, {settings.stages} stages",
            "threshold": f">= {SPEEDUP_TARGET}",
            "measured": speedup,
            "status": "PASS" if speedup >= SPEEDUP_TARGET else "MISS",
        },
    }


def markdown_table(report: dict) -> str:
    settings = report["settings"]
    lines = [
        "| run | micro-batches | s/step (mean ± std) | best s/step | images/s |",
        "|---|---|---|---|---|",
    ]
    counts = {"model_parallel": 1, "pipelined": settings["microbatches"]}
    for name, run in report["runs"].items():
        lines.append(
            f"| {name.replace('_', ' ')} | {counts.get(name, '-')} | {run['mean_s']:.3f} ± {run['std_s']:.3f} "
            f"| {run['min_s']:.3f} | {run['images_per_s']:.1f} |"
        )
    lines += [
        "",
        "| split size | micro-batches | s/step (mean ± std) | best s/step | images/s |",
        "|---|---|---|---|---|",
    ]
    for row in report["sweep"]:
        lines.append(
            f"| {row['split_size']} | {row['microbatches']} | {row['mean_s']:.3f} ± {row['std_s']:.3f} "
            f"| {row['min_s']:.3f} | {row['images_per_s']:.1f} |"
        )
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


def write_outputs(report: dict, out: Path) -> str:
    table = markdown_table(report)
    write_atomic(out / OUTPUT_NAMES["json"], lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n"))
    write_atomic(out / OUTPUT_NAMES["bars"], lambda tmp: plot_bars(report, tmp))
    write_atomic(out / OUTPUT_NAMES["sweep"], lambda tmp: plot_sweep(report, tmp))
    write_atomic(out / OUTPUT_NAMES["table"], lambda tmp: tmp.write_text(table))
    return table


@click.command("pipeline")
@click.option(
    "--backbone", default=DEFAULTS.backbone, show_default=True, help="Registered backbone to split."
)
@click.option(
    "--image-size",
    default=DEFAULTS.image_size,
    show_default=True,
    type=click.IntRange(min=8),
    help="Square input side.",
)
@click.option(
    "--batch-size",
    default=DEFAULTS.batch_size,
    show_default=True,
    type=click.IntRange(min=1),
    help="Images per step.",
)
@click.option(
    "--embedding-size",
    default=DEFAULTS.embedding_size,
    show_default=True,
    type=click.IntRange(min=1),
    help="Embedding width D of the backbone.",
)
@click.option(
    "--stages",
    default=DEFAULTS.stages,
    show_default=True,
    type=click.IntRange(min=2),
    help="Stage processes.",
)
@click.option(
    "--microbatches",
    default=DEFAULTS.microbatches,
    show_default=True,
    type=click.IntRange(min=2),
    help="For the pipelined bar.",
)
@click.option(
    "--split-sizes",
    default=",".join(map(str, DEFAULTS.split_sizes)),
    show_default=True,
    help="Micro-batch sizes to sweep.",
)
@click.option(
    "--schedule",
    type=click.Choice(["gpipe", "1f1b"]),
    default=DEFAULTS.schedule,
    show_default=True,
    help="Pipeline schedule of the pipelined runs.",
)
@click.option(
    "--split-at",
    default="",
    help="Modules where stages 2..S begin, comma-separated (e.g. layer3.5); default: balance by cost.",
)
@click.option(
    "--repeats",
    default=DEFAULTS.repeats,
    show_default=True,
    type=click.IntRange(min=1),
    help="Runs per setup.",
)
@click.option(
    "--steps",
    default=DEFAULTS.steps,
    show_default=True,
    type=click.IntRange(min=1),
    help="Timed steps per run.",
)
@click.option(
    "--warmup",
    default=DEFAULTS.warmup,
    show_default=True,
    type=click.IntRange(min=0),
    help="Untimed steps first.",
)
@click.option(
    "--out",
    default="runs/bench/pipeline",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for bench_pipeline.json, .md and the two plots.",
)
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
def pipeline_command(
    backbone: str,
    image_size: int,
    batch_size: int,
    embedding_size: int,
    stages: int,
    microbatches: int,
    split_sizes: str,
    schedule: str,
    split_at: str,
    repeats: int,
    steps: int,
    warmup: int,
    out: Path,
    overwrite: bool,
) -> None:
    """Time single device, model parallel and pipelined training steps of a backbone on CPU.

    Each stage is a process with one thread; the single device runs once with one thread and once
    with as many threads as stages. Runs repeat (mean and std), and the micro-batch (split) size is
    swept. Writes JSON, a markdown table, a bar chart and a time-versus-split-size plot to --out.

    \b
    Examples:
      facetrain bench pipeline
      facetrain bench pipeline --backbone r18 --image-size 32 --batch-size 16 --split-sizes 8,4,2
      facetrain bench pipeline --microbatches 8 --split-sizes 32,16,8,4 --repeats 5 --overwrite
      facetrain bench pipeline --split-at layer3.5 --out runs/bench/pipeline-fixed-cut
    """
    settings = PipelineBenchSettings(
        backbone=backbone,
        image_size=image_size,
        batch_size=batch_size,
        embedding_size=embedding_size,
        stages=stages,
        microbatches=microbatches,
        split_sizes=tuple(parse_int_list(split_sizes, "--split-sizes")),
        schedule=schedule,
        split_at=tuple(name.strip() for name in split_at.split(",") if name.strip()),
        repeats=repeats,
        steps=steps,
        warmup=warmup,
    )
    settings.validate()
    if not overwrite:
        refuse_to_overwrite(out / name for name in OUTPUT_NAMES.values())
    began = time.perf_counter()
    report = run_pipeline_benchmark(settings)
    click.echo(write_outputs(report, out))
    click.echo(f"wrote {out} in {time.perf_counter() - began:.0f} s")
