"""The scaling model against measurements: `facetrain bench head`'s own per-rank figures (peak memory,
bytes sent, step and GEMM times) at small N on the CPU, with the per-rank batch b held fixed as N grows.

Memory and bytes are compared as they come. Time needs the device's rates: on a CPU shared by N
processes (and by other people's jobs) a rank's GEMM rate is not a constant of the machine, so each
configuration's rate is the one measured there (bench head times the untiled step's three GEMMs alone
in the same worker), and the cost of the elementwise passes relative to it is one constant fitted over
all configurations (least squares of the relative errors). Times are the fastest repeat of the
slowest rank: other jobs on the machine only ever add time.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from facetrain.bench.head import summarize
from facetrain.bench.head_cases import HeadCase
from facetrain.bench.head_measure import StepTiming, measure_case
from facetrain.bench.scaling_model import (
    Step,
    elementwise_bytes,
    gemm_flops,
    memory_bytes,
    wire_bytes,
)
from facetrain.parallel.workers import WorkerPool
from facetrain.progress import ProgressBar

HEAD_MODES = {"sharded": "untiled", "tiled": "tiled"}  # bench head's names for the two modes
TOLERANCE = 0.10


@dataclass(frozen=True)
class ValidationSettings:
    classes: int = 100_000
    dim: int = 256
    batch_per_rank: int = 64
    world_sizes: tuple[int, ...] = (1, 2, 3, 4)
    heads: tuple[str, ...] = ("sharded", "tiled")
    tile_classes: int = 8192
    steps: int = 3
    warmup: int = 1
    seed: int = 0

    def case(self, head: str, world_size: int) -> HeadCase:
        batch = self.batch_per_rank * world_size
        return HeadCase(head, self.classes, world_size, batch, self.dim, self.tile_classes)

    def step(self, head: str, world_size: int) -> Step:
        return Step(
            self.classes, self.dim, self.batch_per_rank, world_size, HEAD_MODES[head],
            tile_classes=self.tile_classes, backend="gloo",
        )  # fmt: skip


def measure(settings: ValidationSettings, progress: bool = True) -> list[dict]:
    """bench head's summary of every (N, head), measured in N spawned CPU ranks."""
    rows = []
    sizes = ProgressBar(settings.world_sizes, desc="bench scaling", unit="N", disable=not progress)
    for world_size in sizes:
        threads = max(1, (os.cpu_count() or 1) // world_size)
        with WorkerPool(world_size, threads, device="cpu") as pool:
            for head in settings.heads:
                case = settings.case(head, world_size)
                ranks = pool.run(
                    measure_case, case, StepTiming(settings.steps, settings.warmup, settings.seed)
                )
                rows.append(
                    {
                        "head": head,
                        "world_size": world_size,
                        **summarize(case, ranks),
                        "fastest_step_s": min(map(max, zip(*(rank["step_s"] for rank in ranks)))),
                        "fastest_gemm_s": min(map(max, zip(*(rank["gemm_s"] for rank in ranks)))),
                    }
                )
    return rows


def _relative_error(model: float, measured: float) -> float:
    return (model - measured) / measured if measured else (0.0 if model == 0 else float("inf"))


def elementwise_cost(settings: ValidationSettings, measured: list[dict]) -> float:
    """GEMM flops the device does in the time of one byte of elementwise pass: the constant that makes
    the model's times closest to the measured ones (least squares of the relative errors)."""
    pairs = []
    for row in measured:
        step = settings.step(row["head"], row["world_size"])
        scale = _gemm_rate(step, row) * row["fastest_step_s"]
        pairs.append((elementwise_bytes(step) / scale, gemm_flops(step) / scale - 1))
    return max(0.0, -sum(a * c for a, c in pairs) / sum(a * a for a, _ in pairs))


def compare(settings: ValidationSettings, measured: list[dict]) -> dict:
    """Model against measurement for every row, and the one fitted constant."""
    flops_per_byte = elementwise_cost(settings, measured)
    rows = []
    for row in measured:
        step = settings.step(row["head"], row["world_size"])
        gemm_rate = _gemm_rate(step, row)
        model = {
            "peak_memory_bytes": sum(memory_bytes(step, with_optimizer_state=False).values()),
            "bytes_sent": sum(wire_bytes(step).values()),
            "step_s": (gemm_flops(step) + flops_per_byte * elementwise_bytes(step)) / gemm_rate,
        }
        observed = {
            "peak_memory_bytes": row["peak_memory_max_bytes"],
            "bytes_sent": max(row["bytes_sent_per_rank_per_step"]),
            "step_s": row["fastest_step_s"],
        }
        errors = {key: _relative_error(model[key], observed[key]) for key in model}
        rows.append(
            {
                "head": row["head"],
                "mode": step.mode,
                "world_size": step.world_size,
                "global_batch": step.global_batch,
                "shard_classes": step.shard,
                "model": model,
                "measured": observed,
                "relative_error": errors,
                "within_tolerance": all(abs(e) <= TOLERANCE for e in errors.values()),
                "memory_parts": memory_bytes(step, with_optimizer_state=False),
                "gemm_flops_per_s": gemm_rate,
                "bench_head": row,
            }
        )
    return {
        "settings": asdict(settings),
        "tolerance": TOLERANCE,
        "gemm_flops_per_elementwise_byte": flops_per_byte,
        "rows": rows,
    }


def _gemm_rate(step: Step, row: dict) -> float:
    """Flop/s of the three untiled GEMMs bench head timed alone for this configuration."""
    untiled_flops = gemm_flops(Step(step.classes, step.dim, step.batch_per_rank, step.world_size))
    return untiled_flops / row["fastest_gemm_s"]
