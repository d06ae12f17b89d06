"""`facetrain bench head --capacity`: how many classes one rank trains per GB of memory, by head mode.

For each head and class count C, one full training step of the head alone (forward, backward, optimizer
update: torch's SGD with momentum, or the tiled head's fused SGD inside its backward) runs on B random
embeddings of D dims, and the rank's peak memory is measured from before the head existed, so it
counts weights, optimizer state, gradients and the step's activations. Classes per GB is the shard's
class count over that peak in GiB. With `--largest`, the largest C that one process fits under the
memory limit is found for the chosen heads: predicted from the largest measured run's bytes per class,
then trained for one step to confirm (10% less after a failure, three attempts).

Cases of `fresh_process_classes` or more run each in a new worker process, so their peak is that of a
first step on a fresh heap, as a training run's is: after earlier cases, glibc's heap (and its raised
mmap threshold) would hide or add growth that a real run does not see.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from facetrain.bench.common import machine_info
from facetrain.bench.head_capacity_report import evaluate_capacity_targets
from facetrain.bench.head_cases import BENCH_HEADS, HeadCase
from facetrain.bench.head_measure import StepTiming, measure_case
from facetrain.errors import FacetrainError
from facetrain.parallel.workers import WorkerError, WorkerPool
from facetrain.progress import ProgressBar

GIB = 2**30
# RSS of one worker after importing torch and joining gloo, before any head exists (measured ~0.53 GiB).
PROCESS_BASELINE_BYTES = int(0.6 * GIB)
LARGEST_ATTEMPTS = 3
LARGEST_SHRINK = 0.9


@dataclass(frozen=True)
class CapacitySettings:
    classes: tuple[int, ...] = (100_000, 300_000, 1_000_000, 3_000_000)
    heads: tuple[str, ...] = ("sharded", "tiled", "tiled_bf16", "dense", "naive")
    world_size: int = 1
    batch: int = 256
    dim: int = 512
    tile_classes: int = 8192
    steps: int = 1
    warmup: int = 0
    memory_limit_gb: float = 18.0
    largest: tuple[str, ...] = ()
    device: str = "cpu"
    seed: int = 0
    fresh_process_classes: int = 1_000_000

    def case(self, head: str, num_classes: int) -> HeadCase:
        return HeadCase(head, num_classes, self.world_size, self.batch, self.dim, self.tile_classes)

    def validate(self) -> None:
        if self.batch % self.world_size:
            raise FacetrainError(f"--batch {self.batch} does not split evenly over {self.world_size} ranks")
        if self.device == "cuda" and self.world_size != 1:
            raise FacetrainError("--capacity on cuda measures one GPU: use --world-sizes 1")
        unknown = [head for head in self.largest if head not in self.heads]
        if unknown:
            raise FacetrainError(f"--largest {unknown[0]} is not among --heads {','.join(self.heads)}")


def estimated_total_bytes(case: HeadCase) -> int:
    """What the machine must hold for `case` with its optimizer: every rank's growth and baseline."""
    per_rank = BENCH_HEADS.build(case.head).estimate_bytes_per_rank(case, with_optimizer=True)
    return sum(per_rank) + PROCESS_BASELINE_BYTES * case.world_size


class _Runner:
    """Runs cases in a worker pool that is reopened after a rank dies (out of memory, say)."""

    def __init__(self, settings: CapacitySettings):
        self.settings = settings
        self.pool: WorkerPool | None = None

    def measure(self, case: HeadCase, skip_over_estimate: bool = True) -> dict:
        """One case's row; cases estimated over the memory limit are skipped unless told otherwise."""
        settings = self.settings
        row = {**asdict(case), "shard_classes": case.shard_classes(0)}
        row["estimated_total_bytes"] = estimated_total_bytes(case)
        if skip_over_estimate and row["estimated_total_bytes"] > settings.memory_limit_gb * GIB:
            return {**row, "status": "skipped"}
        row["fresh_process"] = case.num_classes >= settings.fresh_process_classes
        if row["fresh_process"]:
            self.close()
        try:
            return self._measure(case, row)
        finally:
            if row["fresh_process"]:
                self.close()

    def _measure(self, case: HeadCase, row: dict) -> dict:
        settings = self.settings
        if self.pool is None:
            threads = max(1, (os.cpu_count() or 1) // case.world_size)
            self.pool = WorkerPool(case.world_size, threads)
        try:
            # a full training step (with the optimizer), without the GEMM timing
            with_optimizer, time_gemms = True, False
            ranks = self.pool.run(
                measure_case, case, StepTiming(settings.steps, settings.warmup, settings.seed), with_optimizer,
                settings.device, time_gemms,
            )  # fmt: skip
        except WorkerError as error:
            self.pool = None
            ProgressBar.write(f"{case.head} C={case.num_classes:,} failed: {error}")
            return {**row, "status": "failed", "error": str(error)}
        peak = max(rank["peak_memory_bytes"] for rank in ranks)
        return {
            **row,
            "status": "ok",
            "peak_memory_bytes_per_rank": [rank["peak_memory_bytes"] for rank in ranks],
            "peak_memory_max_bytes": peak,
            "bytes_per_class": peak / case.shard_classes(0),
            "classes_per_gib": case.shard_classes(0) / (peak / GIB),
            "step_s": max(max(rank["step_s"]) for rank in ranks),
            "memory_method": ranks[0]["memory_method"],
            "threads_per_rank": ranks[0]["threads"],
        }

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _predicted_largest(rows: list[dict], head: str, limit_bytes: float, world_size: int) -> int | None:
    """The C whose peak the largest measured run of `head` extrapolates to the limit, 3 digits."""
    measured = [row for row in rows if row["head"] == head and row["status"] == "ok"]
    if not measured:
        return None
    largest = max(measured, key=lambda row: row["num_classes"])
    usable = limit_bytes / world_size - PROCESS_BASELINE_BYTES
    classes = usable / largest["bytes_per_class"] * world_size
    digits = 10 ** max(0, int(math.log10(classes)) - 2)
    return int(classes // digits * digits)


def find_largest(runner: _Runner, rows: list[dict], head: str) -> list[dict]:
    """Attempts at the largest C for `head`: each a measured row with `largest_attempt` set."""
    settings = runner.settings
    classes = _predicted_largest(rows, head, settings.memory_limit_gb * GIB, settings.world_size)
    attempts = []
    for attempt in range(LARGEST_ATTEMPTS if classes else 0):
        # the prediction comes from a measurement: try it even where the coarser estimate says no
        row = runner.measure(settings.case(head, classes), skip_over_estimate=False)
        row["largest_attempt"] = attempt + 1
        attempts.append(row)
        if row["status"] == "ok":
            break
        classes = int(classes * LARGEST_SHRINK)
    return attempts


def run_capacity_benchmark(settings: CapacitySettings, progress: bool = True) -> dict:
    settings.validate()
    runner = _Runner(settings)
    cases = [settings.case(head, c) for head in settings.heads for c in sorted(settings.classes)]
    rows: list[dict] = []
    try:
        for case in ProgressBar(cases, desc="bench head --capacity", unit="config", disable=not progress):
            rows.append(runner.measure(case))
        for head in settings.largest:
            rows.extend(find_largest(runner, rows, head))
    finally:
        runner.close()
    return {
        "benchmark": "head_capacity",
        "machine": machine_info(),
        "settings": {
            **asdict(settings),
            "memory_limit_bytes": int(settings.memory_limit_gb * GIB),
            "process_baseline_bytes": PROCESS_BASELINE_BYTES,
            "optimizer": "SGD, momentum 0.9, weight decay 5e-4 (torch.optim.SGD, or the tiled head's fused SGD)",
            "margin": "arcface",
        },
        "methods": {
            "step": "forward + backward + optimizer update of the head alone on random embeddings",
            "peak_memory": "per rank: peak growth over the process's memory before the head existed "
            "(CPU: RSS high-water mark VmHWM reset through /proc/self/clear_refs; CUDA: "
            "torch.cuda.max_memory_allocated); cases with fresh_process_classes or more classes each "
            "run in a new worker process, so the peak is a first step's on a fresh heap",
            "classes_per_gib": "classes on the rank / (peak memory in GiB)",
        },
        "results": rows,
        "targets": evaluate_capacity_targets(rows),
    }
