"""`facetrain bench eval`: how long evaluation takes, i.e. embedding throughput and metric time.

Embedding is timed through `compute_embeddings` on already-decoded images, so the figure is the
model's forward pass plus preprocessing, the part evaluation cannot avoid; decoding is measured by
`facetrain bench data`. The flip test runs the model twice per image, so it halves the figure and is
off here. Metric time is the whole `verification_metrics` (10-fold thresholds, ROC, AUC, EER,
TAR@FAR) on random scores of LFW's size.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from facetrain.bench.common import device_option, gpu_info, machine_info, resolve_device, timed_repeats
from facetrain.config.schema import ModelConfig
from facetrain.eval.embedding import compute_embeddings
from facetrain.eval.metrics import verification_metrics
from facetrain.files import refuse_to_overwrite, write_atomic
from facetrain.models import build_backbone

METRIC_TARGET_S = 1.0
FOLDS = 10


def embedding_throughput(
    backbone: str,
    image_size: int,
    batch_size: int,
    batches: int,
    threads: int,
    progress: bool,
    device: str = "cpu",
) -> dict[str, Any]:
    """Images/s of one timed pass over `batches` batches, after one untimed warm-up batch."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    module = build_backbone(ModelConfig(backbone=backbone), image_size=(image_size, image_size))
    module = module.to(device).eval()
    rng = np.random.default_rng(0)
    images = list(rng.integers(0, 256, (batch_size * batches, image_size, image_size, 3), dtype=np.uint8))
    size = (image_size, image_size)
    compute_embeddings(module, images[:batch_size], size, batch_size, flip=False, progress=False)
    (seconds,) = timed_repeats(
        lambda: compute_embeddings(module, images, size, batch_size, flip=False, progress=progress),
        repeats=1,
        device=device,
    )
    return {
        "backbone": backbone,
        "device": device,
        "image_size": image_size,
        "batch_size": batch_size,
        "batches": batches,
        "threads": threads,
        "parameters": sum(parameter.numel() for parameter in module.parameters()),
        "seconds": seconds,
        "images_per_s": len(images) / seconds,
        "ms_per_batch": 1000 * seconds / batches,
    }


def metric_time(num_pairs: int, repeats: int) -> dict[str, Any]:
    """Median seconds of `verification_metrics` on `num_pairs` random scores in 10 folds."""
    rng = np.random.default_rng(0)
    issame = rng.random(num_pairs) < 0.5
    scores = np.where(issame, rng.normal(0.5, 0.2, num_pairs), rng.normal(0.1, 0.2, num_pairs))
    folds = np.arange(num_pairs) * FOLDS // num_pairs
    times = timed_repeats(lambda: verification_metrics(scores, issame, folds), repeats, warmup=1)
    median = statistics.median(times)
    return {
        "pairs": num_pairs,
        "folds": FOLDS,
        "repeats": repeats,
        "median_s": median,
        "seconds": times,
        "target_s": METRIC_TARGET_S,
        "pass": median < METRIC_TARGET_S,
    }


def format_table(result: dict[str, Any]) -> str:
    embedding, metrics = result["embedding"], result["metrics"]
    verdict = "PASS" if metrics["pass"] else "MISS"
    return "\n".join(
        [
            "| measure | setting | result | target |",
            "| --- | --- | ---: | --- |",
            f"| embedding throughput | {embedding['backbone']} {embedding['image_size']}x{embedding['image_size']}, "
            f"batch {embedding['batch_size']}, {embedding['device']}, {embedding['threads']} threads, no flip | "
            f"{embedding['images_per_s']:,.1f} img/s ({embedding['ms_per_batch']:,.0f} ms/batch) | |",
            f"| verification metrics | {metrics['pairs']:,} pairs, {metrics['folds']} folds | "
            f"{1000 * metrics['median_s']:,.1f} ms | < {metrics['target_s']:g} s: {verdict} |",
        ]
    )


@click.command("eval")
@click.option(
    "--backbone", default="r50", show_default=True, help="Backbone to embed with (model registry name)."
)
@click.option(
    "--image-size", type=click.IntRange(min=8), default=112, show_default=True, help="Square input side."
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=128, show_default=True, help="Images per batch."
)
@click.option("--batches", type=click.IntRange(min=1), default=2, show_default=True, help="Timed batches.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=torch.get_num_threads(),
    show_default=True,
    help="Torch threads.",
)
@click.option(
    "--pairs",
    type=click.IntRange(min=20),
    default=6000,
    show_default=True,
    help="Pairs for the metric timing.",
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed metric runs."
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runs/bench/eval.json"),
    show_default=True,
)
@click.option("--overwrite", is_flag=True, help="Replace the JSON of an earlier run.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@device_option("Where the backbone embeds; the metrics always run on the CPU.")
def eval_command(
    backbone: str,
    image_size: int,
    batch_size: int,
    batches: int,
    threads: int,
    pairs: int,
    repeats: int,
    out: Path,
    overwrite: bool,
    quiet: bool,
    device: str,
) -> None:
    """Embedding throughput (images/s) on CPU or GPU and the time to compute verification metrics.

    Embeds --batches batches of random 8-bit images (after one untimed warm-up batch) with a freshly
    initialized --backbone, without the flip test (which doubles the model's work), and times the
    full verification metrics (10-fold accuracy, ROC, AUC, EER, TAR@FAR) on --pairs random scores,
    the median of --repeats runs against the target of under 1 s. Prints a markdown table for
    docs/benchmarks.md and writes the figures and machine details as JSON to --out.

    \b
    Examples:
      facetrain bench eval
      facetrain bench eval --backbone r18 --batches 4 --threads 2 --overwrite
      facetrain bench eval --backbone small --out runs/bench/eval_small.json
      facetrain bench eval --device cuda --batch-size 256 --batches 8
    """
    device = resolve_device(device)
    if not overwrite:
        refuse_to_overwrite([out])
    result = {
        "benchmark": "eval",
        "embedding": embedding_throughput(
            backbone, image_size, batch_size, batches, threads, not quiet, device
        ),
        "metrics": metric_time(pairs, repeats),
        "machine": {**machine_info(), "gpu": gpu_info(device)},
    }
    write_atomic(out, lambda path: path.write_text(json.dumps(result, indent=2) + "\n"))
    click.echo(format_table(result))
    click.echo(f"\nwrote {out}")
