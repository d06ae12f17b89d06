"""What `facetrain bench pipeline` measures: the trainer's step on one device, model parallel, pipelined.

Every run times `facetrain.train.step.train_step` with the backbone as the trainer parallelizes it
(`parallelize_backbone`) and the sharded margin head on the last stage. On CPU each stage is a process
with one thread; a single device is shown with one thread and with as many threads as there are stages,
so that both get the same cores. On CUDA each stage needs a GPU of its own (stage processes join with
nccl): gloo cannot send CUDA tensors point to point and NCCL refuses two ranks on one GPU.
"""

from __future__ import annotations

import itertools
import os
import statistics
from dataclasses import asdict

import torch

from facetrain.bench.common import gpu_info, machine_info, mean_of_max_over_ranks, timed_repeats
from facetrain.bench.pipeline_settings import DEFAULTS, PipelineBenchSettings  # noqa: F401 (re-exported)
from facetrain.devices import rank_device
from facetrain.errors import FacetrainError
from facetrain.heads import ShardedMarginHead, collectives
from facetrain.models import BACKBONES, build_backbone
from facetrain.models.config import ModelConfig
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.dims import ParallelDims, init_parallel
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.parallel.pipeline_split import (
    balanced_boundaries,
    boundaries_from_split_points,
    measure_unit_costs,
    pipeline_units,
)
from facetrain.parallel.workers import WorkerPool
from facetrain.progress import ProgressBar
from facetrain.train.optim import OptimConfig, build_optimizer
from facetrain.train.step import StepParts, StepSettings, train_step

SPEEDUP_TARGET = 1.5
OPTIM = OptimConfig(lr=0.01, momentum=0.9, grad_clip=None)


def check_settings(settings: PipelineBenchSettings, gpu_count: int | None = None) -> None:
    """One line for settings the benchmark cannot run: an unknown backbone, too few GPUs, micro-batch
    sizes that do not divide the batch."""
    BACKBONES.get(settings.backbone)
    check_stage_devices(
        settings.device, settings.stages, torch.cuda.device_count() if gpu_count is None else gpu_count
    )
    batch_size, microbatches = settings.batch_size, settings.microbatches
    for size in (*settings.split_sizes, batch_size // max(microbatches, 1)):
        if size < 1 or batch_size % size:
            raise FacetrainError(
                f"micro-batch size {size} does not divide --batch-size {batch_size}; "
                "choose --split-sizes and --microbatches that divide it"
            )
    if microbatches < 2 or batch_size % microbatches:
        raise FacetrainError(f"--microbatches {microbatches} must be >= 2 and divide --batch-size")
    if (
        settings.schedule == "1f1b"
        and min(c for c in settings.microbatch_counts() if c > 1) < settings.stages
    ):
        raise FacetrainError(
            f"--schedule 1f1b needs at least --stages {settings.stages} micro-batches per step"
        )


def check_stage_devices(device: str, stages: int, gpu_count: int) -> None:
    if device == "cuda" and stages > gpu_count:
        raise FacetrainError(
            f"--device cuda --stages {stages} needs a GPU per stage, {gpu_count} visible: gloo cannot send "
            "CUDA tensors point to point and NCCL refuses two ranks on one GPU; use --device cpu or fewer --stages"
        )


def training_data(settings: PipelineBenchSettings) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(settings.seed)
    images = torch.randn(settings.input_shape, generator=generator)
    return images, torch.randint(0, settings.classes, (settings.batch_size,), generator=generator)


def make_backbone(settings: PipelineBenchSettings) -> torch.nn.Module:
    torch.manual_seed(settings.seed)
    cfg = ModelConfig(backbone=settings.backbone, embedding_size=settings.embedding_size)
    return build_backbone(cfg, (settings.image_size, settings.image_size))


def make_head(settings: PipelineBenchSettings, group=None) -> ShardedMarginHead:
    torch.manual_seed(settings.seed)
    return ShardedMarginHead(settings.classes, settings.embedding_size, group=group)


def _timed_train_steps(
    settings: PipelineBenchSettings, device: torch.device, model, head, local, pipeline=None, before_each=None
) -> list[float]:
    """Seconds of each timed `train_step` (the trainer's own step: forward, backward, SGD) on `device`."""
    optimizer = build_optimizer(OPTIM, local, head)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    images, labels = training_data(settings)
    batches = itertools.repeat((images.to(device), labels.to(device)))
    parts = StepParts(model, head, optimizer, scaler, StepSettings(device=device), pipeline)

    def step() -> None:
        train_step(batches, parts)

    return timed_repeats(step, settings.steps, settings.warmup, before_each=before_each, device=device)


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
    """Mean seconds of one training step of the whole backbone and head in this process."""
    torch.set_num_threads(threads)
    device = rank_device(settings.device, 0)
    backbone = make_backbone(settings).to(device)
    head = make_head(settings).to(device)
    return statistics.mean(_timed_train_steps(settings, device, backbone, head, backbone))


def pipeline_step_times(
    settings: PipelineBenchSettings, dims: ParallelDims, microbatches: int, split_points: list[str]
) -> list[float]:
    cfg = ParallelConfig(
        pipeline_stages=settings.stages,
        microbatches=microbatches,
        schedule=settings.schedule if microbatches >= settings.stages else "gpipe",
        split_points=split_points,
    )
    local, model, pipeline = parallelize_backbone(make_backbone(settings), dims, cfg, settings.input_shape)
    head = make_head(settings, dims.dp_group).to(dims.device) if dims.is_last_stage else None
    return _timed_train_steps(
        settings, dims.device, model, head, local, pipeline, before_each=collectives.barrier
    )


def pipeline_worker(
    rank: int, world_size: int, settings: PipelineBenchSettings, split_points: list[str]
) -> dict[int, list[float]]:
    """On every stage process: seconds of each timed step for every micro-batch count."""
    dims = init_parallel(pipeline_stages=settings.stages)
    return {
        count: pipeline_step_times(settings, dims, count, split_points)
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
    check_settings(settings)
    load_before = list(os.getloadavg())
    split_points = plan_split_points(settings)
    single = {1: [], settings.stages: []}
    pipelined: dict[int, list[float]] = {count: [] for count in settings.microbatch_counts()}
    threads_before = torch.get_num_threads()
    with WorkerPool(settings.stages, threads_per_rank=1, device=settings.device) as pool:
        for _ in ProgressBar(
            range(settings.repeats), desc="bench pipeline", unit="repeat", disable=not progress
        ):
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
        "machine": {**machine_info(), "load_average_at_start": load_before, "gpu": gpu_info(settings.device)},
        "settings": {**asdict(settings), "split_points": split_points, "dtype": "float32"},
        "method": "training step = the trainer's train_step: forward, the sharded margin head's loss over "
        "--classes classes, backward, SGD step; each run times --steps steps after --warmup untimed ones (stage processes meet at a barrier before "
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
