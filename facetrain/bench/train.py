"""`facetrain bench train`: end-to-end training steps, sharded head against a DDP-replicated full FC.

Both runs time the trainer's own `train_step` (backbone forward/backward, DDP, head, SGD + momentum) on
the same in-memory images, so the figures compare the classifiers inside a real step, without data
loading. The replicated FC is what plain DDP training does: every rank holds all C classes, computes
normalize + linear + margin + cross_entropy on its local batch, and all-reduces the C x D gradient.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import click
import torch

from facetrain.bench.common import PeakRss, machine_info, mean_of_max_over_ranks, timed_repeats
from facetrain.bench.workers import WorkerPool
from facetrain.config import ModelConfig, OptimConfig, ParallelConfig
from facetrain.files import write_atomic
from facetrain.heads import DenseMarginHead, ShardedMarginHead
from facetrain.models import build_backbone
from facetrain.parallel import comm
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.dims import init_parallel
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.train.optim import build_optimizer
from facetrain.train.step import StepSettings, train_step

HEADS = ("sharded", "replicated")


def _train_worker(rank: int, world_size: int, kind: str, settings: dict) -> dict:
    classes, dim, size = settings["classes"], settings["dim"], settings["image_size"]
    batch = settings["batch"]
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(batch, 3, size, size, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    dims = init_parallel()
    with PeakRss() as peak:
        torch.manual_seed(0)
        backbone = build_backbone(
            ModelConfig(backbone=settings["backbone"], embedding_size=dim), (size, size)
        )
        if kind == "sharded":
            local, model, _ = parallelize_backbone(backbone, dims, ParallelConfig(), images.shape)
            head = ShardedMarginHead(classes, dim, margin="arcface", group=dims.dp_group)
        else:  # every rank holds the whole FC; each loss is its own batch's mean, so DDP averages
            local = backbone
            model = wrap_data_parallel(backbone, dims.device, dims.dp_group, gradient_reduction="mean")
            head = wrap_data_parallel(
                DenseMarginHead(classes, dim, margin="arcface"), dims.device, dims.dp_group, "mean"
            )
        optimizer = build_optimizer(OptimConfig(lr=0.01, grad_clip=None), local, head)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        step_settings = StepSettings(device=dims.device)
        batches = itertools.repeat((images, labels))
        times = timed_repeats(
            lambda: train_step(batches, model, head, optimizer, scaler, step_settings),
            settings["steps"],
            settings["warmup"],
            before_each=comm.barrier,
        )
    return {"times": times, "peak_bytes": peak.growth_bytes, "memory_method": peak.method}


def run_train_benchmark(settings: dict) -> dict:
    world_size = settings["world_size"]
    threads = max(1, (torch.get_num_threads() or 1) // world_size)
    rows = []
    for kind in HEADS:
        with WorkerPool(world_size, threads) as pool:
            per_rank = pool.run(_train_worker, kind, settings)
        step_s = mean_of_max_over_ranks([r["times"] for r in per_rank])
        peaks = [r["peak_bytes"] for r in per_rank]
        rows.append(
            {
                "head": kind,
                "step_s": step_s,
                "images_per_s": settings["batch"] * world_size / step_s,
                "peak_bytes_per_rank": peaks,
                "memory_method": per_rank[0]["memory_method"],
            }
        )
    sharded, replicated = rows
    speedup = sharded["images_per_s"] / replicated["images_per_s"]
    memory_ratio = max(sharded["peak_bytes_per_rank"]) / max(replicated["peak_bytes_per_rank"])
    return {
        "settings": settings,
        "machine": machine_info(),
        "rows": rows,
        "targets": {
            "speedup": {"value": speedup, "target": ">= 1.5", "pass": speedup >= 1.5},
            "peak_memory_ratio": {"value": memory_ratio, "target": "<= 0.6", "pass": memory_ratio <= 0.6},
        },
    }


def format_table(result: dict) -> str:
    lines = [
        "| head | step (s) | images/s | peak memory per rank (MiB) |",
        "| --- | ---: | ---: | --- |",
    ]
    for row in result["rows"]:
        peaks = ", ".join(f"{p / 2**20:.0f}" for p in row["peak_bytes_per_rank"])
        lines.append(f"| {row['head']} | {row['step_s']:.3f} | {row['images_per_s']:.1f} | {peaks} |")
    for name, target in result["targets"].items():
        verdict = "PASS" if target["pass"] else "MISS"
        lines.append(f"\n{name}: {target['value']:.2f} (target {target['target']}) {verdict}")
    return "\n".join(lines)


@click.command("train")
@click.option("--classes", type=click.IntRange(min=2), default=100_000, show_default=True)
@click.option("--world-size", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--backbone", default="small", show_default=True, help="A registered backbone.")
@click.option("--image-size", type=click.IntRange(min=16), default=112, show_default=True)
@click.option("--dim", type=click.IntRange(min=1), default=512, show_default=True, help="Embedding size.")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True, help="Images per rank.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="runs/bench/train", show_default=True)
def train_command(classes, world_size, backbone, image_size, dim, batch, steps, warmup, out) -> None:
    """End-to-end training images/s and per-rank peak memory: sharded head vs DDP-replicated full FC.

    Targets (C = 100k, 2 ranks): the sharded head reaches >= 1.5x the images/s of the replicated FC at
    <= 0.6x its per-rank peak memory (peak RSS growth of each rank's process over the run).

    \b
    Examples:
      facetrain bench train
      facetrain bench train --classes 1000000 --backbone r18 --batch 32
    """
    settings = {
        "classes": classes,
        "world_size": world_size,
        "backbone": backbone,
        "image_size": image_size,
        "dim": dim,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
    }
    result = run_train_benchmark(settings)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "train.json", lambda p: p.write_text(json.dumps(result, indent=2)))
    click.echo(format_table(result))
    click.echo(f"\nwrote {out_dir / 'train.json'}")
