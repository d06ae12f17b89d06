"""`facetrain bench scaling`: the class-sharded head's scaling model (facetrain/bench/scaling_model.py),
checked against `facetrain bench head` at small N on the CPU and evaluated for the cases users ask
about. docs/scaling.md explains the model and what its figures say.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import click

from facetrain.bench.common import machine_info, parse_int_list, parse_name_list
from facetrain.bench.report import write_report
from facetrain.bench.scaling_cases import H100, R100, evaluate, user_case_steps
from facetrain.bench.scaling_report import FIGURES, FILES, table
from facetrain.bench.scaling_validation import HEAD_MODES, TOLERANCE, ValidationSettings, compare, measure
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite


def evaluate_targets(validation: dict | None) -> list[dict]:
    """Model within TOLERANCE of the measurement at every N, for memory, bytes and time."""
    targets = []
    for title, key in FIGURES.items():
        name = f"scaling model's {title} within {TOLERANCE:.0%} of bench head at every N"
        if validation is None:
            targets.append({"name": name, "threshold": "", "status": "N/A", "detail": "not measured"})
            continue
        worst = max(validation["rows"], key=lambda row: abs(row["relative_error"][key]))
        error = worst["relative_error"][key]
        targets.append(
            {
                "name": name,
                "threshold": f"|error| <= {TOLERANCE:.0%}",
                "status": "PASS" if abs(error) <= TOLERANCE else "MISS",
                "detail": f"worst {error:+.1%} ({worst['head']}, N={worst['world_size']})",
            }
        )
    return targets


def run_scaling_benchmark(settings: ValidationSettings | None, progress: bool = True) -> dict:
    validation = compare(settings, measure(settings, progress)) if settings is not None else None
    return {
        "benchmark": "scaling",
        "machine": machine_info(),
        "device_model": asdict(H100),
        "backbone_model": asdict(R100),
        "validation": validation,
        "cases": [evaluate(step) for step in user_case_steps()],
        "targets": evaluate_targets(validation),
    }


def run(
    classes: int,
    dim: int,
    batch_per_rank: int,
    world_sizes: str,
    heads: str,
    tile_classes: int,
    steps: int,
    warmup: int,
    cases_only: bool,
    out: Path,
    overwrite: bool,
) -> None:
    """The work of `facetrain bench scaling` (its options and help: facetrain/cli/bench_scaling.py)."""
    settings = None
    if not cases_only:
        settings = ValidationSettings(
            classes=classes,
            dim=dim,
            batch_per_rank=batch_per_rank,
            world_sizes=tuple(parse_int_list(world_sizes, "--world-sizes")),
            heads=tuple(parse_name_list(heads, "--heads", HEAD_MODES)),
            tile_classes=tile_classes,
            steps=steps,
            warmup=warmup,
        )
        if classes < max(settings.world_sizes):
            raise FacetrainError(f"--classes {classes} is fewer than {max(settings.world_sizes)} ranks")
    if not overwrite:
        refuse_to_overwrite(out / name for name in FILES.names.values())
    began = time.perf_counter()
    report = run_scaling_benchmark(settings)
    click.echo(write_report(out, report, table(report), FILES))
    click.echo(f"wrote {out} in {time.perf_counter() - began:.0f} s")
