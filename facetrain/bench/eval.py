"""`facetrain bench eval`: how long evaluation takes, i.e. embedding throughput and metric time.

Embedding is timed through `compute_embeddings` on already-decoded images, so the figure is the
model's forward pass plus preprocessing, the part evaluation cannot avoid; decoding is measured by
`facetrain bench data`. The flip test runs the model twice per image, so it halves the figure and is
off here. Metric time is the whole `verification_metrics` (10-fold thresholds, ROC, AUC, EER,
TAR@FAR) on random scores of LFW's size.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from facetrain.bench.common import gpu_info, machine_info, timed_repeats
from facetrain.bench.report import ReportFiles, markdown_table, write_report
from facetrain.devices import resolve_device
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.eval.metrics import verification_metrics
from facetrain.files import refuse_to_overwrite
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig

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
    warm_up = EmbedSettings(size, batch_size, flip=False, progress=False)
    compute_embeddings(module, images[:batch_size], warm_up)
    timed = EmbedSettings(size, batch_size, flip=False, progress=progress)
    (seconds,) = timed_repeats(
        lambda: compute_embeddings(module, images, timed),
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


def table(result: dict[str, Any]) -> str:
    embedding, metrics = result["embedding"], result["metrics"]
    verdict = "PASS" if metrics["pass"] else "MISS"
    size = f"{embedding['image_size']}x{embedding['image_size']}"
    rows = [
        [
            "embedding throughput",
            f"{embedding['backbone']} {size}, batch {embedding['batch_size']}, {embedding['device']}, "
            f"{embedding['threads']} threads, no flip",
            f"{embedding['images_per_s']:,.1f} img/s ({embedding['ms_per_batch']:,.0f} ms/batch)",
            "",
        ],
        [
            "verification metrics",
            f"{metrics['pairs']:,} pairs, {metrics['folds']} folds",
            f"{1000 * metrics['median_s']:,.1f} ms",
            f"< {metrics['target_s']:g} s: {verdict}",
        ],
    ]
    return "\n".join(markdown_table(["measure", "setting", "result", "target"], rows, numeric=("result",)))


def run(
    backbone: str,
    image_size: int,
    batch_size: int,
    batches: int,
    threads: int | None,
    pairs: int,
    repeats: int,
    out: Path,
    overwrite: bool,
    device: str,
) -> None:
    """The work of `facetrain bench eval` (its options and help: facetrain/cli/bench_eval.py)."""
    device = resolve_device(device)
    threads = threads or torch.get_num_threads()
    if not overwrite:
        refuse_to_overwrite([out])
    result = {
        "benchmark": "eval",
        "embedding": embedding_throughput(
            backbone, image_size, batch_size, batches, threads, progress=True, device=device
        ),
        "metrics": metric_time(pairs, repeats),
        "machine": {**machine_info(), "gpu": gpu_info(device)},
    }
    click.echo(write_report(out.parent, result, table(result), ReportFiles(json=out.name)))
    click.echo(f"\nwrote {out}")
