"""`facetrain bench head`: the sharded head against the dense (DDP-replicated) and naive model-parallel FC.

Every (C, N, head) configuration runs in N spawned processes: on the CPU joined by gloo, on CUDA by nccl
when each rank has a GPU of its own and by gloo when they share one (`parallel/workers.py`). The sharded head's
claims are measured, not assumed: its step time (untiled, and tiled with its fused update) against the
three GEMMs of the untiled step alone, the balance of peak memory over ranks, and bytes per step that
do not depend on the class count. `--capacity` (facetrain/bench/head_capacity.py) measures memory
against C for a full training step instead.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from facetrain.bench import head_capacity_report, head_report
from facetrain.bench.common import (
    gpu_info,
    machine_info,
    mean_of_max_over_ranks,
    parse_int_list,
    parse_name_list,
)
from facetrain.bench.head_bytes import summarize_passes, traffic_figures
from facetrain.bench.head_capacity import CapacitySettings, run_capacity_benchmark
from facetrain.bench.head_cases import BENCH_HEADS, HeadCase
from facetrain.bench.head_measure import StepTiming, measure_case
from facetrain.bench.head_peers import PEER_HEADS, PEERS
from facetrain.bench.head_report import evaluate_targets
from facetrain.bench.peer_sources import check_peers_dir, install_wheels
from facetrain.bench.report import write_report
from facetrain.devices import resolve_device
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite
from facetrain.heads.margins import MARGINS
from facetrain.parallel.workers import WorkerError, WorkerPool
from facetrain.progress import ProgressBar
from facetrain.train.device_defaults import tile_classes as device_tile_classes

GIB = 2**30
# RSS of one worker after importing torch and joining gloo, before any head exists (measured ~0.53 GiB).
PROCESS_BASELINE_BYTES = int(0.6 * GIB)

METHODS = {
    "step_time": "forward + backward (+ the dense baseline's gradient all-reduce; the tiled head's fused SGD "
    "update runs inside its backward); ranks meet at a "
    "barrier before each step; mean over timed steps of the slowest rank",
    "gemm_time": "sharded and tiled: torch.mm for logits (B x D @ D x c), embedding gradient (B x c @ c x D) "
    "and weight gradient ((B x c)^T @ B x D) on the same shapes in the same worker, timed like a step",
    "peak_memory": "per rank: on the CPU peak RSS growth over the process's RSS before the head and data were "
    "created; the kernel's exact high-water mark VmHWM, reset through /proc/self/clear_refs "
    "(memory_method vmhwm-reset), or /proc/self/statm sampled every 1 ms (statm-sampling); on CUDA "
    "torch.cuda.max_memory_allocated, reset before the head is built, minus what was allocated then "
    "(cuda-max-allocated)",
    "bytes_sent": "per rank per step, counted by facetrain.parallel.traffic around the last step (ring model: all-gather sends "
    "(N-1)/N of the result, all-reduce twice its buffer's (N-1)/N)",
    "traffic": "tiled heads: the bytes the largest shard's step reads and writes in device memory, counted from its "
    "plan pass by pass (facetrain/bench/head_bytes.py: each pass over a C x D or B x C tensor once, B x D "
    "left out); copy_gbs: a device copy of 2 x 128 MiB (CPU) or 2 x 1 GiB (CUDA) buffers, read + write "
    "over its best of 5, on the rank's device and threads; achieved_gbs: bytes / step time; floor_ms: "
    "bytes / copy bandwidth",
}


@dataclass(frozen=True)
class HeadBenchSettings:
    classes: tuple[int, ...] = (100_000, 1_000_000)
    world_sizes: tuple[int, ...] = (1, 2, 4)
    batch: int = 256
    dim: int = 512
    heads: tuple[str, ...] = ("sharded", "tiled", "dense", "naive")
    margins: tuple[str, ...] = ("arcface",)
    tile_classes: int = 8192
    steps: int = 3
    warmup: int = 1
    memory_limit_gb: float = 18.0
    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"
    peers_dir: str = ""

    def cases(self) -> list[HeadCase]:
        """Every (N, C, margin, head); a kind with a margin of its own (the _softmax kinds, the peers)
        runs once for each (N, C), under the first margin."""
        return [
            HeadCase(
                head,
                num_classes,
                world_size,
                self.batch,
                self.dim,
                self.tile_classes,
                self.precision,
                self.peers_dir,
                margin,
            )  # fmt: skip
            for world_size in self.world_sizes
            for num_classes in self.classes
            for margin in self.margins
            for head in self.heads
            if margin == self.margins[0] or BENCH_HEADS.build(head).margin is None
        ]

    def validate(self) -> None:
        for world_size in self.world_sizes:
            if self.batch % world_size:
                raise FacetrainError(
                    f"--batch {self.batch} does not split evenly over {world_size} ranks; "
                    "use a multiple of every world size"
                )
        if min(self.classes) < max(self.world_sizes):
            raise FacetrainError(
                f"--classes {min(self.classes)} is fewer than {max(self.world_sizes)} ranks; "
                "every rank needs at least one class"
            )


def estimated_bytes_per_rank(case: HeadCase) -> list[int]:
    """Peak growth expected on each rank, from the tensors each head keeps alive (see head_cases)."""
    return BENCH_HEADS.build(case.head).estimate_bytes_per_rank(case)


def estimated_total_bytes(case: HeadCase, device: str = "cpu") -> int:
    """What the machine must hold: every rank's growth plus, on the CPU, every worker process's own
    baseline (on a GPU the processes' host memory is not what the limit is about)."""
    baseline = PROCESS_BASELINE_BYTES if device == "cpu" else 0
    return sum(estimated_bytes_per_rank(case)) + baseline * case.world_size


def summarize(case: HeadCase, ranks: list[dict]) -> dict:
    """Figures over ranks: the step of the slowest rank, memory spread, and bytes of each rank."""
    memory = [rank["peak_memory_bytes"] for rank in ranks]
    step_ms = 1000 * mean_of_max_over_ranks([rank["step_s"] for rank in ranks])
    summary = {
        "status": "ok",
        "threads_per_rank": ranks[0]["threads"],
        "step_ms": step_ms,
        "step_ms_each": [1000 * max(step) for step in zip(*(rank["step_s"] for rank in ranks))],
        "gemm_ms": None,
        "step_over_gemm": None,
        "peak_memory_bytes_per_rank": memory,
        "peak_memory_min_bytes": min(memory),
        "peak_memory_max_bytes": max(memory),
        "peak_memory_max_over_min": max(memory) / max(min(memory), 1),
        "memory_method": ranks[0]["memory_method"],
        "bytes_sent_per_rank_per_step": [rank["bytes_sent"] for rank in ranks],
        "bytes_by_op_per_rank": [rank["bytes_by_op"] for rank in ranks],
    }
    if ranks[0]["gemm_s"] is not None:
        summary["gemm_ms"] = 1000 * mean_of_max_over_ranks([rank["gemm_s"] for rank in ranks])
        summary["step_over_gemm"] = step_ms / summary["gemm_ms"]
    passes = BENCH_HEADS.build(case.head).traffic(case)
    if passes is not None and ranks[0].get("copy_bandwidth"):
        bandwidth = min(rank["copy_bandwidth"] for rank in ranks)
        parts = summarize_passes(passes)
        summary["traffic"] = {
            "bytes_by_kind": parts,
            **traffic_figures(parts["total"], step_ms / 1000, bandwidth),
        }
    return summary


def run_head_benchmark(settings: HeadBenchSettings, progress: bool = True) -> dict:
    """Measure every configuration that fits under the memory limit; return the full report."""
    settings.validate()
    limit_bytes = settings.memory_limit_gb * GIB
    rows = []
    cases = settings.cases()
    pools: dict[int, WorkerPool] = {}
    try:
        for case in ProgressBar(cases, desc="bench head", unit="config", disable=not progress):
            estimate = estimated_total_bytes(case, settings.device)
            kind = BENCH_HEADS.build(case.head)
            row = {
                **asdict(case),
                "computes": kind.describe(case),
                "margin": kind.margin_of(case),
                "local_batch": case.local_batch,
                "shard_classes_per_rank": [case.shard_classes(r) for r in range(case.world_size)],
                "estimated_bytes_per_rank": estimated_bytes_per_rank(case),
                "estimated_total_bytes": estimate,
            }
            if reason := kind.unavailable(case, settings.device):
                rows.append({**row, "status": "unavailable", "reason": reason})
                continue
            if estimate > limit_bytes:
                rows.append({**row, "status": "skipped"})
                continue
            for world_size in [n for n in pools if n != case.world_size]:
                pools.pop(world_size).close()
            if case.world_size not in pools:
                threads = max(1, (os.cpu_count() or 1) // case.world_size)
                pools[case.world_size] = WorkerPool(case.world_size, threads, device=settings.device)
            try:
                ranks = pools[case.world_size].run(
                    measure_case,
                    case,
                    StepTiming(settings.steps, settings.warmup, settings.seed),
                    False,
                    settings.device,
                )
            except WorkerError as error:
                pools.pop(case.world_size)
                ProgressBar.write(f"{case.head} C={case.num_classes} N={case.world_size} failed: {error}")
                rows.append({**row, "status": "failed", "error": str(error)})
                continue
            rows.append({**row, **summarize(case, ranks)})
    finally:
        for pool in pools.values():
            pool.close()
    return {
        "benchmark": "head",
        "machine": {**machine_info(), "gpu": gpu_info(settings.device)},
        "settings": {
            **asdict(settings),
            "memory_limit_bytes": int(limit_bytes),
            "process_baseline_bytes": PROCESS_BASELINE_BYTES,
            "dtype": "float32" if settings.precision == "fp32" else "float32 weights, bf16 autocast",
            "scale": 64.0,
        },
        "methods": METHODS,
        "results": rows,
        "targets": evaluate_targets(rows),
    }


def run(
    classes: str | None,
    world_sizes: str,
    batch: int,
    dim: int,
    heads: str | None,
    margins: str,
    tile_classes: int,
    steps: int | None,
    warmup: int | None,
    memory_limit_gb: float,
    capacity: bool,
    largest: str,
    device: str,
    precision: str,
    peers: str,
    peers_dir: Path,
    out: Path,
    overwrite: bool,
) -> None:
    """The work of `facetrain bench head` (its options and help: facetrain/cli/bench_head.py)."""
    if not capacity and largest:
        raise FacetrainError("--largest belongs to --capacity; add --capacity")
    if capacity and peers:
        raise FacetrainError("--peers belongs to the head bench without --capacity; drop one of them")
    if capacity and precision != "fp32":
        raise FacetrainError("--precision belongs to the head bench without --capacity; drop one of them")
    if capacity and margins != "arcface":
        raise FacetrainError("--margins belongs to the head bench without --capacity; drop one of them")
    device = resolve_device(device)
    tile_classes = device_tile_classes(tile_classes, device)
    own_heads = [name for name in BENCH_HEADS.names() if name not in PEER_HEADS]  # peers: --peers
    if capacity:
        settings = CapacitySettings(
            classes=tuple(parse_int_list(classes or "100000,300000,1000000,3000000", "--classes")),
            heads=tuple(
                parse_name_list(heads or "sharded,tiled,tiled_bf16,dense,naive", "--heads", own_heads)
            ),
            world_size=parse_int_list(world_sizes, "--world-sizes")[0],
            batch=batch,
            dim=dim,
            tile_classes=tile_classes,
            steps=steps or 1,
            warmup=0 if warmup is None else warmup,
            memory_limit_gb=memory_limit_gb,
            largest=tuple(parse_name_list(largest, "--largest", own_heads)) if largest else (),
            device=device,
        )
        settings.validate()
        outputs = head_capacity_report
    else:
        peer_names = parse_name_list(peers, "--peers", PEERS) if peers else []
        peer_heads = [head for name in peer_names for head in PEERS[name]]
        if peer_heads:
            check_peers_dir(peers_dir, peer_names)
        settings = HeadBenchSettings(
            classes=tuple(parse_int_list(classes or "100000,1000000", "--classes")),
            world_sizes=tuple(parse_int_list(world_sizes, "--world-sizes")),
            batch=batch,
            dim=dim,
            heads=tuple(
                dict.fromkeys(
                    parse_name_list(heads or "sharded,tiled,dense,naive", "--heads", own_heads) + peer_heads
                )
            ),
            margins=tuple(parse_name_list(margins, "--margins", MARGINS.names())),
            tile_classes=tile_classes,
            steps=steps or 3,
            warmup=1 if warmup is None else warmup,
            memory_limit_gb=memory_limit_gb,
            device=device,
            precision=precision,
            peers_dir=str(peers_dir.resolve()) if peer_heads else "",
        )
        settings.validate()
        outputs = head_report
    if not overwrite:
        refuse_to_overwrite([out / name for name in outputs.FILES.names.values()])
    if not capacity and peer_heads:
        install_wheels(peers_dir, peer_names)
    report = run_capacity_benchmark(settings) if capacity else run_head_benchmark(settings)
    click.echo(write_report(out, report, outputs.table(report), outputs.FILES))
    click.echo(f"wrote {', '.join(str(out / name) for name in outputs.FILES.names.values())}")
