"""The sharded head of a training run: its `HeadPlan` resolved once from the config, the device and the
tightest rank's free memory, logged by the primary rank as one line, and the head built from it.

Every decision about how the head runs is made here and nowhere else: head.mode (auto resolved by
memory), the tile (head.tile_classes, or the device's default), the tile kernel (head.kernel auto:
Triton on CUDA), the storage dtypes, and whether the fused optimizer is used. That last one follows
one rule (`config.validate.fused_optimizer_conflict`): a setting the fused optimizer cannot honour
turns it off, and the log line names the setting; bf16 storage, which cannot do without it, is
refused with such settings before any process starts.
"""

from __future__ import annotations

import torch
from torch import nn

from facetrain.config.validate import show
from facetrain.heads import HeadOptions, ShardedMarginHead, class_range, collectives
from facetrain.heads.kernel_choice import resolve_kernel
from facetrain.heads.memory import (
    STORAGE_DTYPES,
    backbone_training_bytes,
    choose_mode,
    describe,
    estimate_head_memory,
    free_memory_bytes,
)
from facetrain.heads.plan import HeadPlan
from facetrain.logger import logger
from facetrain.parallel.dims import ParallelDims
from facetrain.train.device_defaults import tile_classes
from facetrain.train.optim import build_fused_optimizer
from facetrain.train.run_checks import fused_optimizer_conflict
from facetrain.train.run_config import Config


def build_head(
    cfg: Config, num_classes: int, dims: ParallelDims, backbone: nn.Module | None = None
) -> ShardedMarginHead:
    plan, reasons = resolve_head_plan(cfg, num_classes, dims, backbone)
    settings = cfg.head
    head = ShardedMarginHead(
        num_classes,
        cfg.model.embedding_size,
        margin=settings.margin,
        scale=settings.scale,
        sample_rate=settings.sample_rate,
        group=dims.dp_group,
        plan=plan,
        options=HeadOptions(sub_centers=settings.sub_centers, label_smoothing=settings.label_smoothing),
        **settings.margin_params,
    )
    head.reset_parameters(seed=cfg.train.seed)
    if plan.fused_optimizer:
        head.fuse_optimizer(build_fused_optimizer(cfg.optim, head, plan.state_dtype))
    head = head.to(dims.device)
    if dims.is_primary:
        logger.info(describe_plan(plan, reasons, cfg, num_classes, dims))
    return head


def resolve_head_plan(
    cfg: Config, num_classes: int, dims: ParallelDims, backbone: nn.Module | None = None
) -> tuple[HeadPlan, str]:
    """The plan, and why it differs from what the config names (for the log line). head.mode auto takes
    the untiled head when it fits the tightest rank's free memory (all-reduced over the data-parallel
    group, less what `backbone` will take on CUDA: `facetrain.heads.memory`), else the tiled one."""
    settings = cfg.head
    weight_dtype, state_dtype = STORAGE_DTYPES[settings.weight_dtype], STORAGE_DTYPES[settings.state_dtype]
    mode, reasons = "untiled" if settings.sub_centers > 1 else settings.mode, []
    if mode == "auto":
        rows = class_range(num_classes, dims.dp, dims.dp_rank).count
        untiled = estimate_head_memory(
            rows, cfg.model.embedding_size, cfg.train.batch_size * dims.dp, optimizer=cfg.optim.name,
            reduced_precision_gemm=cfg.train.precision != "fp32",
        )  # fmt: skip
        mine = torch.tensor(
            [free_memory_bytes(dims.device)], device=collectives.collective_device(dims.dp_group)
        )
        free = int(collectives.all_reduce_(mine, "min", dims.dp_group))
        reserved = 0
        if dims.device.type == "cuda" and backbone is not None:
            batch_shape = (cfg.train.batch_size, 3, *cfg.data.image_size)
            reserved = backbone_training_bytes(backbone, batch_shape, cfg.optim.name, replicated=dims.dp > 1)
        needs_tiles = torch.bfloat16 in (weight_dtype, state_dtype)
        mode = choose_mode(
            "auto", untiled, free, needs_tiles, device_type=dims.device.type, reserved_bytes=reserved
        )
        kept = f", {reserved / 2**30:.1f} GiB of it kept for the backbone" if reserved else ""
        reasons.append(f"head.mode auto, {free / 2**30:.1f} GiB free{kept}")
    fused = mode == "tiled" and settings.fused_optimizer
    conflict = fused_optimizer_conflict(cfg) if fused else None
    if conflict is not None:
        key, value, _ = conflict
        reasons.append(f"no fused optimizer with {key} {show(value)}")
    tile = tile_classes(settings.tile_classes, dims.device.type)
    kernel = resolve_kernel(settings.kernel, dims.device.type) if mode == "tiled" else "torch"
    if kernel == "triton" and settings.label_smoothing:  # auto: Triton's tiles have no smoothing
        kernel = "torch"
        reasons.append("torch tiles for head.label_smoothing")
    if settings.gradient_filter and mode != "tiled":  # head.mode auto chose the exact untiled head
        reasons.append("no head.gradient_filter on the untiled head")
    gradient_filter = settings.gradient_filter if mode == "tiled" else 0.0
    plan = HeadPlan(
        mode, tile, weight_dtype, state_dtype, fused and conflict is None, settings.compile_tiles, kernel,
        gradient_filter,
    )  # fmt: skip
    return plan, "; ".join(reasons)


def describe_plan(plan: HeadPlan, reasons: str, cfg: Config, num_classes: int, dims: ParallelDims) -> str:
    """The one log line: the plan, why, and what the head holds on this rank."""
    settings = cfg.head
    classes = class_range(num_classes, dims.dp, dims.dp_rank).count
    memory = estimate_head_memory(
        classes * settings.sub_centers, cfg.model.embedding_size, cfg.train.batch_size * dims.dp, plan,
        optimizer=cfg.optim.name, reduced_precision_gemm=cfg.train.precision != "fp32",
    )  # fmt: skip
    kernel = ", triton kernel" if plan.kernel == "triton" else ""
    kernel += f", gradient filter {plan.gradient_filter:g}" if plan.gradient_filter else ""
    how = f"tiled, {plan.tile_classes:,} classes a tile{kernel}" if plan.tiled else "untiled"
    why = f" ({reasons})" if reasons else ""
    updates = f"fused {cfg.optim.name}" if plan.fused_optimizer else f"torch {cfg.optim.name}"
    state = f", state {settings.state_dtype}" if plan.fused_optimizer else ""
    centres = f" x {settings.sub_centers} sub-centers" if settings.sub_centers > 1 else ""
    return (
        f"head: {how}{why}, {updates}, weight {settings.weight_dtype}{state}; {classes:,}{centres} "
        f"of {num_classes:,} classes on this rank: {describe(memory)}"
    )
