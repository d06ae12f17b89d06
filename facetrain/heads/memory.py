"""What one rank's head shard costs in memory, by mode: what `facetrain train` logs, what `head.mode:
auto` decides by, and what the capacity benchmark compares its measurements with.

Per class (D = embedding size, SGD with momentum): 12 D bytes untiled (weight, gradient, momentum), 8 D
tiled with the fused optimizer (10 D + 4 with Triton's tiles under bf16 autocast, which keep a bf16 copy
of the rows), 4 D with bf16 weight and momentum; a step adds the B x C/N logits
untiled, O(B x T + T x D) tiled. `memory_parts` counts each part (docs/scaling.md has the table).

`head.mode: auto` is decided when the head is built, before the backbone has run: on a CPU from half
the system's available memory (the other half left to the backbone, its activations and the data
pipeline); on CUDA from the GPU's free memory less what the backbone will take once it trains
(`backbone_training_bytes`) and a margin (`cuda_margin`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from facetrain.heads.plan import UNTILED, HeadPlan
from facetrain.heads.row_stream import streams_rows
from facetrain.heads.scratch import ROWWISE_BLOCK

STORAGE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STATE_COUNT = {"sgd": 1, "adamw": 2}  # per-class state tensors each optimizer keeps (SGD with momentum)
# head.mode auto: untiled when its estimate fits in this fraction of the device's free memory; the rest
# is left to the backbone, its activations and the data pipeline.
AUTO_MEMORY_FRACTION = 0.5
BATCH_COPIES = 6  # B x D fp32: gathered embeddings, their unit vectors, their gradient and its pieces
FP32, LOW = 4, 2  # bytes of the statistics' dtype and of bf16 / fp16 (storage, GEMM operands)
# head.mode auto on CUDA: the GPU memory left unplanned, for what no estimate here counts: the caching
# allocator's fragmentation, cuBLAS and cuDNN workspaces (cudnn.benchmark tries algorithms that want
# large ones), NCCL's buffers and the data pipeline's pinned-memory copies in flight.
CUDA_MARGIN_FRACTION = 0.1
CUDA_MARGIN_MIN_BYTES = 2**30


@dataclass(frozen=True)
class HeadMemory:
    """Bytes one rank's head holds: what lives through training, and what a step adds at its peak."""

    weight: int
    gradient: int
    optimizer_state: int
    step: int
    row_stream: int = 0  # the Triton tiles' bf16 copy of fp32 rows under bf16 autocast (row_stream.py)

    @property
    def persistent(self) -> int:
        return self.weight + self.gradient + self.optimizer_state + self.row_stream

    @property
    def total(self) -> int:
        return self.persistent + self.step


def memory_parts(
    rows: int,
    dim: int,
    global_batch: int,
    plan: HeadPlan,
    *,
    active: int | None = None,
    optimizer_states: int = 1,
    reduced_precision_gemm: bool = False,
) -> dict[str, int]:
    """One rank's head at the peak of a step, by part, counted from what `sharded_softmax.py`,
    `tiled_softmax.py`, `scratch.py` and the fused optimizer allocate: the one model behind the training
    log, head.mode auto and the scaling model (`facetrain.bench.scaling_model`), which
    `facetrain bench scaling` checks against measured peaks.

    `rows` is the shard's weight rows, `active` those a step computes logits for (Partial FC's sample;
    the shard by default); `plan` says how the head stores and computes them. `optimizer_states` is
    the number of weight-shaped states kept (0 for none), each in the plan's state dtype; without the
    fused optimizer a torch optimizer keeps them in the weight's dtype. `reduced_precision_gemm`: bf16 or fp16 autocast, whose GEMMs read 16-bit copies of their
    operands (the logits stay fp32). Triton tiles over fp32 rows with a fused SGD (at most one state,
    fp32) under it also keep a bf16 copy of the rows and their inverse norms, 2 D + 4 bytes a class
    (`row_stream`; fp16 autocast cannot run the fused optimizer, so 16-bit here is bf16).
    """
    mode, fused, weight_bytes = plan.mode, plan.fused_optimizer, plan.weight_dtype.itemsize
    active = rows if active is None else active
    state_bytes = plan.state_dtype.itemsize if fused and mode == "tiled" else weight_bytes
    low = LOW if reduced_precision_gemm else 0
    parts = {
        "weight": rows * dim * weight_bytes,
        "optimizer_state": optimizer_states * rows * dim * state_bytes,
        "batch": BATCH_COPIES * global_batch * dim * FP32,
    }
    if mode == "untiled":
        parts["gradient"] = rows * dim * weight_bytes
        # exp(logits) kept from forward to backward, and the 16-bit copy the backward's GEMMs read
        parts["logits"] = global_batch * active * (FP32 + low)
        # the 16-bit copy of the class rows for a GEMM, or (not at the same time) rowwise_dot's block
        parts["rows_scratch"] = max(rows * dim * low, min(ROWWISE_BLOCK, rows) * dim * FP32)
        return parts
    tile = min(plan.tile_classes, active)
    parts["gradient"] = 0 if fused else rows * dim * weight_bytes
    sgd_state = optimizer_states == 0 or (
        optimizer_states == 1 and state_bytes == FP32
    )  # FusedSGD's single pass
    if reduced_precision_gemm and streams_rows(plan) and sgd_state:
        parts["row_stream"] = rows * (dim * LOW + FP32)
    # two fp32 B x T buffers (measured: the tile's logits, turned into its gradient in place, and a
    # temporary of the passes over them) and the 16-bit copy of the gradient
    parts["logits"] = global_batch * tile * (2 * FP32 + low)
    # per tile row: its weight gradient and rowwise_dot's product; with 16-bit storage the fp32 working
    # copy of the rows, one of each 16-bit state the fused optimizer updates, and stochastic rounding's
    # noise and result when they are written back; the 16-bit GEMM operand
    per_row = 2 * FP32 + low
    if weight_bytes < FP32:
        per_row += FP32
    if fused:
        low_states = optimizer_states if state_bytes < FP32 else 0
        per_row += low_states * FP32 + (FP32 + LOW if low_states or weight_bytes < FP32 else 0)
    parts["rows_scratch"] = tile * dim * per_row + rows * FP32  # and the inverse norms, one a class
    return parts


def estimate_head_memory(
    rows: int,
    dim: int,
    global_batch: int,
    plan: HeadPlan = UNTILED,
    *,
    optimizer: str = "sgd",
    reduced_precision_gemm: bool = False,
) -> HeadMemory:
    """The memory of a shard of `rows` classes under `plan`, by `memory_parts`."""
    parts = memory_parts(
        rows, dim, global_batch, plan, optimizer_states=STATE_COUNT[optimizer],
        reduced_precision_gemm=reduced_precision_gemm,
    )  # fmt: skip
    step = parts["logits"] + parts["rows_scratch"] + parts["batch"]
    return HeadMemory(
        parts["weight"], parts["gradient"], parts["optimizer_state"], step, parts.get("row_stream", 0)
    )


def choose_mode(
    requested: str,
    untiled: HeadMemory,
    free_bytes: int,
    needs_tiles: bool,
    *,
    device_type: str = "cpu",
    reserved_bytes: int = 0,
) -> str:
    """`head.mode`, with auto resolved: the untiled head (the fastest) when it fits comfortably, else tiled.

    `needs_tiles`: the settings ask for what only the tiled head does (bf16 storage). `free_bytes` is
    the device's free memory (the tightest rank's). On CUDA it is exact and what else will claim it
    (`reserved_bytes`, `backbone_training_bytes`) is estimated, so the head may have all of the rest but
    `cuda_margin`. A CPU's available memory is shared with the data workers and the page cache and moves
    while the run starts, so there the head takes at most half of it.
    """
    if requested != "auto":
        return requested
    if device_type == "cuda":
        budget = free_bytes - reserved_bytes - cuda_margin(free_bytes)
    else:
        budget = AUTO_MEMORY_FRACTION * free_bytes
    return "tiled" if needs_tiles or untiled.total > budget else "untiled"


def cuda_margin(free_bytes: int) -> float:
    """GPU memory head.mode auto leaves unplanned: 10 % of what is free, and at least 1 GiB."""
    return max(CUDA_MARGIN_FRACTION * free_bytes, CUDA_MARGIN_MIN_BYTES)


def backbone_training_bytes(
    backbone: nn.Module, batch_shape: Sequence[int], optimizer: str = "sgd", replicated: bool = False
) -> int:
    """What training the backbone will add on its device beyond its weights, which are already there
    when the head is built: a gradient and the optimizer's state per parameter, DDP's gradient buckets
    (another gradient's worth) when `replicated`, and the activations autograd keeps for the backward
    of one batch of `batch_shape`.

    The activations are the tensors a training forward saves, found by running it on the meta device
    (no memory, no arithmetic; weights, running statistics and random streams untouched), each counted
    once. They are counted in fp32, an upper bound under bf16 or fp16 autocast.
    """
    parameter_bytes = sum(p.numel() * 4 for p in backbone.parameters() if p.requires_grad)
    copies = 1 + STATE_COUNT[optimizer] + (1 if replicated else 0)
    return copies * parameter_bytes + _saved_activation_bytes(backbone, batch_shape)


def _saved_activation_bytes(backbone: nn.Module, batch_shape: Sequence[int]) -> int:
    on_meta = {
        name: torch.empty_like(tensor, device="meta").requires_grad_(tensor.requires_grad)
        for name, tensor in itertools.chain(backbone.named_parameters(), backbone.named_buffers())
    }
    parameters = {id(tensor) for tensor in on_meta.values()}
    saved: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor if tensor._base is None else tensor._base
        if id(base) not in parameters:
            saved[id(base)] = base
        return tensor

    training = backbone.training
    backbone.train()
    try:
        with (
            torch.random.fork_rng(devices=[]),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            _eagerly(),
        ):
            functional_call(backbone, on_meta, (torch.empty(tuple(batch_shape), device="meta"),))
    finally:
        backbone.train(training)
    return sum(tensor.numel() * 4 for tensor in saved.values())


def _eagerly():
    """A compiled backbone (model.compile) runs eagerly: inductor cannot compile a meta-device forward.
    torch before 2.6 has no stances; there the backbone is measured as it is."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def free_memory_bytes(device: torch.device) -> int:
    """Memory a new allocation can use now: the GPU's free memory, or the system's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in open("/proc/meminfo").read().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def describe(memory: HeadMemory) -> str:
    """`memory` in words for the training log."""
    parts = [f"weight {_size(memory.weight)}"]
    if memory.gradient:
        parts.append(f"gradient {_size(memory.gradient)}")
    if memory.optimizer_state:
        parts.append(f"optimizer state {_size(memory.optimizer_state)}")
    if memory.row_stream:
        parts.append(f"bf16 row copy {_size(memory.row_stream)}")
    return f"{', '.join(parts)}, about {_size(memory.step)} more during a step"


def _size(value: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if value >= scale / 10:
            return f"{value / scale:.2f} {unit}"
    return f"{value / 2**10:.1f} KiB"
