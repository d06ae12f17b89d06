"""`facetrain bench train`: end-to-end training steps, sharded head against a DDP-replicated full FC.

Both runs time the trainer's own `train_step` (backbone forward/backward, DDP, head, SGD + momentum) on
the same in-memory images, so the figures compare the classifiers inside a real step, without data
loading. The replicated FC is what plain DDP training does: every rank holds all C classes, computes
normalize + linear + margin + cross_entropy on its local batch, and all-reduces the C x D gradient.
The `linear` head is the floor: the backbone under a plain nn.Linear softmax over --linear-classes.
On CUDA a step is timed until its kernels finish and peak memory is the GPU's allocated bytes; ranks
that share a GPU join with gloo (`parallel/workers.py`), which the report states.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import click
import torch
import torch.nn.functional as F
from torch import nn

from facetrain.bench.common import (
    gpu_info,
    machine_info,
    mean_of_max_over_ranks,
    parse_name_list,
    peak_memory,
    timed_repeats,
)
from facetrain.bench.report import ReportFiles, markdown_table, write_report
from facetrain.devices import resolve_device
from facetrain.heads import DenseMarginHead, HeadOutput, HeadPlan, ShardedMarginHead, collectives
from facetrain.heads.kernel_choice import resolve_kernel
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.dims import ParallelDims, init_parallel
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.parallel.workers import WorkerPool
from facetrain.registry import Registry
from facetrain.train.device_defaults import tile_classes
from facetrain.train.optim import OptimConfig, build_fused_optimizer, build_optimizer
from facetrain.train.step import StepParts, StepSettings, train_step

HEAD_OVERHEAD_TARGET = 0.15
BENCH_OPTIM = OptimConfig(lr=0.01, grad_clip=None)


class LinearSoftmax(nn.Module):
    """A plain classifier: logits = W x + b, cross-entropy; what a backbone costs without a margin head."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        logits = self.fc(embeddings)
        accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
        return HeadOutput(F.cross_entropy(logits.float(), labels), accuracy)


BENCH_TRAIN_HEADS: Registry = Registry("bench train head")


@BENCH_TRAIN_HEADS.register("sharded")
def _sharded(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    local, model, _ = parallelize_backbone(backbone, dims, ParallelConfig(), shape)
    head = ShardedMarginHead(settings["classes"], settings["dim"], margin="arcface", group=dims.dp_group)
    return local, model, head.to(dims.device)


@BENCH_TRAIN_HEADS.register("tiled")
def _tiled(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    """The tiled head with its fused SGD and the tile kernel head.kernel auto picks (Triton on CUDA): the
    trainer's setting for a head that does not fit untiled."""
    local, model, _ = parallelize_backbone(backbone, dims, ParallelConfig(), shape)
    kernel = resolve_kernel("auto", dims.device.type)
    plan = HeadPlan("tiled", tile_classes(None, dims.device.type), fused_optimizer=True, kernel=kernel)
    head = ShardedMarginHead(
        settings["classes"], settings["dim"], margin="arcface", group=dims.dp_group, plan=plan
    )
    head.fuse_optimizer(build_fused_optimizer(BENCH_OPTIM, head, torch.float32))
    return local, model, head.to(dims.device)


def _replicated_head(head: nn.Module, backbone: nn.Module, dims: ParallelDims) -> tuple:
    """Every rank holds the whole classifier; each loss is its own batch's mean, so DDP averages."""
    local = backbone.to(dims.device)
    model = wrap_data_parallel(local, dims.device, dims.dp_group)
    return local, model, wrap_data_parallel(head.to(dims.device), dims.device, dims.dp_group, "mean")


@BENCH_TRAIN_HEADS.register("replicated")
def _replicated(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    head = DenseMarginHead(settings["classes"], settings["dim"], margin="arcface")
    return _replicated_head(head, backbone, dims)


@BENCH_TRAIN_HEADS.register("linear")
def _linear(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    return _replicated_head(LinearSoftmax(settings["linear_classes"], settings["dim"]), backbone, dims)


def _train_worker(rank: int, world_size: int, kind: str, settings: dict) -> dict:
    classes = settings["linear_classes"] if kind == "linear" else settings["classes"]
    dim, size, batch = settings["dim"], settings["image_size"], settings["batch"]
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(batch, 3, size, size, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    dims = init_parallel()
    device = dims.device
    step_settings = StepSettings(
        device=device, precision=settings["precision"], channels_last=settings["channels_last"]
    )
    # data loading is not part of the figure: the batch sits on the device in the step's layout
    images = images.to(device, memory_format=step_settings.memory_format)
    labels = labels.to(device)
    with peak_memory(device) as peak:
        torch.manual_seed(0)
        backbone = build_backbone(
            ModelConfig(backbone=settings["backbone"], embedding_size=dim), (size, size)
        ).to(memory_format=step_settings.memory_format)
        if settings["compile"]:  # as model.compile does: in place, compiled on the first warm-up step
            backbone.compile()
        local, model, head = BENCH_TRAIN_HEADS.build(kind, backbone, dims, settings, images.shape)
        fp16 = settings["precision"] == "fp16"
        optimizer = build_optimizer(BENCH_OPTIM, local, head, grad_scaling=fp16)
        scaler = torch.amp.GradScaler(device.type, enabled=fp16)
        batches = itertools.repeat((images, labels))
        times = timed_repeats(
            lambda: train_step(batches, StepParts(model, head, optimizer, scaler, step_settings)),
            settings["steps"],
            settings["warmup"],
            before_each=collectives.barrier,
            device=device,
        )
    return {"times": times, "peak_bytes": peak.growth_bytes, "memory_method": peak.method}


def _targets(rows: dict[str, dict]) -> dict:
    targets = {}
    if "sharded" in rows and "replicated" in rows:
        sharded, replicated = rows["sharded"], rows["replicated"]
        speedup = sharded["images_per_s"] / replicated["images_per_s"]
        ratio = max(sharded["peak_bytes_per_rank"]) / max(max(replicated["peak_bytes_per_rank"]), 1)
        targets["speedup"] = {"value": speedup, "target": ">= 1.5", "pass": speedup >= 1.5}
        targets["peak_memory_ratio"] = {"value": ratio, "target": "<= 0.6", "pass": ratio <= 0.6}
    for head, name in (("sharded", "head_overhead"), ("tiled", "tiled_head_overhead")):
        if head in rows and "linear" in rows:
            overhead = rows[head]["step_s"] / rows["linear"]["step_s"] - 1
            targets[name] = {
                "value": overhead,
                "target": f"<= {HEAD_OVERHEAD_TARGET}",
                "pass": overhead <= HEAD_OVERHEAD_TARGET,
            }
    return targets


def run_train_benchmark(settings: dict) -> dict:
    world_size, device = settings["world_size"], settings["device"]
    threads = max(1, (torch.get_num_threads() or 1) // world_size)
    rows = {}
    for kind in settings["heads"]:
        with WorkerPool(world_size, threads, device=device) as pool:
            backend = pool.backend
            per_rank = pool.run(_train_worker, kind, settings)
        step_s = mean_of_max_over_ranks([r["times"] for r in per_rank])
        rows[kind] = {
            "head": kind,
            "classes": settings["linear_classes"] if kind == "linear" else settings["classes"],
            "step_s": step_s,
            "images_per_s": settings["batch"] * world_size / step_s,
            "peak_bytes_per_rank": [r["peak_bytes"] for r in per_rank],
            "memory_method": per_rank[0]["memory_method"],
        }
    return {
        "settings": {**settings, "backend": backend},
        "machine": {**machine_info(), "gpu": gpu_info(device)},
        "rows": list(rows.values()),
        "targets": _targets(rows),
    }


FILES = ReportFiles(json="train.json")  # the table is printed, not kept


def table(result: dict) -> str:
    settings = result["settings"]
    lines = [
        f"{settings['world_size']} ranks on {settings['device']} ({settings['backend']}), "
        f"{settings['backbone']} {settings['image_size']}px, {settings['precision']}"
        f"{', channels_last' if settings['channels_last'] else ''}"
        f"{', compiled' if settings.get('compile') else ''}; "
        f"peak memory: {result['rows'][0]['memory_method']}",
        "",
    ]
    titles = ["head", "classes", "step (s)", "images/s", "peak memory per rank (MiB)"]
    cells = (
        [row["head"], str(row["classes"]), f"{row['step_s']:.3f}", f"{row['images_per_s']:.1f}",
         ", ".join(f"{p / 2**20:.0f}" for p in row["peak_bytes_per_rank"])]
        for row in result["rows"]
    )  # fmt: skip
    lines += markdown_table(titles, cells, numeric=("classes", "step (s)", "images/s"))
    for name, target in result["targets"].items():
        verdict = "PASS" if target["pass"] else "MISS"
        lines.append(f"\n{name}: {target['value']:.2f} (target {target['target']}) {verdict}")
    return "\n".join(lines)


def run(
    classes, world_size, backbone, image_size, dim, batch, steps, warmup, heads, linear_classes,
    precision, channels_last, compile_backbone, out, device,
) -> None:  # fmt: skip
    """The work of `facetrain bench train` (its options and help: facetrain/cli/bench_train.py)."""
    settings = {
        "device": resolve_device(device),
        "classes": classes,
        "world_size": world_size,
        "backbone": backbone,
        "image_size": image_size,
        "dim": dim,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "heads": parse_name_list(heads, "--heads", BENCH_TRAIN_HEADS.names()),
        "linear_classes": linear_classes,
        "precision": precision,
        "channels_last": channels_last,
        "compile": compile_backbone,
    }
    result = run_train_benchmark(settings)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    click.echo(write_report(out_dir, result, table(result), FILES))
    click.echo(f"\nwrote {out_dir / FILES.json}")
