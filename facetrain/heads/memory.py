"""What one rank's head shard costs in memory, by mode: what `facetrain train` logs, what `head.mode:
auto` decides by, and what the capacity benchmark compares its measurements with.

Per class (D = embedding size), fp32 unless noted:

| mode | weight | gradient | optimizer state (SGD momentum) | per step |
| --- | --- | --- | --- | --- |
| untiled + torch.optim | 4 D | 4 D | 4 D | B x C/N logits (4 B bytes a class) |
| tiled, gradient buffer + torch.optim | 4 D | 4 D | 4 D | O(B x T + T x D), independent of C |
| tiled + fused | 4 D | none | 4 D | O(B x T + T x D) |
| tiled + fused, bf16 weight and state | 2 D | none | 2 D | O(B x T + T x D) |

AdamW keeps two states instead of one. The tiled head also keeps one float per class between forward
and backward (the inverse weight norms), and Partial FC a float per class to sample from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

STORAGE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STATE_COUNT = {"sgd": 1, "adamw": 2}  # per-class state tensors each optimizer keeps (SGD with momentum)
# head.mode auto: untiled when its estimate fits in this fraction of the device's free memory; the rest
# is left to the backbone, its activations and the data pipeline.
AUTO_MEMORY_FRACTION = 0.5
# Tile temporaries, in fp32 copies of the named shape, at the backward's peak (measured with
# `facetrain bench head --capacity`): logits and their low-precision copy; weight rows, their
# gradient and the optimizer's working copies.
TILE_LOGIT_COPIES = 3
TILE_WEIGHT_COPIES = 6
BATCH_COPIES = 6  # gathered embeddings, their unit vectors, the embedding gradient and its pieces


@dataclass(frozen=True)
class HeadMemory:
    """Bytes one rank's head holds: what lives through training, and what a step adds at its peak."""

    weight: int
    gradient: int
    optimizer_state: int
    step: int

    @property
    def persistent(self) -> int:
        return self.weight + self.gradient + self.optimizer_state

    @property
    def total(self) -> int:
        return self.persistent + self.step


def estimate_head_memory(
    rows: int,
    dim: int,
    global_batch: int,
    mode: str,
    *,
    tile_classes: int = 8192,
    fused: bool = True,
    optimizer: str = "sgd",
    weight_dtype: torch.dtype = torch.float32,
    state_dtype: torch.dtype = torch.float32,
) -> HeadMemory:
    """The memory of a shard of `rows` classes in `mode` ("untiled" or "tiled").

    Without the fused optimizer the trainer's torch optimizer keeps its state in the weight's dtype.
    """
    weight_bytes = torch.empty((), dtype=weight_dtype).element_size()
    state_bytes = torch.empty(
        (), dtype=state_dtype if fused and mode == "tiled" else weight_dtype
    ).element_size()
    weight = rows * dim * weight_bytes
    state = STATE_COUNT[optimizer] * rows * dim * state_bytes
    batch = BATCH_COPIES * global_batch * dim * 4
    if mode == "untiled":
        return HeadMemory(weight, rows * dim * weight_bytes, state, 4 * global_batch * rows + batch)
    tile = min(tile_classes, rows)
    step = 4 * (TILE_LOGIT_COPIES * global_batch * tile + TILE_WEIGHT_COPIES * tile * dim + rows) + batch
    gradient = 0 if fused else rows * dim * weight_bytes
    return HeadMemory(weight, gradient, state, step)


def choose_mode(requested: str, untiled: HeadMemory, free_bytes: int, needs_tiles: bool) -> str:
    """`head.mode`, with auto resolved: the untiled head (the fastest) when it fits comfortably, else tiled.

    `needs_tiles`: the settings ask for what only the tiled head does (bf16 storage).
    """
    if requested != "auto":
        return requested
    if needs_tiles or untiled.total > AUTO_MEMORY_FRACTION * free_bytes:
        return "tiled"
    return "untiled"


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
    return f"{', '.join(parts)}, about {_size(memory.step)} more during a step"


def _size(value: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if value >= scale / 10:
            return f"{value / scale:.2f} {unit}"
    return f"{value / 2**10:.1f} KiB"
