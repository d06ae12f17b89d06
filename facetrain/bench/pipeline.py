"""`facetrain bench pipeline`: single device against model parallel against pipelined, on a backbone.

The experiment of PyTorch's model-parallel tutorial, on facetrain's own backbones and pipeline
runtime: cutting a network into two stages on two devices alone makes a step slower (one stage idles
while the other works, and activations travel between them), and feeding the stages micro-batches
lets both work at once. On CPU each stage is a process with one thread; a single device is shown
with one thread and with as many threads as there are stages, so that both get the same cores.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from facetrain.bench import pipeline_report
from facetrain.bench.common import parse_int_list
from facetrain.bench.pipeline_cases import PipelineBenchSettings, check_settings, run_pipeline_benchmark
from facetrain.bench.report import write_report
from facetrain.devices import resolve_device
from facetrain.files import refuse_to_overwrite


def run(
    backbone: str,
    image_size: int,
    batch_size: int,
    embedding_size: int,
    classes: int,
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
    device: str,
) -> None:
    """The work of `facetrain bench pipeline` (its options and help: facetrain/cli/bench_pipeline.py)."""
    settings = PipelineBenchSettings(
        backbone=backbone,
        image_size=image_size,
        batch_size=batch_size,
        embedding_size=embedding_size,
        classes=classes,
        stages=stages,
        microbatches=microbatches,
        split_sizes=tuple(parse_int_list(split_sizes, "--split-sizes")),
        schedule=schedule,
        split_at=tuple(name.strip() for name in split_at.split(",") if name.strip()),
        repeats=repeats,
        steps=steps,
        warmup=warmup,
        device=resolve_device(device),
    )
    check_settings(settings)
    if not overwrite:
        refuse_to_overwrite(out / name for name in pipeline_report.FILES.names.values())
    began = time.perf_counter()
    report = run_pipeline_benchmark(settings)
    click.echo(write_report(out, report, pipeline_report.table(report), pipeline_report.FILES))
    click.echo(f"wrote {out} in {time.perf_counter() - began:.0f} s")
